"""The requester's side of a certificate signing request, pure: a fresh key, the CSR that asks
for a certificate for it, when to ask again, and whether what came back may be used.

Used by :mod:`ravenproxy.kube.certificates` (the agent and the server with ``--cert-dir``); the
names both ends of Kubernetes issuance share are in :mod:`ravenproxy.pki.issuance`.

- The subject is exactly ``CN=<node>``: no organisation, so a certificate of ours can never pass
  for a member of a Kubernetes group (``O=system:masters``) should the CA ever be trusted there.
- An agent asks for no SAN (its identity is the CN; the signer adds what it adds); a server
  asks for its names (:func:`ravenproxy.model.server_names.server_names`).
- Rotation starts at a jittered 70-90 % of the lifetime, as the kubelet's certificate manager
  does: late enough not to churn, early enough to survive an API outage of a fifth of the
  lifetime, and spread so that a fleet issued together does not come back together.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Sequence
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ravenproxy.errors import PKIError
from ravenproxy.pki.authority import (
    absent_sans,
    cert_node_name,
    key_matches,
    parse_san,
    validate_node_name,
)
from ravenproxy.pki.issuance import Role

# certificates.k8s.io/v1 key usages per role. ECDSA keys only sign (ECDHE key exchange), so no
# "key encipherment" (the kubelet asks for it only with RSA keys).
USAGES: Final[dict[str, tuple[str, ...]]] = {
    "agent": ("digital signature", "client auth"),
    "server": ("digital signature", "server auth"),
}

ROTATE_FROM: Final = 0.7
ROTATE_TO: Final = 0.9


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


def missing_sans(cert: x509.Certificate, sans: Sequence[str]) -> list[str]:
    """Those of ``sans`` (names and IPs, as :func:`build_csr` takes them) that ``cert`` does
    not carry: a server whose node gained an address needs a new certificate before its
    rotation point (client-go's certificate manager checks its template the same way). An
    address the certificate has and the node lost is not a reason: it is dropped at the next
    rotation, and a model that is still loading never makes a certificate poorer."""
    return absent_sans(cert, [parse_san(s) for s in sans])


def rotation_deadline(
    not_before: dt.datetime, not_after: dt.datetime, rng: Callable[[], float] = random.random
) -> dt.datetime:
    """When to ask for the next certificate: ``not_before + uniform(0.7, 0.9) * lifetime``
    (``rng`` returns [0, 1); tests pass their own)."""
    lifetime = not_after - not_before
    share = ROTATE_FROM + (ROTATE_TO - ROTATE_FROM) * rng()
    return not_before + lifetime * share


def validity(cert: x509.Certificate) -> tuple[dt.datetime, dt.datetime]:
    """``(not_before, not_after)`` of ``cert``, timezone-aware UTC."""
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def check_issued(
    pem: bytes, key: ec.EllipticCurvePrivateKey, node: str, role: Role
) -> list[x509.Certificate]:
    """The certificate chain a signer returned (leaf first), after checking that the leaf
    certifies ``key``, names exactly ``CN=<node>`` and is usable for ``role``; else PKIError
    saying what is wrong. A certificate that fails here is never written: using it would only
    fail later, at a handshake."""
    try:
        chain = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise PKIError(f"issued certificate is not PEM: {exc}") from exc
    if not chain:
        raise PKIError("issued certificate: no certificate in it")
    cert = chain[0]
    if not key_matches(cert, key):
        raise PKIError("issued certificate is for another key than the one requested")
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(cns) != 1 or cns[0].value != node or len(cert.subject) != 1:
        raise PKIError(
            f"issued certificate subject {cert.subject.rfc4514_string()!r} is not CN={node}"
        )
    if role == "agent":
        # The server's rule on an agent certificate (clientAuth, DNS SANs equal to the CN):
        # a certificate the server would refuse is refused here, before it replaces one it
        # accepts.
        cert_node_name(cert, "issued certificate")
        return chain
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        eku = None
    if eku is not None and ExtendedKeyUsageOID.SERVER_AUTH not in eku:
        raise PKIError("issued certificate cannot be used as a server certificate (no serverAuth)")
    return chain
