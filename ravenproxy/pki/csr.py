"""The requester's certificate signing request: a fresh key and the PKCS#10 request that asks
for a certificate for it. ``cryptography`` does this, so this module is imported only when a
request is to be made (no usable certificate, rotation due, names added): a requester holding a
good certificate checks it with :mod:`ravenproxy.pki.issued` (:mod:`ssl` only, issue 15), and
the long-running processes run it in a child (:mod:`ravenproxy.pki.csrprocess`).

Used by :mod:`ravenproxy.kube.certificates` (the agent and the server with ``--cert-dir``); the
names both ends of Kubernetes issuance share (usages, signers) are in
:mod:`ravenproxy.pki.issuance`.

- The subject is exactly ``CN=<node>``: no organisation, so a certificate of ours can never pass
  for a member of a Kubernetes group (``O=system:masters``) should the CA ever be trusted there.
- An agent asks for no SAN (its identity is the CN; the signer adds what it adds); a server
  asks for its names (:func:`ravenproxy.model.server_names.server_names`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ravenproxy.errors import PKIError
from ravenproxy.pki.authority import parse_san
from ravenproxy.pki.csrprocess import Request
from ravenproxy.pki.identity import validate_node_name
from ravenproxy.pki.pemfiles import key_pem


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 key: one per request, never reused across rotations."""
    return ec.generate_private_key(ec.SECP256R1())


def build_csr(key: ec.EllipticCurvePrivateKey, node: str, sans: Sequence[str] = ()) -> bytes:
    """A PEM PKCS#10 request for ``key``, subject exactly ``CN=<node>``, with ``sans`` (names
    and IPs, as ``--server-san`` takes them) when there are any."""
    validate_node_name(node)
    if isinstance(sans, str):
        raise PKIError(f"SANs must be a sequence of names, not the string {sans!r}")
    names: list[x509.GeneralName] = []
    for san in sans:
        parsed = parse_san(san)
        if parsed not in names:
            names.append(parsed)
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)])
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    csr = builder.sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def new_request(node: str, sans: Sequence[str] = ()) -> Request:
    """A fresh key (:func:`new_key`) and its CSR (:func:`build_csr`); PKIError for a bad node
    name or SAN."""
    key = new_key()
    return Request(key_pem(key), build_csr(key, node, sans))


def main(argv: Sequence[str]) -> int:
    """``python -m ravenproxy.pki.csr NODE [SAN...]``: :func:`new_request`, the key then the
    CSR (PEM) on stdout; a bad node name or SAN on stderr, exit status 2. Run by
    :mod:`ravenproxy.pki.csrprocess`, so that ``cryptography`` lives in a short-lived child."""
    if not argv:
        print("usage: python -m ravenproxy.pki.csr NODE [SAN...]", file=sys.stderr)
        return 2
    try:
        request = new_request(argv[0], argv[1:])
    except PKIError as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.stdout.buffer.write(request.key_pem + request.csr_pem)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
