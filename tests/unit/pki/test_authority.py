from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import stat
from pathlib import Path
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ravenproxy.errors import PKIError, RavenProxyError
from ravenproxy.pki import (
    generate_ca,
    is_issued_by,
    issue_client_cert,
    issue_server_cert,
    load_cert,
    load_key,
    node_name_from_cert,
    validate_node_name,
    write_pem_cert,
    write_pem_key,
)

CA = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]
T = TypeVar("T", bound=x509.ExtensionType)


@pytest.fixture(scope="module")
def ca() -> CA:
    return generate_ca()


def _ext(cert: x509.Certificate, kind: type[T]) -> T:
    return cert.extensions.get_extension_for_class(kind).value


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


# --- CA ----------------------------------------------------------------------------------------


def test_ca_is_a_self_signed_p256_ca_for_leaves_only(ca: CA) -> None:
    cert, key = ca
    assert isinstance(key.curve, ec.SECP256R1)
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)
    cert.verify_directly_issued_by(cert)
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = _ext(cert, x509.KeyUsage)
    assert ku.key_cert_sign and ku.crl_sign and not ku.digital_signature
    ski = _ext(cert, x509.SubjectKeyIdentifier)
    assert ski == x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "ravenproxy-ca"


def test_ca_default_validity_is_ten_years_backdated_for_clock_skew(ca: CA) -> None:
    cert, _ = ca
    now = dt.datetime.now(dt.UTC)
    assert now - dt.timedelta(minutes=6) < cert.not_valid_before_utc < now - dt.timedelta(minutes=4)
    life = cert.not_valid_after_utc - now
    assert dt.timedelta(days=3649) < life < dt.timedelta(days=3651)


