"""What the controller signs (controller/signing.py): lifetime capped (never beyond the CA),
usages and SANs per signer, a certificate that verifies against the CA."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

from ravenproxy.controller.signing import certificate_field, lifetime, sign
from ravenproxy.errors import PKIError
from ravenproxy.pki import authority
from ravenproxy.pki.issuance import SIGNER_AGENT, SIGNER_SERVER
from tests.unit.controller.csrs import csr, request, sa_of

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
CA = authority.generate_ca(not_before=NOW - dt.timedelta(days=1))


def eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def sans(cert: x509.Certificate) -> list[str]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(n.value) for n in ext]


def test_an_agent_certificate_is_the_nodes_client_certificate() -> None:
    cert = sign(csr(request("edge-1")), *CA, now=NOW)
    assert authority.is_issued_by(cert, CA[0])
    assert authority.cert_node_name(cert) == "edge-1"
    assert eku(cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert sans(cert) == ["edge-1"]
    ku = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and not ku.key_encipherment and not ku.key_cert_sign
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = CA[0].extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest


def test_a_server_certificate_carries_the_csrs_sans_and_server_auth_only() -> None:
    obj = csr(
        request("cloud-1", dns=["cloud-1", "x-raven-proxy-internal-svc"], ips=["10.1.0.1"]),
        signer=SIGNER_SERVER,
        usages=("digital signature", "server auth"),
        requester=sa_of("cloud-1"),
    )
    cert = sign(obj, *CA, now=NOW)
    assert eku(cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert sans(cert) == ["cloud-1", "x-raven-proxy-internal-svc", "10.1.0.1"]
    # Never usable as the node's client certificate, even with the node name as only SAN.
    obj["spec"]["request"] = request("cloud-1", dns=["cloud-1"])
    with pytest.raises(PKIError, match="not a client certificate"):
        authority.cert_node_name(sign(obj, *CA, now=NOW))


def test_serials_are_random() -> None:
    obj = csr(request("edge-1"))
    assert sign(obj, *CA, now=NOW).serial_number != sign(obj, *CA, now=NOW).serial_number


@pytest.mark.parametrize(
    ("asked", "cap", "lives"),
    [
        (None, dt.timedelta(days=30), dt.timedelta(days=30)),
        (3600, dt.timedelta(days=30), dt.timedelta(hours=1)),
        (86400 * 365, dt.timedelta(days=30), dt.timedelta(days=30)),
        (600, dt.timedelta(seconds=60), dt.timedelta(seconds=60)),
    ],
)
def test_the_lifetime_is_what_was_asked_capped(
    asked: int | None, cap: dt.timedelta, lives: dt.timedelta
) -> None:
    assert lifetime(asked, cap) == lives
    cert = sign(csr(request("edge-1"), expiration=asked), *CA, max_lifetime=cap, now=NOW)
    assert cert.not_valid_after_utc == NOW + lives
    assert cert.not_valid_before_utc == NOW - min(authority.CLOCK_SKEW, lives / 10)


def test_a_short_certificate_is_not_due_on_arrival() -> None:
    """Backdated by the full 5 minutes, a 60 s certificate would be past its 70-90 % rotation
    point the moment it is issued, and its holder would ask again and again."""
    cert = sign(
        csr(request("edge-1"), expiration=600), *CA, max_lifetime=dt.timedelta(seconds=60), now=NOW
    )
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    earliest_rotation = start + (end - start) * 0.7
    assert earliest_rotation - NOW >= dt.timedelta(seconds=30)
    assert NOW - start == dt.timedelta(seconds=6)


def test_no_certificate_outlives_the_ca() -> None:
    ca = authority.generate_ca(
        not_before=NOW - dt.timedelta(days=1), not_after=NOW + dt.timedelta(days=2)
    )
    cert = sign(csr(request("edge-1")), *ca, max_lifetime=dt.timedelta(days=30), now=NOW)
    assert cert.not_valid_after_utc == ca[0].not_valid_after_utc


def test_an_expired_ca_signs_nothing() -> None:
    ca = authority.generate_ca(
        not_before=NOW - dt.timedelta(days=10), not_after=NOW - dt.timedelta(days=1)
    )
    with pytest.raises(PKIError, match="CA expires"):
        sign(csr(request("edge-1")), *ca, now=NOW)


def test_an_rsa_key_that_asked_for_key_encipherment_gets_it() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    obj = csr(
        request("edge-1", key=key),
        usages=("digital signature", "key encipherment", "client auth"),
    )
    cert = sign(obj, *CA, now=NOW)
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_encipherment
    assert authority.is_issued_by(cert, CA[0])


@pytest.mark.parametrize("signer", ["kubernetes.io/kube-apiserver-client", ""])
def test_only_our_signers_are_signed(signer: str) -> None:
    with pytest.raises(PKIError, match="not ours"):
        sign(csr(request("edge-1"), signer=signer), *CA, now=NOW)


def test_an_unsignable_request_is_an_error_not_a_certificate() -> None:
    with pytest.raises(PKIError, match="subject must be exactly"):
        sign(csr(request("edge-1", organization="system:masters")), *CA, now=NOW)
    obj = csr(request("cloud-1"), signer=SIGNER_SERVER, usages=("digital signature",))
    with pytest.raises(PKIError, match="at least one SAN"):
        sign(obj, *CA, now=NOW)


def test_the_status_field_is_base64_pem() -> None:
    cert = sign(csr(request("edge-1"), signer=SIGNER_AGENT), *CA, now=NOW)
    (back,) = x509.load_pem_x509_certificates(base64.b64decode(certificate_field(cert)))
    assert back == cert
