"""The embedded certificate authority: one CA, server certificates, per-node client certificates.

ECDSA P-256 with SHA-256 throughout: small keys, fast handshakes, and accepted by every TLS 1.3
stack we talk to (OpenSSL, Go's crypto/tls in kube-apiserver and kubelets).

The agent's identity is the node name in its client certificate (see ARCHITECTURE.md, "Identity
and authorization"); :mod:`ravenproxy.pki.identity` is the one place that turns a certificate
into that name (re-exported here).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ravenproxy.errors import PKIError
from ravenproxy.pki.identity import (
    node_name_from_cert as node_name_from_cert,
)
from ravenproxy.pki.identity import (
    node_of,
    server_san,
)
from ravenproxy.pki.identity import (
    validate_node_name as validate_node_name,
)
from ravenproxy.pki.issued import missing_sans
from ravenproxy.pki.x509info import cert_from_der

log = logging.getLogger(__name__)

CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=365)
# Nodes and the cloud rarely agree on the time to the second; a certificate that is "not yet
# valid" for a few minutes after `certs init` is a confusing first-run failure.
CLOCK_SKEW = dt.timedelta(minutes=5)

_CURVE = ec.SECP256R1()
_HASH = hashes.SHA256()


# --------------------------------------------------------------------------------------------
# validation


def parse_san(value: str) -> x509.GeneralName:
    """One ``--server-san`` value: an IP address becomes an IPAddress SAN, anything else DNS
    (the rule: :func:`~ravenproxy.pki.identity.server_san`)."""
    san = server_san(value)
    if isinstance(san, str):
        return x509.DNSName(san)
    return x509.IPAddress(san)


def absent_sans(cert: x509.Certificate, wanted: Sequence[x509.GeneralName]) -> list[str]:
    """:func:`~ravenproxy.pki.issued.missing_sans` for a certificate ``cryptography`` holds
    (one rule, read with :mod:`ssl`, for ``certs init`` and the ``--cert-dir`` requester)."""
    der = cert.public_bytes(serialization.Encoding.DER)
    return missing_sans(cert_from_der(der), [str(name.value) for name in wanted])


def _validity(
    not_before: dt.datetime | None, not_after: dt.datetime | None, default: dt.timedelta
) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    start = _aware(not_before) if not_before is not None else now - CLOCK_SKEW
    end = _aware(not_after) if not_after is not None else now + default
    if end <= start:
        raise PKIError(
            f"invalid validity: not_after {end.isoformat()} is not after not_before "
            f"{start.isoformat()}"
        )
    return start, end


def _aware(when: dt.datetime) -> dt.datetime:
    # A naive datetime is taken as UTC, the only zone X.509 knows.
    return when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when.astimezone(dt.UTC)


def _name(common_name: str) -> x509.Name:
    try:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    except ValueError as exc:  # e.g. longer than the 64 characters X.520 allows
        raise PKIError(f"invalid common name {common_name!r}: {exc}") from exc


def key_matches(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    """Whether ``key`` is the private half of ``cert``'s public key."""
    public = cert.public_key()
    return (
        isinstance(public, ec.EllipticCurvePublicKey)
        and public.public_numbers() == key.public_key().public_numbers()
    )


def _check_ca(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey) -> None:
    # Signing with a key that does not belong to the CA certificate produces certificates that
    # fail verification only later, on the far side of a handshake; refuse it here.
    if not key_matches(ca_cert, ca_key):
        _ec_public(ca_cert)  # a clearer error for a CA that holds no ECDSA key at all
        raise PKIError("CA key does not match the CA certificate")
    try:
        bc = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    if bc is None or not bc.ca:
        raise PKIError(f"certificate {ca_cert.subject.rfc4514_string()} is not a CA")


def _ec_public(cert: x509.Certificate) -> ec.EllipticCurvePublicKey:
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise PKIError(f"certificate {cert.subject.rfc4514_string()} does not hold an ECDSA key")
    return key


