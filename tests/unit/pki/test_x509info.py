"""What ssl reads of a certificate (ravenproxy.pki.x509info) agrees with what cryptography reads
of the same certificate: subject, serial, validity, SANs, extended key usage; and the in-memory
handshake refuses what a peer refuses."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.errors import PKIError
from ravenproxy.pki import x509info
from ravenproxy.pki.authority import generate_ca, issue_client_cert, issue_server_cert
from ravenproxy.pki.pemfiles import cert_pem, key_pem
from ravenproxy.pki.x509info import (
    CLIENT_AUTH,
    SERVER_AUTH,
    KeyPairError,
    cert_from_der,
    certs_from_pem,
    load_certs,
    load_pair,
    peer_cert,
    private_file,
    verify_problem,
)

Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


@pytest.fixture(scope="module")
def ca() -> Issued:
    return generate_ca("ca-one")


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(Encoding.DER)


def _custom(
    ca: Issued,
    name: x509.Name,
    eku: list[x509.ObjectIdentifier] | None,
    sans: list[x509.GeneralName],
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca[0].subject)
        .public_key(ec.generate_private_key(ec.SECP256R1()).public_key())
        .serial_number(0x00FF_0000_0000_0001)
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=3))
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    return builder.sign(ca[1], hashes.SHA256())


def test_issued_certificates_read_the_same_as_with_cryptography(ca: Issued) -> None:
    client, _ = issue_client_cert(*ca, "edge-1")
    server, _ = issue_server_cert(*ca, ["localhost", "127.0.0.1"])
    for cert in (ca[0], client, server):
        info = cert_from_der(_der(cert))
        assert info.der == _der(cert)
        assert info.subject == cert.subject.rfc4514_string()
        assert info.issuer == cert.issuer.rfc4514_string()
        assert info.serial == cert.serial_number
        assert info.serial_hex == format(cert.serial_number, "x")
        assert info.not_before == cert.not_valid_before_utc
        assert info.not_after == cert.not_valid_after_utc
    assert cert_from_der(_der(client)).extended_key_usage == {CLIENT_AUTH}
    assert cert_from_der(_der(server)).extended_key_usage == {SERVER_AUTH}
    assert cert_from_der(_der(ca[0])).extended_key_usage is None
    assert cert_from_der(_der(server)).dns_names == ("localhost",)


def test_names_are_escaped_and_ordered_as_rfc_4514(ca: Issued) -> None:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "DE"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme, Inc. + <co>;"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, " edge "),
            x509.NameAttribute(NameOID.COMMON_NAME, "#edge-1"),
        ]
    )
    cert = _custom(ca, name, None, [])
    info = cert_from_der(_der(cert))
    assert info.subject == cert.subject.rfc4514_string()
    assert info.common_names == ("#edge-1",)


def test_several_usages_and_sans_of_every_kind(ca: Issued) -> None:
    eku = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    sans: list[x509.GeneralName] = [
        x509.DNSName("a.example"),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        x509.DNSName("b.example"),
    ]
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    info = cert_from_der(_der(_custom(ca, name, eku, sans)))
    assert info.extended_key_usage == {SERVER_AUTH, CLIENT_AUTH}
    assert info.dns_names == ("a.example", "b.example")
    assert info.serial == 0x00FF_0000_0000_0001


def test_a_pem_file_in_order_other_blocks_skipped(ca: Issued) -> None:
    client, key = issue_client_cert(*ca, "edge-1")
    data = cert_pem(client) + key_pem(key) + cert_pem(ca[0])
    assert [c.der for c in certs_from_pem(data)] == [_der(client), _der(ca[0])]
    assert certs_from_pem(b"no pem here") == ()


def test_garbage_is_a_value_error(ca: Issued) -> None:
    with pytest.raises(ValueError, match="not a certificate"):
        cert_from_der(b"\x30\x03junk")
    broken = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    with pytest.raises(ValueError):
        certs_from_pem(broken)


def test_load_certs_names_the_flag_and_file(tmp_path: Path) -> None:
    with pytest.raises(PKIError, match=r"--cert-file .*missing.crt: No such file"):
        load_certs(tmp_path / "missing.crt", "--cert-file")
    empty = tmp_path / "empty.crt"
    empty.write_text("nothing\n")
    with pytest.raises(PKIError, match=r"--cert-file .*empty.crt: no certificate"):
        load_certs(empty, "--cert-file")


def test_the_handshake_verifies_client_and_server_certificates(ca: Issued) -> None:
    other = generate_ca("ca-two")
    ca_info = cert_from_der(_der(ca[0]))
    other_info = cert_from_der(_der(other[0]))
    for cert, key in (issue_client_cert(*ca, "edge-1"), issue_server_cert(*ca, ["localhost"])):
        assert verify_problem(cert_pem(cert), key_pem(key), ca_info) is None
        problem = verify_problem(cert_pem(cert), key_pem(key), other_info)
        assert problem is not None and "issuer" in problem


def test_the_handshake_ignores_validity_the_caller_judges_it(ca: Issued) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=2)
    expired, key = issue_client_cert(
        *ca, "edge-1", not_before=past, not_after=past + dt.timedelta(days=1)
    )
    assert expired.not_valid_after_utc < dt.datetime.now(dt.UTC)
    assert verify_problem(cert_pem(expired), key_pem(key), cert_from_der(_der(ca[0]))) is None


def test_an_encrypted_key_and_a_key_of_another_certificate_are_told_apart(ca: Issued) -> None:
    cert, key = issue_client_cert(*ca, "edge-1")
    encrypted = key.private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"secret")
    )
    other = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    with private_file(cert_pem(cert)) as c, private_file(encrypted) as k:
        with pytest.raises(KeyPairError, match="encrypted") as err:
            load_pair(ctx, c, k)
        assert not err.value.mismatch
    with private_file(cert_pem(cert)) as c, private_file(other) as k:
        with pytest.raises(KeyPairError, match="does not match") as err:
            load_pair(ctx, c, k)
        assert err.value.mismatch


def test_a_verified_peer_reads_the_same_as_its_der(ca: Issued, tmp_path: Path) -> None:
    # What the handshake decoded (getpeercert) and a parse of the DER agree, field by field.
    client, client_key = issue_client_cert(*ca, "edge-1")
    server, server_key = issue_server_cert(*ca, ["localhost"])
    for name, data in {
        "ca.crt": cert_pem(ca[0]),
        "c.crt": cert_pem(client),
        "c.key": key_pem(client_key),
        "s.crt": cert_pem(server),
        "s.key": key_pem(server_key),
    }.items():
        (tmp_path / name).write_bytes(data)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
    server_ctx.load_verify_locations(tmp_path / "ca.crt")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(tmp_path / "ca.crt")
    client_ctx.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    client_ctx.check_hostname = False
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    theirs = server_ctx.wrap_bio(pipes[0], pipes[1], server_side=True)
    ours = client_ctx.wrap_bio(pipes[2], pipes[3])
    with pytest.raises(ValueError):
        peer_cert(theirs)  # before the handshake
    for _ in range(6):
        for obj, out, peer_in in ((ours, pipes[3], pipes[0]), (theirs, pipes[1], pipes[2])):
            with contextlib.suppress(ssl.SSLWantReadError):
                obj.do_handshake()
            peer_in.write(out.read())
    seen = peer_cert(theirs)
    assert seen is not None and seen == cert_from_der(_der(client))
    assert seen.extended_key_usage == {CLIENT_AUTH}


@given(
    when=st.datetimes(
        min_value=dt.datetime(1950, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59)
    )
)
def test_validity_times_are_read_as_ssl_reads_them(when: dt.datetime) -> None:
    # OpenSSL prints a certificate's times as "May  9 00:00:00 2027 GMT" (the day padded with a
    # space); x509info reads them without time.strptime, to the same instant ssl does.
    text = when.strftime("%b ") + f"{when.day:2d}" + when.strftime(" %H:%M:%S %Y GMT")
    expected = dt.datetime.fromtimestamp(ssl.cert_time_to_seconds(text), dt.UTC)
    assert x509info._time(text) == expected == when.replace(microsecond=0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    "text",
    ["", "May  9 00:00:00 2027", "May  9 00:00:00 2027 UTC", "Mai  9 00:00:00 2027 GMT",
     "May 32 00:00:00 2027 GMT", "May  9 00:00 2027 GMT", "May  9 0x:00:00 2027 GMT"],
)  # fmt: skip
def test_a_time_ssl_refuses_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        ssl.cert_time_to_seconds(text)
    with pytest.raises(ValueError, match="does not match format"):
        x509info._time(text)
