"""Whether the controller approves a CertificateSigningRequest: the issuance rule, pure.

A CSR of one of our signers (:data:`~ravenproxy.pki.issuance.SIGNERS`) is approved only when
all of these hold; the first that fails is the one-line reason of the denial:

- the request parses, its signature verifies, its subject is exactly ``CN=<node>`` (nothing
  else) with a valid node name, and its key is ECDSA P-256 or RSA of at least 2048 bits;
- the requester is bound to that node: a service-account token whose
  ``authentication.kubernetes.io/node-name`` extra is exactly ``[<node>]`` (a bound token of a
  pod on that node, filled in by kube-apiserver, never by the requester), or the node's own
  ``system:node:<node>`` identity;
- the node exists in the model;
- the usages are those of the signer (:data:`USAGES`; ``key encipherment`` is tolerated);
- agent certificates: no SAN, or only the DNS name of the node (the signed certificate always
  carries exactly that one, as ``certs init`` makes them);
- server certificates: the node is a cloud gateway node (``is_cloud_gateway_node``), and every
  SAN is one of ``server_names(model, node, ...)`` (its addresses, its gateway's public IPs, the
  internal Service's ClusterIP and DNS names, ``--server-san``).

Anything else of another signer is :class:`Ignore` d — never touched, not even looked at twice —
and so is a CSR that already carries an Approved, Denied or Failed condition.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from ravenproxy.errors import PKIError
from ravenproxy.model.server_names import is_cloud_gateway_node, server_names
from ravenproxy.model.snapshot import Model
from ravenproxy.pki.authority import validate_node_name
from ravenproxy.pki.issuance import (
    NODE_NAME_EXTRA,
    NODE_USER_PREFIX,
    SIGNER_AGENT,
    SIGNER_OF_ROLE,
)
from ravenproxy.pki.issuance import USAGES as ROLE_USAGES

# What each signer's CSR must ask for (spec.usages): what its requesters ask for, from the one
# table of both ends; TOLERATED may be asked for in addition.
USAGES: Final[dict[str, frozenset[str]]] = {
    SIGNER_OF_ROLE[role]: frozenset(usages) for role, usages in ROLE_USAGES.items()
}
TOLERATED: Final = frozenset({"key encipherment"})
MIN_RSA_BITS: Final = 2048
SERVICE_ACCOUNT_PREFIX: Final = "system:serviceaccount:"
FINAL_CONDITIONS: Final = frozenset({"Approved", "Denied", "Failed"})


@dataclass(frozen=True)
class Approve:
    node: str
    signer: str


@dataclass(frozen=True)
class Deny:
    reason: str
    node: str = ""


@dataclass(frozen=True)
class Ignore:
    why: str


Decision = Approve | Deny | Ignore


@dataclass(frozen=True)
class Request:
    """What the signer takes from a well-formed CSR (see :func:`parse_request`)."""

    csr: x509.CertificateSigningRequest
    node: str
    dns_names: tuple[str, ...]
    ip_addresses: tuple[str, ...]


def conditions(obj: Mapping[str, Any]) -> set[str]:
    """The types of the CSR's conditions whose status is True."""
    status = obj.get("status") or {}
    return {
        str(c.get("type"))
        for c in status.get("conditions") or []
        if isinstance(c, Mapping) and c.get("status", "True") == "True"
    }


