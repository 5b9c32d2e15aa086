from __future__ import annotations

import dataclasses
import datetime as dt
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.oid import NameOID

from ravenproxy.errors import PKIError
from ravenproxy.pki import (
    InitReport,
    generate_ca,
    init_pki,
    issue_server_cert,
    load_cert,
    load_key,
    node_name_from_cert,
    write_pem_cert,
    write_pem_key,
)


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _names(paths: tuple[Path, ...]) -> set[str]:
    return {p.name for p in paths}


def test_fresh_init_lays_out_the_pki(tmp_path: Path) -> None:
    pki = tmp_path / "certs"
    report = init_pki(pki, agents=["edge-1", "edge-2"])
    expected = {
        "ca.crt", "ca.key", "server.crt", "server.key",
        "edge-1.crt", "edge-1.key", "edge-2.crt", "edge-2.key",
    }  # fmt: skip
    assert {p.name for p in pki.iterdir()} == expected
    assert _names(report.created) == expected
    assert report.kept == ()
    assert report.warnings == ()
    assert report.directory == pki
    assert all(p.parent == pki for p in report.created)

    assert stat.S_IMODE(pki.stat().st_mode) == 0o700
    for key in pki.glob("*.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key

    ca = load_cert(pki / "ca.crt")
    spki = Encoding.PEM, PublicFormat.SubjectPublicKeyInfo
    assert load_key(pki / "ca.key").public_key().public_bytes(*spki) == (
        ca.public_key().public_bytes(*spki)
    )
    server = load_cert(pki / "server.crt")
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    for node in ("edge-1", "edge-2"):
        cert = load_cert(pki / f"{node}.crt")
        cert.verify_directly_issued_by(ca)
        assert node_name_from_cert(cert.public_bytes(Encoding.DER)) == node


def test_report_is_frozen(tmp_path: Path) -> None:
    report = init_pki(tmp_path / "p")
    assert isinstance(report, InitReport)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.created = ()  # type: ignore[misc]


def test_rerun_keeps_files_byte_identical_and_signs_new_agents_with_existing_ca(
    tmp_path: Path,
) -> None:
    pki = tmp_path / "certs"
    init_pki(pki, agents=["edge-1"])
    before = _snapshot(pki)

    again = init_pki(pki, agents=["edge-1"])
    assert again.created == ()
    assert _names(again.kept) == set(before)
    assert again.warnings == ()
    assert _snapshot(pki) == before

    more = init_pki(pki, agents=["edge-1", "edge-2"])
    assert _names(more.created) == {"edge-2.crt", "edge-2.key"}
    assert "ca.crt" in _names(more.kept) and "edge-1.key" in _names(more.kept)
    after = _snapshot(pki)
    assert {k: after[k] for k in before} == before
    load_cert(pki / "edge-2.crt").verify_directly_issued_by(load_cert(pki / "ca.crt"))
    assert stat.S_IMODE((pki / "edge-2.key").stat().st_mode) == 0o600


def test_existing_server_cert_missing_a_san_is_kept_with_a_warning(tmp_path: Path) -> None:
    pki = tmp_path / "certs"
    init_pki(pki, server_sans=["localhost", "127.0.0.1"])
    before = (pki / "server.crt").read_bytes()
    report = init_pki(pki, server_sans=["LOCALHOST", "127.0.0.1", "proxy.example", "10.0.0.5"])
    assert (pki / "server.crt").read_bytes() == before
    assert len(report.warnings) == 1
    warning = report.warnings[0]
    assert "server.crt" in warning and "proxy.example" in warning and "10.0.0.5" in warning
    assert "localhost" not in warning.split("SAN(s)")[1]


def test_custom_server_sans(tmp_path: Path) -> None:
    init_pki(tmp_path, server_sans=["proxy.example", "192.0.2.7", "::1"])
    san = (
        load_cert(tmp_path / "server.crt")
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert san.get_values_for_type(x509.DNSName) == ["proxy.example"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["192.0.2.7", "::1"]


@pytest.mark.parametrize("bad", ["Edge-1", "edge_1", "", "-x"])
def test_invalid_agent_names_refused_before_anything_is_written(tmp_path: Path, bad: str) -> None:
    pki = tmp_path / "certs"
    with pytest.raises(PKIError, match="invalid node name"):
        init_pki(pki, agents=["edge-1", bad])
    assert not pki.exists()


@pytest.mark.parametrize("reserved", ["ca", "server"])
def test_agent_names_that_clash_with_ca_or_server_files_are_refused(
    tmp_path: Path, reserved: str
) -> None:
    with pytest.raises(PKIError, match="clash"):
        init_pki(tmp_path / "p", agents=[reserved])


def test_bad_server_san_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(PKIError, match="server SAN"):
        init_pki(tmp_path / "p", server_sans=["not a name"])
    assert not (tmp_path / "p").exists()


def test_duplicate_agents_are_issued_once(tmp_path: Path) -> None:
    report = init_pki(tmp_path, agents=["edge-1", "edge-1"])
    assert sorted(p.name for p in report.created if p.name.startswith("edge")) == [
        "edge-1.crt",
        "edge-1.key",
    ]


def test_half_a_pair_is_refused_and_nothing_is_overwritten(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    (tmp_path / "edge-1.key").unlink()
    before = _snapshot(tmp_path)
    with pytest.raises(PKIError, match=r"edge-1\.crt exists but .*edge-1\.key does not"):
        init_pki(tmp_path, agents=["edge-1", "edge-2"])
    assert _snapshot(tmp_path) == before  # edge-2 not written either


def test_missing_ca_key_is_refused(tmp_path: Path) -> None:
    init_pki(tmp_path)
    (tmp_path / "ca.key").unlink()
    with pytest.raises(PKIError, match=r"ca\.crt exists but .*ca\.key does not"):
        init_pki(tmp_path, agents=["edge-1"])
    assert not (tmp_path / "edge-1.crt").exists()


def test_leaves_without_their_ca_are_refused(tmp_path: Path) -> None:
    init_pki(tmp_path)
    (tmp_path / "ca.key").unlink()
    (tmp_path / "ca.crt").unlink()
    with pytest.raises(PKIError, match="a new CA would not have signed"):
        init_pki(tmp_path)
    assert not (tmp_path / "ca.crt").exists()


def test_mismatched_ca_key_is_refused(tmp_path: Path) -> None:
    init_pki(tmp_path)
    _, other_key = generate_ca()
    (tmp_path / "ca.key").unlink()
    write_pem_key(tmp_path / "ca.key", other_key)
    with pytest.raises(PKIError, match="does not belong"):
        init_pki(tmp_path, agents=["edge-1"])


def test_garbled_ca_names_the_file(tmp_path: Path) -> None:
    init_pki(tmp_path)
    (tmp_path / "ca.crt").write_bytes(b"-----BEGIN CERTIFICATE-----\nxx\n")
    with pytest.raises(PKIError, match=re.escape(str(tmp_path / "ca.crt"))):
        init_pki(tmp_path, agents=["edge-1"])


def test_kept_certs_are_checked(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    # A server pair from some other CA, already expired, with a key anyone can read.
    other_cert, other_key = generate_ca()
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    cert, key = issue_server_cert(
        other_cert, other_key, ["localhost", "127.0.0.1"],
        not_before=past - dt.timedelta(days=1), not_after=past,
    )  # fmt: skip
    for name in ("server.crt", "server.key"):
        (tmp_path / name).unlink()
    write_pem_cert(tmp_path / "server.crt", cert)
    write_pem_key(tmp_path / "server.key", key)
    (tmp_path / "server.key").chmod(0o644)
    (tmp_path / "ca.key").chmod(0o640)
    # An agent file whose certificate names another node.
    (tmp_path / "edge-1.crt").unlink()
    (tmp_path / "edge-1.key").unlink()
    shutil.copy(tmp_path / "server.crt", tmp_path / "edge-1.crt")
    shutil.copy(tmp_path / "server.key", tmp_path / "edge-1.key")

    report = init_pki(tmp_path, agents=["edge-1"])
    text = "\n".join(report.warnings)
    assert "server.crt was not issued by the CA" in text
    assert "expired" in text
    assert "server.key is readable by others (mode 0644)" in text
    assert "ca.key is readable by others (mode 0640)" in text
    assert "not the node name 'edge-1'" in text
    assert report.created == ()


def test_path_in_place_of_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(PKIError, match="not a directory"):
        init_pki(tmp_path / "file")


def test_existing_directory_mode_is_left_alone(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    init_pki(tmp_path)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755


def test_ca_subject(tmp_path: Path) -> None:
    init_pki(tmp_path)
    ca = load_cert(tmp_path / "ca.crt")
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "ravenproxy-ca"


@pytest.mark.skipif(
    shutil.which("openssl") is None,
    reason="openssl binary not on PATH: cannot cross-check the chain with OpenSSL's verifier",
)
def test_openssl_verifies_the_chain(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    openssl = shutil.which("openssl")
    assert openssl is not None
    for leaf, purpose in (("server.crt", "sslserver"), ("edge-1.crt", "sslclient")):
        result = subprocess.run(
            [openssl, "verify", "-x509_strict", "-purpose", purpose, "-CAfile", "ca.crt", leaf],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"{leaf}: OK"
    # And the purposes are not interchangeable: the server cert is no client cert.
    wrong = subprocess.run(
        [openssl, "verify", "-purpose", "sslclient", "-CAfile", "ca.crt", "server.crt"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    assert wrong.returncode != 0