def test_explicit_validity_is_used_and_naive_times_are_utc() -> None:
    start = dt.datetime(2030, 1, 1, 12, 0, 0)
    end = dt.datetime(2031, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    cert, _ = generate_ca("x", not_before=start, not_after=end)
    assert cert.not_valid_before_utc == start.replace(tzinfo=dt.UTC)
    assert cert.not_valid_after_utc == end


def test_validity_must_be_ordered() -> None:
    now = dt.datetime.now(dt.UTC)
    with pytest.raises(PKIError, match="not after"):
        generate_ca(not_before=now, not_after=now - dt.timedelta(seconds=1))


def test_overlong_common_name_is_a_pki_error() -> None:
    with pytest.raises(PKIError, match="common name"):
        generate_ca("x" * 65)


# --- server certificates -------------------------------------------------------------------------


def test_server_cert_chains_to_ca_with_ip_and_dns_sans(ca: CA) -> None:
    ca_cert, ca_key = ca
    sans = ["localhost", "127.0.0.1", "::1", "Proxy.Example"]
    cert, key = issue_server_cert(ca_cert, ca_key, sans)
    cert.verify_directly_issued_by(ca_cert)
    assert isinstance(key.curve, ec.SECP256R1)
    san = _ext(cert, x509.SubjectAlternativeName)
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "proxy.example"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not _ext(cert, x509.BasicConstraints).ca
    assert _ext(cert, x509.KeyUsage).digital_signature
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "ravenproxy-server"
    aki = _ext(cert, x509.AuthorityKeyIdentifier)
    assert aki.key_identifier == _ext(ca_cert, x509.SubjectKeyIdentifier).digest
    life = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert dt.timedelta(days=364) < life < dt.timedelta(days=366)


def test_server_cert_accepts_wildcard_and_dedupes(ca: CA) -> None:
    cert, _ = issue_server_cert(ca[0], ca[1], ["*.svc.local", "a", "A", "10.0.0.1", "10.0.0.1"])
    san = _ext(cert, x509.SubjectAlternativeName)
    assert san.get_values_for_type(x509.DNSName) == ["*.svc.local", "a"]
    assert len(san.get_values_for_type(x509.IPAddress)) == 1


@pytest.mark.parametrize("bad", ["", "bad name", "-x", "a..b", "http://x", "x" * 254])
def test_server_cert_refuses_bad_sans(ca: CA, bad: str) -> None:
    with pytest.raises(PKIError, match="server SAN"):
        issue_server_cert(ca[0], ca[1], [bad])


def test_server_cert_needs_a_san_and_a_sequence(ca: CA) -> None:
    with pytest.raises(PKIError, match="at least one SAN"):
        issue_server_cert(ca[0], ca[1], [])
    with pytest.raises(PKIError, match="not the string"):
        issue_server_cert(ca[0], ca[1], "localhost")


def test_issuing_with_a_foreign_key_is_refused(ca: CA) -> None:
    _, other_key = generate_ca()
    with pytest.raises(PKIError, match="does not match"):
        issue_server_cert(ca[0], other_key, ["localhost"])


def test_issuing_with_a_leaf_as_ca_is_refused(ca: CA) -> None:
    leaf, leaf_key = issue_client_cert(ca[0], ca[1], "edge-1")
    with pytest.raises(PKIError, match="not a CA"):
        issue_client_cert(leaf, leaf_key, "edge-2")


# --- client certificates -----------------------------------------------------------------------


def test_client_cert_names_the_node(ca: CA) -> None:
    cert, _ = issue_client_cert(ca[0], ca[1], "edge-1.zone-a")
    cert.verify_directly_issued_by(ca[0])
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "edge-1.zone-a"
    san = _ext(cert, x509.SubjectAlternativeName)
    assert san.get_values_for_type(x509.DNSName) == ["edge-1.zone-a"]
    assert list(_ext(cert, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert node_name_from_cert(_der(cert)) == "edge-1.zone-a"


@pytest.mark.parametrize(
    "bad",
    ["", "Edge-1", "edge_1", "-edge", "edge-", "edge..1", ".edge", "edge 1", "é", "a" * 254],
)
def test_invalid_node_names_are_refused_naming_the_value(ca: CA, bad: str) -> None:
    with pytest.raises(PKIError) as info:
        issue_client_cert(ca[0], ca[1], bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("good", ["a", "0", "edge-1", "node.example.com", "a" * 253])
def test_valid_node_names(good: str) -> None:
    assert validate_node_name(good) == good


def test_pki_error_is_a_ravenproxy_error() -> None:
    assert issubclass(PKIError, RavenProxyError)


# --- identity from a certificate ---------------------------------------------------------------


def _custom_cert(
    ca: CA,
    *,
    cns: list[str],
    dns: list[str] | None,
    eku: list[x509.ObjectIdentifier] | None,
) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn) for cn in cns]))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
    )
    if dns is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns]), critical=False
        )
    if eku is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    return _der(builder.sign(ca[1], hashes.SHA256()))


CLIENT = [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_node_name_without_san_is_the_cn(ca: CA) -> None:
    assert node_name_from_cert(_custom_cert(ca, cns=["edge-2"], dns=None, eku=CLIENT)) == "edge-2"


@pytest.mark.parametrize(
    ("cns", "dns", "eku", "match"),
    [
        (["edge-1"], ["edge-2"], CLIENT, "does not match"),
        (["edge-1"], ["edge-1", "other"], CLIENT, "does not match"),
        (["edge-1", "edge-2"], None, CLIENT, "exactly one CN"),
        ([], ["edge-1"], CLIENT, "exactly one CN"),
        (["Not A Node"], None, CLIENT, "not a node name"),
        (["edge-1"], ["edge-1"], None, "no extended key usage"),
        (["edge-1"], ["edge-1"], [ExtendedKeyUsageOID.SERVER_AUTH], "clientAuth"),
    ],
)
def test_ambiguous_or_non_client_certificates_name_no_node(
    ca: CA,
    cns: list[str],
    dns: list[str] | None,
    eku: list[x509.ObjectIdentifier] | None,
    match: str,
) -> None:
    with pytest.raises(PKIError, match=match):
        node_name_from_cert(_custom_cert(ca, cns=cns, dns=dns, eku=eku))


def test_server_cert_is_no_agent_identity(ca: CA) -> None:
    cert, _ = issue_server_cert(ca[0], ca[1], ["ravenproxy-server"])
    with pytest.raises(PKIError, match="clientAuth"):
        node_name_from_cert(_der(cert))


def test_garbage_der_is_a_pki_error() -> None:
    with pytest.raises(PKIError, match="DER"):
        node_name_from_cert(b"\x30\x03junk")


def test_is_issued_by(ca: CA) -> None:
    cert, _ = issue_client_cert(ca[0], ca[1], "edge-1")
    other, _ = generate_ca()
    assert is_issued_by(cert, ca[0])
    assert not is_issued_by(cert, other)


# --- files -------------------------------------------------------------------------------------


def test_pem_round_trip_and_modes(tmp_path: Path, ca: CA) -> None:
    write_pem_cert(tmp_path / "ca.crt", ca[0])
    write_pem_key(tmp_path / "ca.key", ca[1])
    assert load_cert(tmp_path / "ca.crt") == ca[0]
    loaded = load_key(str(tmp_path / "ca.key"))
    assert loaded.private_numbers() == ca[1].private_numbers()
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    assert not stat.S_IMODE((tmp_path / "ca.crt").stat().st_mode) & 0o022
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "ca.key"]  # no temp left


