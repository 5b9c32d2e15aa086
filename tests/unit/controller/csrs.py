"""Certificate signing requests as the API returns them, for the approval and signing tests."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ravenproxy.pki.issuance import NODE_NAME_EXTRA, SIGNER_AGENT

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def request(
    cn: str | None,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    key: PrivateKey | None = None,
    organization: str | None = None,
    uri: str | None = None,
) -> str:
    """``spec.request``: base64 of a PEM CSR (``cn`` None: an empty subject)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn is not None else []
    if organization is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    if uri is not None:
        sans.append(x509.UniformResourceIdentifier(uri))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    pem = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    return base64.b64encode(pem).decode()


def sa_of(node: str, account: str = "ravenproxy-agent") -> dict[str, Any]:
    """The spec fields kube-apiserver fills for a bound token of a pod on ``node``."""
    return {
        "username": f"system:serviceaccount:kube-system:{account}",
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": {NODE_NAME_EXTRA: [node]},
    }


def csr(
    req: str,
    *,
    signer: str = SIGNER_AGENT,
    usages: Sequence[str] = ("digital signature", "client auth"),
    requester: dict[str, Any] | None = None,
    expiration: int | None = None,
    conditions: Sequence[str] = (),
    name: str = "csr-1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "request": req,
        "signerName": signer,
        "usages": list(usages),
        **(requester if requester is not None else sa_of("edge-1")),
    }
    if expiration is not None:
        spec["expirationSeconds"] = expiration
    status = {"conditions": [{"type": c, "status": "True"} for c in conditions]}
    return {
        "metadata": {"name": name, "resourceVersion": "7", "uid": "uid-7"},
        "spec": spec,
        "status": status if conditions else {},
    }
