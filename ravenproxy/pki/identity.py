"""Who a certificate speaks for: the node-name rule (Kubernetes' node names) and the one place
that turns an agent's client certificate into the node it serves — the server's rule on the
peer's certificate, and the agent's on its own, so it never runs as another node than the one
the server will register it as. Read with :mod:`ravenproxy.pki.x509info` (no ``cryptography``:
an agent and a server apply it without loading it). Also the ``--server-san`` rule, which the
settings of server and controller check without loading ``cryptography`` either."""

from __future__ import annotations

import ipaddress
import re

from ravenproxy.errors import PKIError
from ravenproxy.pki.x509info import CLIENT_AUTH, CertInfo, cert_from_der

# Kubernetes' IsDNS1123Subdomain: node names must match this, and so must ours, or the certificate
# would name a node that can never exist.
_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*")
DNS1123_MAX = 253
# Server SANs may use upper case and a leading wildcard label, as any DNS name in a certificate.
_SAN_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?"
_SAN_DNS = re.compile(rf"(\*\.)?{_SAN_LABEL}(\.{_SAN_LABEL})*")


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a valid Kubernetes node name (RFC 1123 subdomain), else raise."""
    if not isinstance(name, str) or not name:
        raise PKIError(f"invalid node name {name!r}: must be a non-empty RFC 1123 subdomain")
    if len(name) > DNS1123_MAX:
        raise PKIError(f"invalid node name {name!r}: longer than {DNS1123_MAX} characters")
    if not _DNS1123_SUBDOMAIN.fullmatch(name):
        raise PKIError(
            f"invalid node name {name!r}: must be an RFC 1123 subdomain "
            "(lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)"
        )
    return name


def server_san(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | str:
    """One ``--server-san`` value: an IP address, else a DNS name (lower-cased), else raise."""
    text = value.strip()
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if len(text) > DNS1123_MAX or not _SAN_DNS.fullmatch(text):
        raise PKIError(f"invalid server SAN {value!r}: neither an IP address nor a DNS name")
    return text.lower()


def node_name_from_cert(der: bytes) -> str:
    """The node an agent's (already chain-verified) DER client certificate speaks for (a
    peer's, on a verified connection: :func:`node_of` its :func:`~.x509info.peer_cert`, cheaper)."""
    try:
        cert = cert_from_der(der)
    except ValueError as exc:
        raise PKIError(f"peer certificate is not valid DER: {exc}") from exc
    return node_of(cert)


def node_of(cert: CertInfo, what: str = "peer certificate") -> str:
    """The node an agent's client certificate speaks for; ``what`` names the certificate in
    errors.

    Strict on purpose: exactly one CN, every DNS SAN equal to it, clientAuth usage, and a valid
    node name — an ambiguous certificate must not be mapped to some node by guesswork.
    """
    cns = cert.common_names
    if len(cns) != 1:
        raise PKIError(f"{what} must have exactly one CN, has {len(cns)}")
    cn = cns[0]
    try:
        validate_node_name(cn)
    except PKIError as exc:
        raise PKIError(f"{what} CN is not a node name: {exc}") from exc
    mismatched = [n for n in cert.dns_names if n != cn]
    if mismatched:
        raise PKIError(f"{what} CN {cn!r} does not match its DNS SANs {list(cert.dns_names)!r}")
    if cert.extended_key_usage is None:
        raise PKIError(f"{what} for {cn!r} has no extended key usage")
    if CLIENT_AUTH not in cert.extended_key_usage:
        raise PKIError(f"{what} for {cn!r} is not a client certificate (no clientAuth)")
    return cn