def test_key_is_0600_before_it_gets_its_name(
    tmp_path: Path, ca: CA, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    real_replace = os.replace

    def spy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(stat.S_IMODE(os.stat(src).st_mode))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    old = os.umask(0)  # the most permissive umask must not widen a key's mode
    try:
        write_pem_key(tmp_path / "k.key", ca[1])
    finally:
        os.umask(old)
    assert seen == [0o600]
    assert stat.S_IMODE((tmp_path / "k.key").stat().st_mode) == 0o600


def test_overwrite_false_never_replaces(tmp_path: Path, ca: CA) -> None:
    target = tmp_path / "x.key"
    target.write_bytes(b"precious")
    with pytest.raises(PKIError, match="already exists"):
        write_pem_key(target, ca[1], overwrite=False)
    assert target.read_bytes() == b"precious"
    assert [p.name for p in tmp_path.iterdir()] == ["x.key"]


def test_write_into_missing_directory_is_a_pki_error(tmp_path: Path, ca: CA) -> None:
    with pytest.raises(PKIError, match=re.escape(str(tmp_path / "nope" / "ca.crt"))):
        write_pem_cert(tmp_path / "nope" / "ca.crt", ca[0])


def test_missing_files_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(PKIError, match=re.escape(f"{tmp_path}/none.crt: No such file")):
        load_cert(tmp_path / "none.crt")
    with pytest.raises(PKIError, match=re.escape(f"{tmp_path}/none.key: No such file")):
        load_key(tmp_path / "none.key")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage",
        b"-----BEGIN CERTIFICATE-----\nnot base64!!\n-----END CERTIFICATE-----\n",
    ],
)
def test_garbled_pem_names_the_path(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_bytes(content)
    with pytest.raises(PKIError, match=re.escape(str(bad))):
        load_cert(bad)
    with pytest.raises(PKIError, match=re.escape(str(bad))):
        load_key(bad)


def test_cert_file_is_not_a_key(tmp_path: Path, ca: CA) -> None:
    write_pem_cert(tmp_path / "ca.crt", ca[0])
    with pytest.raises(PKIError, match="not a PEM private key"):
        load_key(tmp_path / "ca.crt")


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(PKIError, match="is a directory"):
        load_cert(tmp_path)


def test_encrypted_and_non_ec_keys_are_refused(tmp_path: Path, ca: CA) -> None:
    enc = tmp_path / "enc.key"
    enc.write_bytes(
        ca[1].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    with pytest.raises(PKIError, match="encrypted"):
        load_key(enc)
    rsa_path = tmp_path / "rsa.key"
    rsa_path.write_bytes(
        rsa.generate_private_key(65537, 2048).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    with pytest.raises(PKIError, match="not an ECDSA key"):
        load_key(rsa_path)