def parse_request(spec: Mapping[str, Any]) -> Request:
    """The CSR in ``spec.request``, checked for what every certificate of ours needs: a valid
    signature, subject exactly ``CN=<node name>``, an ECDSA P-256 or RSA >= 2048 key, and SANs
    only of DNS and IP type. Raises PKIError with a one-line reason."""
    raw = spec.get("request")
    if not isinstance(raw, str) or not raw:
        raise PKIError("spec.request is empty")
    try:
        csr = x509.load_pem_x509_csr(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise PKIError(f"spec.request is not a PEM certificate request: {exc}") from exc
    if not csr.is_signature_valid:
        raise PKIError("the request's signature does not verify")
    attrs = list(csr.subject)
    if len(attrs) != 1 or attrs[0].oid != NameOID.COMMON_NAME:
        raise PKIError(
            f"subject must be exactly CN=<node name>, is {csr.subject.rfc4514_string()!r}"
        )
    node = attrs[0].value
    if not isinstance(node, str):
        raise PKIError("subject CN is not a string")
    validate_node_name(node)
    key = csr.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise PKIError(f"ECDSA key on {key.curve.name}, only P-256 (secp256r1) is accepted")
    elif isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise PKIError(f"RSA key of {key.key_size} bits, at least {MIN_RSA_BITS} needed")
    else:
        raise PKIError(f"{type(key).__name__} keys are not accepted (ECDSA P-256 or RSA)")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return Request(csr, node, (), ())
    dns = tuple(str(n).lower() for n in san.get_values_for_type(x509.DNSName))
    ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    if len(dns) + len(ips) != len(list(san)):
        raise PKIError("only DNS and IP subject alternative names are accepted")
    return Request(csr, node, dns, ips)


def _requester_node(spec: Mapping[str, Any]) -> tuple[str, str | None]:
    """(the requester's username, the node it is bound to, None when bound to none)."""
    username = str(spec.get("username") or "")
    if username.startswith(NODE_USER_PREFIX):
        return username, username.removeprefix(NODE_USER_PREFIX)
    extra = spec.get("extra") or {}
    bound = extra.get(NODE_NAME_EXTRA) if isinstance(extra, Mapping) else None
    if username.startswith(SERVICE_ACCOUNT_PREFIX) and isinstance(bound, list):
        if len(bound) == 1 and isinstance(bound[0], str):
            return username, bound[0]
    return username, None


def _usage_problem(signer: str, usages: Iterable[Any]) -> str | None:
    asked = {str(u) for u in usages}
    need = USAGES[signer]
    if not need <= asked or not asked <= need | TOLERATED:
        return (
            f"usages {sorted(asked)} are not those of {signer}: "
            f"{sorted(need)} (with {sorted(TOLERATED)} tolerated)"
        )
    return None


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def decide(
    obj: Mapping[str, Any],
    model: Model,
    *,
    service_ip: str | None = None,
    extra_sans: Sequence[str] = (),
    cluster_domain: str = "cluster.local",
) -> Decision:
    """Approve, Deny (with the reason) or Ignore the CSR ``obj`` (its API JSON), given the
    cluster's model, the internal Service's ClusterIP and the ``--server-san`` values."""
    spec = obj.get("spec") or {}
    signer = spec.get("signerName")
    if signer not in USAGES:
        return Ignore(f"signer {signer!r} is not ours")
    done = conditions(obj) & FINAL_CONDITIONS
    if done:
        return Ignore(f"already {', '.join(sorted(done))}")
    try:
        request = parse_request(spec)
    except PKIError as exc:
        return Deny(str(exc))
    node = request.node
    username, bound = _requester_node(spec)
    if bound is None:
        return Deny(
            f"requester {username or '(none)'} is bound to no node (neither {NODE_USER_PREFIX}"
            f"<node> nor a service account token with {NODE_NAME_EXTRA})",
            node,
        )
    if bound != node:
        return Deny(f"requester {username} is bound to node {bound}, not {node}", node)
    known = model.node(node)
    if known is None:
        return Deny(f"node {node} does not exist", node)
    problem = _usage_problem(str(signer), spec.get("usages") or [])
    if problem:
        return Deny(problem, node)
    if signer == SIGNER_AGENT:
        if request.ip_addresses or any(n != node for n in request.dns_names):
            sans = [*request.dns_names, *request.ip_addresses]
            return Deny(
                f"an agent certificate carries no SAN but its node name {node}, asked {sans}",
                node,
            )
        return Approve(node, str(signer))
    if not is_cloud_gateway_node(known):
        return Deny(f"node {node} is not a cloud gateway node: no server certificate", node)
    if not request.dns_names and not request.ip_addresses:
        return Deny("a server certificate needs at least one SAN", node)
    allowed = server_names(
        model, node, service_ip=service_ip, cluster_domain=cluster_domain, extra=extra_sans
    )
    allowed_dns = {a.lower() for a in allowed}
    for name in request.dns_names:
        if name not in allowed_dns:
            return Deny(f"SAN {name} is not a name of the server on {node}", node)
    for ip in request.ip_addresses:
        if not any(_same_ip(ip, a) for a in allowed):
            return Deny(f"SAN {ip} is not an address of the server on {node}", node)
    return Approve(node, str(signer))
