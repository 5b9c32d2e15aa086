from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ravenproxy.errors import PKIError
from ravenproxy.pki import generate_ca, init_pki, issue_server_cert, load_cert, write_pem_key
from ravenproxy.pki.pemfiles import write_pem_certs
from ravenproxy.pki.status import render_json, render_text, serial_hex, status, warnings_of
from tests.unit.pki.pkidir import days, reissue, write_pair


def test_fresh_pki_is_listed_with_every_field_and_exits_0(tmp_path: Path) -> None:
    init_pki(tmp_path, ["proxy.example", "10.0.0.5", "::1"], ["edge-1"])
    report = status(tmp_path)
    assert [c.file for c in report.certificates] == ["ca.crt", "edge-1.crt", "server.crt"]
    ca, agent, server = report.certificates
    assert (ca.role, agent.role, server.role) == ("ca", "agent", "server")
    assert (ca.subject, agent.subject) == ("CN=ravenproxy-ca", "CN=edge-1")
    assert server.sans == ("proxy.example", "10.0.0.5", "::1")
    assert agent.sans == ("edge-1",)
    assert int(server.serial, 16) == load_cert(tmp_path / "server.crt").serial_number
    assert len(server.serial) % 2 == 0
    assert server.not_after == load_cert(tmp_path / "server.crt").not_valid_after_utc
    assert server.days_left == 364  # a year less the seconds since issuing
    assert ca.days_left >= 3649
    assert report.due == () and report.exit_code == 0
    assert warnings_of(report) == []


def test_a_certificate_within_warn_days_exits_1_and_is_named(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1", "edge-2"])
    reissue(tmp_path, "edge-2", not_after=days(10.5))
    report = status(tmp_path, warn_days=30)
    assert [c.file for c in report.due] == ["edge-2.crt"]
    assert report.exit_code == 1
    assert [c.days_left for c in report.due] == [10]
    assert not report.due[0].expired
    text = render_text(report)
    assert "1 of 4 expire within 30 days or have expired: edge-2.crt" in text
    assert "edge-2.crt: agent  <- due" in text
    # Under a shorter horizon the same directory is fine.
    assert status(tmp_path, warn_days=10).exit_code == 0


def test_an_expired_certificate_is_due_and_warned_about(tmp_path: Path) -> None:
    init_pki(tmp_path)
    reissue(tmp_path, "server", not_before=days(-3), not_after=days(-1))
    report = status(tmp_path, warn_days=0)
    (server,) = report.due
    assert server.expired and server.days_left == -1
    assert "(EXPIRED)" in render_text(report)
    assert any(w.startswith("server.crt expired on ") for w in server.warnings)
    assert report.exit_code == 1


def test_a_cert_dir_layout_is_read_too(tmp_path: Path) -> None:
    ca_cert, ca_key = generate_ca()
    write_pair(tmp_path, "ca", ca_cert, ca_key)
    (tmp_path / "ca.key").unlink()  # a --cert-dir holds no CA key
    cert, key = issue_server_cert(ca_cert, ca_key, ["10.96.0.10"], common_name="cloud-1")
    write_pair(tmp_path, "tls", cert, key)
    report = status(tmp_path)
    assert [(c.file, c.role, c.sans) for c in report.certificates] == [
        ("ca.crt", "ca", ()),
        ("tls.crt", "server", ("10.96.0.10",)),
    ]
    assert warnings_of(report) == []


def test_keys_readable_by_others_mismatched_keys_and_foreign_leaves_are_warned(
    tmp_path: Path,
) -> None:
    init_pki(tmp_path, agents=["edge-1", "edge-2"])
    (tmp_path / "ca.key").chmod(0o640)
    (tmp_path / "edge-1.key").chmod(0o644)
    shutil.copy(tmp_path / "server.key", tmp_path / "edge-2.key")  # a half-finished renewal
    other = generate_ca()
    reissue(tmp_path, "server", not_after=days(100), ca=other)
    report = status(tmp_path)
    text = "\n".join(warnings_of(report))
    assert "ca.key is readable by others (mode 0640)" in text
    assert "edge-1.key is readable by others (mode 0644)" in text
    assert "edge-2.key does not belong to edge-2.crt" in text
    assert "server.crt was not issued by a CA in ca.crt" in text
    assert report.exit_code == 0  # warnings are printed; the exit code is about expiry


def test_a_leaf_without_its_key_and_a_ca_key_of_another_ca(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    (tmp_path / "edge-1.key").unlink()
    _, other_key = generate_ca()
    (tmp_path / "ca.key").unlink()
    write_pem_key(tmp_path / "ca.key", other_key)
    text = "\n".join(warnings_of(status(tmp_path)))
    assert "edge-1.crt has no key file edge-1.key" in text
    assert "ca.key does not belong to any CA certificate in ca.crt" in text


def test_a_ca_bundle_lists_each_ca_and_trusts_leaves_of_either(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    new_ca = generate_ca("ravenproxy-ca-2")
    reissue(tmp_path, "edge-1", not_after=days(200), ca=new_ca)
    write_pem_certs(tmp_path / "ca.crt", [new_ca[0], load_cert(tmp_path / "ca.crt")])
    report = status(tmp_path)
    files = [(c.file, c.role, c.subject) for c in report.certificates]
    assert files[:2] == [
        ("ca.crt[1]", "ca", "CN=ravenproxy-ca-2"),
        ("ca.crt[2]", "ca", "CN=ravenproxy-ca"),
    ]
    # ca.key is the old CA's: it matches one certificate of the bundle, which is enough.
    assert warnings_of(report) == []


def test_json_output(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    reissue(tmp_path, "edge-1", not_after=days(3))
    doc = json.loads(render_json(status(tmp_path, warn_days=7)))
    assert doc["due"] == ["edge-1.crt"]
    assert doc["warn_days"] == 7
    edge = next(c for c in doc["certificates"] if c["file"] == "edge-1.crt")
    assert edge["role"] == "agent" and edge["days_left"] == 2 and edge["due"] is True
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", edge["not_after"])
    assert edge["serial"] == serial_hex(load_cert(tmp_path / "edge-1.crt").serial_number)


def test_bad_directories_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PKIError, match="No such directory"):
        status(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(PKIError, match="not a directory"):
        status(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PKIError, match=r"no certificate \(\*\.crt\)"):
        status(tmp_path / "empty")


@pytest.mark.parametrize("name", ["server.crt", "server.key"])
def test_a_garbled_file_is_named(tmp_path: Path, name: str) -> None:
    init_pki(tmp_path)
    (tmp_path / name).write_bytes(b"-----BEGIN CERTIFICATE-----\nxx\n")
    with pytest.raises(PKIError, match=re.escape(str(tmp_path / name))):
        status(tmp_path)


def test_temp_files_of_a_write_in_progress_are_not_read(tmp_path: Path) -> None:
    init_pki(tmp_path)
    (tmp_path / ".server.crt.0123abcd.tmp").write_bytes(b"-----BEGIN CERT")
    (tmp_path / ".half.crt").write_bytes(b"-----BEGIN CERT")
    assert [c.file for c in status(tmp_path).certificates] == ["ca.crt", "server.crt"]
