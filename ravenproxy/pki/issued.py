"""The requester's certificate, pure and with :mod:`ssl` alone: whether what a signer returned
(or what the directory holds after a restart) may be used, when to ask again, and which of the
names a server should have it lacks.

One code path for both moments: the certificate just issued and the one found at start are
checked by :func:`check_issued`, so a restart never keeps what a request would refuse. Nothing
here imports ``cryptography`` (:mod:`ravenproxy.pki.x509info`): a requester holding a good
certificate checks it without loading it (issue 15); keys and CSRs are
:mod:`ravenproxy.pki.csr`.

Rotation starts at a jittered 70-90 % of the lifetime, as the kubelet's certificate manager
does: late enough not to churn, early enough to survive an API outage of a fifth of the
lifetime, and spread so that a fleet issued together does not come back together.
"""

from __future__ import annotations

import datetime as dt
import random
import ssl
from collections.abc import Callable, Sequence
from typing import Final

from ravenproxy.errors import PKIError
from ravenproxy.pki.identity import node_of, server_san
from ravenproxy.pki.issuance import Role
from ravenproxy.pki.x509info import (
    SERVER_AUTH,
    CertInfo,
    KeyPairError,
    certs_from_pem,
    load_pair,
    private_file,
)

ROTATE_FROM: Final = 0.7
ROTATE_TO: Final = 0.9


def rotation_deadline(
    not_before: dt.datetime, not_after: dt.datetime, rng: Callable[[], float] = random.random
) -> dt.datetime:
    """When to ask for the next certificate: ``not_before + uniform(0.7, 0.9) * lifetime``
    (``rng`` returns [0, 1); tests pass their own)."""
    lifetime = not_after - not_before
    share = ROTATE_FROM + (ROTATE_TO - ROTATE_FROM) * rng()
    return not_before + lifetime * share


def check_issued(pem: bytes, key_pem: bytes, node: str, role: Role) -> tuple[CertInfo, ...]:
    """The certificate chain (leaf first), after checking that the leaf certifies the key in
    ``key_pem``, names exactly ``CN=<node>`` and is usable for ``role``; else PKIError saying
    what is wrong. A certificate that fails here is never written (nor kept at start): using it
    would only fail later, at a handshake."""
    try:
        chain = certs_from_pem(pem)
    except ValueError as exc:
        raise PKIError(f"issued certificate is not PEM: {exc}") from exc
    if not chain:
        raise PKIError("issued certificate: no certificate in it")
    cert = chain[0]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    with private_file(pem) as cert_path, private_file(key_pem) as key_path:
        try:
            load_pair(ctx, cert_path, key_path)
        except KeyPairError as exc:
            if exc.mismatch:
                raise PKIError(
                    "issued certificate is for another key than the one requested"
                ) from None
            raise PKIError(f"key: {exc.reason}") from None
    if cert.common_names != (node,) or cert.subject != f"CN={node}":
        raise PKIError(f"issued certificate subject {cert.subject!r} is not CN={node}")
    if role == "agent":
        # The server's rule on an agent certificate (clientAuth, DNS SANs equal to the CN):
        # a certificate the server would refuse is refused here, before it replaces one it
        # accepts.
        node_of(cert, "issued certificate")
        return chain
    eku = cert.extended_key_usage
    if eku is not None and SERVER_AUTH not in eku:
        raise PKIError("issued certificate cannot be used as a server certificate (no serverAuth)")
    return chain


def trust_problem(pem: bytes, key_pem: bytes, ca_pem: bytes, role: Role) -> str:
    """Why a peer trusting the CAs in ``ca_pem`` would refuse this certificate ("" if it
    would not): the verification a real handshake makes (chain, validity, purpose), made by a
    handshake between two TLS objects in memory — a server verifying an agent's client
    certificate, an agent verifying a server's. A certificate from a CA the bundle no longer
    holds (the old CA dropped before every node renewed) is refused by every peer: the
    requester asks for a new one at once rather than at its rotation point."""
    presenter = ssl.SSLContext(
        ssl.PROTOCOL_TLS_SERVER if role == "server" else ssl.PROTOCOL_TLS_CLIENT
    )
    presenter.check_hostname = False
    presenter.verify_mode = ssl.CERT_NONE
    verifier = ssl.SSLContext(
        ssl.PROTOCOL_TLS_CLIENT if role == "server" else ssl.PROTOCOL_TLS_SERVER
    )
    verifier.check_hostname = False
    verifier.verify_mode = ssl.CERT_REQUIRED
    with private_file(pem) as cert_path, private_file(key_pem) as key_path:
        load_pair(presenter, cert_path, key_path)
        if role != "server":
            load_pair(verifier, cert_path, key_path)  # a TLS server needs one; never checked
    try:
        verifier.load_verify_locations(cadata=ca_pem.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        return f"CA bundle not usable: {exc}"
    if role == "server":
        client, server = verifier, presenter
    else:
        client, server = presenter, verifier
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    ends = (
        (client.wrap_bio(c_in, c_out, server_side=False), client is verifier),
        (server.wrap_bio(s_in, s_out, server_side=True), server is verifier),
    )
    done = [False, False]
    for _ in range(8):  # TLS 1.3 with a client certificate: three flights
        for i, (end, verifies) in enumerate(ends):
            if done[i]:
                continue
            try:
                end.do_handshake()
                done[i] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as exc:
                return str(exc.verify_message or exc.reason or exc)
            except ssl.SSLError as exc:
                if verifies:
                    return str(exc.reason or exc)
                done[i] = True  # the presenter hears the verifier's alert: its error says why
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done):
            # TLS 1.3: the server verifies the client's certificate on reading its last flight.
            try:
                ends[1][0].read(1)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as exc:
                return str(exc.verify_message or exc.reason or exc)
            except ssl.SSLError as exc:
                return str(exc.reason or exc)
            return ""
    return "TLS handshake in memory did not complete"


def missing_sans(cert: CertInfo, sans: Sequence[str]) -> list[str]:
    """Those of ``sans`` (names and IPs, as ``--server-san`` takes them) that ``cert`` does not
    carry, as text; DNS names compare case-insensitively. A server whose node gained an address
    needs a new certificate before its rotation point (client-go's certificate manager checks
    its template the same way). An address the certificate has and the node lost is not a
    reason: it is dropped at the next rotation, and a model that is still loading never makes a
    certificate poorer."""
    have_dns = {n.lower() for n in cert.dns_names}
    have_ip = set(cert.ip_addresses)
    missing: list[str] = []
    for value in sans:
        san = server_san(value)
        if isinstance(san, str):
            if san not in have_dns:
                missing.append(san)
        elif san not in have_ip:
            missing.append(str(san))
    return missing
