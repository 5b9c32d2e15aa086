"""Signing an approved CertificateSigningRequest with our CA: what goes into the certificate, pure
(no API; the CA comes in as objects, the certificate goes out as PEM).

- lifetime: ``min(expirationSeconds if asked, --max-cert-lifetime)`` from now, and never beyond
  the CA's own not_after; valid from a few minutes back (clock skew, as every signer does), but
  by at most a tenth of the lifetime: requesters rotate at 70-90 % of ``not_after -
  not_before``, so a 5-minute backdate on a 60 s certificate would make it due on arrival
  and its holder would re-request in a loop;
- agent (:data:`~ravenproxy.pki.issuance.SIGNER_AGENT`): clientAuth, exactly one DNS SAN, the
  node name (what :func:`~ravenproxy.pki.authority.cert_node_name` accepts);
- server (:data:`~ravenproxy.pki.issuance.SIGNER_SERVER`): serverAuth, the CSR's SANs (the
  approval already checked them against ``server_names``);
- key usage digitalSignature (plus keyEncipherment if an RSA key asked for it), SKI/AKI and a
  random serial, as ``certs init`` does (:func:`~ravenproxy.pki.authority.sign_leaf`).
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from ravenproxy.controller.approval import parse_request
from ravenproxy.controller.settings import DEFAULT_MAX_LIFETIME as DEFAULT_MAX_LIFETIME
from ravenproxy.errors import PKIError
from ravenproxy.pki.authority import CLOCK_SKEW, sign_leaf
from ravenproxy.pki.issuance import SIGNER_AGENT, SIGNER_SERVER
from ravenproxy.pki.pemfiles import cert_pem

EKU: Final = {
    SIGNER_AGENT: ExtendedKeyUsageOID.CLIENT_AUTH,
    SIGNER_SERVER: ExtendedKeyUsageOID.SERVER_AUTH,
}


def lifetime(
    expiration_seconds: int | None,
    max_lifetime: dt.timedelta,
) -> dt.timedelta:
    """How long a certificate lives: what was asked for, capped at ``max_lifetime``."""
    if expiration_seconds is None or expiration_seconds <= 0:
        return max_lifetime
    return min(dt.timedelta(seconds=expiration_seconds), max_lifetime)


def backdate(life: dt.timedelta) -> dt.timedelta:
    """How far before now a certificate of lifetime ``life`` starts: the clock-skew allowance,
    but at most a tenth of the lifetime (see the module docstring)."""
    return min(CLOCK_SKEW, life / 10)


def sign(
    obj: Mapping[str, Any],
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    max_lifetime: dt.timedelta = DEFAULT_MAX_LIFETIME,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """The certificate for the (approved) CSR ``obj``, its API JSON. Raises PKIError when the
    request is not one we can sign (the caller marks the CSR Failed with the reason)."""
    spec = obj.get("spec") or {}
    signer = spec.get("signerName")
    if signer not in EKU:
        raise PKIError(f"signer {signer!r} is not ours")
    request = parse_request(spec)
    public_key = request.csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise PKIError(f"{type(public_key).__name__} keys are not accepted")
    sans: list[x509.GeneralName]
    if signer == SIGNER_AGENT:
        sans = [x509.DNSName(request.node)]
    else:
        sans = [x509.DNSName(n) for n in request.dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in request.ip_addresses]
        if not sans:
            raise PKIError("a server certificate needs at least one SAN")
    start = now or dt.datetime.now(dt.UTC)
    exp = spec.get("expirationSeconds")
    life = lifetime(exp if isinstance(exp, int) else None, max_lifetime)
    encipher = isinstance(public_key, rsa.RSAPublicKey) and "key encipherment" in (
        spec.get("usages") or []
    )
    return sign_leaf(
        ca_cert,
        ca_key,
        public_key,
        request.node,
        sans,
        [EKU[signer]],
        key_encipherment=encipher,
        not_before=start - backdate(life),
        not_after=start + life,
    )


def certificate_field(cert: x509.Certificate) -> str:
    """``status.certificate``: base64 of the PEM (the API's []byte encoding)."""
    return base64.b64encode(cert_pem(cert)).decode()