def _aki(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(_ec_public(ca_cert))
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


# --------------------------------------------------------------------------------------------
# issuing


def generate_ca(
    common_name: str = "ravenproxy-ca",
    *,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    start, end = _validity(not_before, not_after, CA_VALIDITY)
    key = ec.generate_private_key(_CURVE)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    return _self_signed_ca(_name(common_name), key, ski, start, end), key


def extend_ca(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    *,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> x509.Certificate:
    """The same CA with a new validity: ``ca_cert`` re-signed by its own key.

    Subject, key and subject key identifier stay, so every certificate the CA signed before
    still verifies against the new one, and everything it signs now verifies against the old
    one (while that is valid). Only the serial and the dates change.
    """
    _check_ca(ca_cert, ca_key)
    start, end = _validity(not_before, not_after, CA_VALIDITY)
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    return _self_signed_ca(ca_cert.subject, ca_key, ski, start, end)


def _self_signed_ca(
    name: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    ski: x509.SubjectKeyIdentifier,
    start: dt.datetime,
    end: dt.datetime,
) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, _HASH)
    )


def _leaf_key_usage(key_encipherment: bool = False) -> x509.KeyUsage:
    # ECDHE key exchange: the leaf key only ever signs the handshake (an RSA key that asked for
    # it may also encipher, for TLS 1.2 RSA key exchange).
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


LeafPublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


def sign_leaf(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    public_key: LeafPublicKey,
    common_name: str,
    sans: Sequence[x509.GeneralName],
    usages: Sequence[x509.ObjectIdentifier],
    *,
    key_encipherment: bool = False,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> x509.Certificate:
    """A leaf certificate for someone else's ``public_key`` (a CSR's): CN, SANs, extended key
    usages ``usages``, SKI/AKI, a random serial, signed by the CA. ``not_after`` is capped at
    the CA's own not_after: nothing we sign outlives the CA."""
    _check_ca(ca_cert, ca_key)
    start, end = _validity(not_before, not_after, LEAF_VALIDITY)
    end = min(end, ca_cert.not_valid_after_utc)
    if end <= start:
        raise PKIError(f"the CA expires {end.isoformat()}: it can sign nothing more")
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(key_encipherment), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return (
        builder.add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(_aki(ca_cert), critical=False)
        .sign(ca_key, _HASH)
    )


def _issue(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    not_before: dt.datetime | None,
    not_after: dt.datetime | None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    _check_ca(ca_cert, ca_key)
    key = ec.generate_private_key(_CURVE)
    cert = sign_leaf(
        ca_cert,
        ca_key,
        key.public_key(),
        common_name,
        sans,
        [usage],
        not_before=not_before,
        not_after=not_after,
    )
    return cert, key


def issue_server_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    sans: Sequence[str],
    *,
    common_name: str = "ravenproxy-server",
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for the given names and IPs (serverAuth only).

    Only serverAuth, so that the server certificate can never pass for an agent's client
    certificate, even if it leaks.
    """
    if isinstance(sans, str):
        raise PKIError(f"server SANs must be a sequence of names, not the string {sans!r}")
    names: list[x509.GeneralName] = []
    for san in sans:
        parsed = parse_san(san)
        if parsed not in names:
            names.append(parsed)
    if not names:
        raise PKIError("a server certificate needs at least one SAN (DNS name or IP)")
    return _issue(
        ca_cert, ca_key, common_name, names, ExtendedKeyUsageOID.SERVER_AUTH, not_before, not_after
    )


def issue_client_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    node_name: str,
    *,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """An agent's client certificate: CN and the only DNS SAN are the node name (clientAuth)."""
    validate_node_name(node_name)
    return _issue(
        ca_cert,
        ca_key,
        node_name,
        [x509.DNSName(node_name)],
        ExtendedKeyUsageOID.CLIENT_AUTH,
        not_before,
        not_after,
    )


# --------------------------------------------------------------------------------------------
# identity


def cert_node_name(cert: x509.Certificate, what: str = "peer certificate") -> str:
    """:func:`~ravenproxy.pki.identity.node_of` for a certificate ``cryptography`` holds (the
    rule itself reads the certificate with :mod:`ssl`: one parser on every side)."""
    return node_of(cert_from_der(cert.public_bytes(serialization.Encoding.DER)), what)


def is_issued_by(cert: x509.Certificate, ca_cert: x509.Certificate) -> bool:
    """Whether ``ca_cert`` signed ``cert`` (signature and issuer name; not validity)."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True
