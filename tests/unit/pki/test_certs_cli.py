"""``ravenproxy certs init|status|renew`` as a user runs them: the real console script in a
child process, its output and exit codes."""

from __future__ import annotations

import json
import shutil
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ravenproxy.pki import init_pki, load_cert
from ravenproxy.pki.status import sans_of, serial_hex
from tests.unit.pki.pkidir import days, reissue, serial, short_ca


def certs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ravenproxy", "certs", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _handshake(pki: Path, hostname: str, client: str) -> None:
    """An mTLS handshake over memory BIOs: server.crt/key against a client that trusts ca.crt
    and checks ``hostname``, with ``client``.crt/key as the client certificate."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    server_ctx.load_verify_locations(pki / "ca.crt")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    client_ctx.load_cert_chain(pki / f"{client}.crt", pki / f"{client}.key")
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    s = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    assert all(done.values()), done
    peer = s.getpeercert()
    assert peer is not None and ("commonName", client) in peer["subject"][0]


def _no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr, done.stderr


def test_init_then_status_exits_0_and_prints_every_certificate(tmp_path: Path) -> None:
    pki = tmp_path / "certs"
    done = certs("init", "--dir", str(pki), "--server-san", "proxy.example", "--agent", "edge-1")
    assert done.returncode == 0, done.stderr
    done = certs("status", "--dir", str(pki))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout
    for fragment in (
        "ca.crt: ca",
        "subject    CN=ravenproxy-ca",
        "edge-1.crt: agent",
        "SANs       edge-1",
        "server.crt: server",
        "SANs       proxy.example",
        f"serial     {serial_hex(serial(pki / 'server.crt'))}",
        "(364 days left)",
        "all 3 certificates valid for more than 30 days",
    ):
        assert fragment in out, (fragment, out)
    not_after = load_cert(pki / "server.crt").not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"not after  {not_after}" in out


def test_status_exits_1_for_a_due_or_expired_certificate(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1", "edge-2"])
    reissue(tmp_path, "edge-1", not_after=days(12.5))
    reissue(tmp_path, "edge-2", not_before=days(-5), not_after=days(-1.5))
    done = certs("status", "--dir", str(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "2 of 4 expire within 30 days or have expired: edge-1.crt, edge-2.crt" in done.stdout
    assert "(12 days left)" in done.stdout and "(EXPIRED)" in done.stdout
    assert "warning: edge-2.crt expired on " in done.stderr
    # A shorter horizon: only the expired one counts.
    done = certs("status", "--dir", str(tmp_path), "--warn-days", "10", "--output", "json")
    assert done.returncode == 1
    assert json.loads(done.stdout)["due"] == ["edge-2.crt"]


def test_status_exits_2_with_one_line_naming_the_file(tmp_path: Path) -> None:
    done = certs("status", "--dir", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"ravenproxy certs status: error: certificate directory {tmp_path / 'nowhere'}: "
        "No such directory"
    ]
    init_pki(tmp_path)
    (tmp_path / "server.crt").write_text("-----BEGIN CERTIFICATE-----\nnope\n")
    done = certs("status", "--dir", str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"ravenproxy certs status: error: certificate {tmp_path}/server.crt: ")
    _no_traceback(done)


def test_status_warns_about_a_key_readable_by_others(tmp_path: Path) -> None:
    init_pki(tmp_path)
    (tmp_path / "server.key").chmod(0o644)
    done = certs("status", "--dir", str(tmp_path))
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        f"warning: {tmp_path}/server.key is readable by others (mode 0644); chmod 600 it"
    ]


def test_renew_renews_only_what_is_due_and_a_second_run_nothing(tmp_path: Path) -> None:
    init_pki(tmp_path, ["proxy.example", "192.0.2.7"], ["edge-1", "edge-2"])
    reissue(tmp_path, "server", not_after=days(5))
    reissue(tmp_path, "edge-1", not_after=days(29))
    before = {n: serial(tmp_path / f"{n}.crt") for n in ("server", "edge-1", "edge-2")}

    done = certs("renew", "--dir", str(tmp_path), "--within", "30", "--days", "200")
    assert done.returncode == 0, done.stderr
    _no_traceback(done)
    lines = done.stdout.splitlines()
    assert sorted(line.split(":")[0] for line in lines) == [
        f"kept    {tmp_path}/edge-2.crt",
        f"renewed {tmp_path}/edge-1.crt",
        f"renewed {tmp_path}/server.crt",
    ]
    after = {n: serial(tmp_path / f"{n}.crt") for n in before}
    assert after["server"] != before["server"] and after["edge-1"] != before["edge-1"]
    assert after["edge-2"] == before["edge-2"]
    for name in ("server", "edge-1"):
        change = f"serial {serial_hex(before[name])} -> {serial_hex(after[name])}, valid until"
        assert change in done.stdout, (change, done.stdout)
    for name in ("server", "edge-1", "edge-2"):
        assert stat.S_IMODE((tmp_path / f"{name}.key").stat().st_mode) == 0o600
    server = load_cert(tmp_path / "server.crt")
    assert sans_of(server) == ("proxy.example", "192.0.2.7")
    assert days(199) < server.not_valid_after_utc <= days(200)

    # The renewed pair serves a TLS handshake that a client trusting ca.crt accepts, for the
    # names it had; an agent's renewed client certificate is accepted by the same handshake.
    _handshake(tmp_path, "proxy.example", client="edge-1")
    _handshake(tmp_path, "192.0.2.7", client="edge-1")

    again = certs("renew", "--dir", str(tmp_path))
    assert again.returncode == 0
    assert "renewed" not in again.stdout
    assert again.stdout.count("kept    ") == 3
    assert {n: serial(tmp_path / f"{n}.crt") for n in before} == after
    assert certs("status", "--dir", str(tmp_path)).returncode == 0


@pytest.mark.skipif(
    shutil.which("openssl") is None,
    reason="openssl binary not on PATH: cannot cross-check the renewed chain with OpenSSL",
)
def test_openssl_verifies_renewed_certificates(tmp_path: Path) -> None:
    init_pki(tmp_path, agents=["edge-1"])
    assert certs("renew", "--dir", str(tmp_path), "--force").returncode == 0
    openssl = shutil.which("openssl")
    assert openssl is not None
    for leaf, purpose in (("server.crt", "sslserver"), ("edge-1.crt", "sslclient")):
        done = subprocess.run(
            [openssl, "verify", "-x509_strict", "-purpose", purpose, "-CAfile", "ca.crt", leaf],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert done.stdout.strip() == f"{leaf}: OK", done.stderr


def test_renew_extends_a_due_ca_and_says_so(tmp_path: Path) -> None:
    short_ca(tmp_path, days(10))
    done = certs("renew", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"extended {tmp_path}/ca.crt: same subject and key, valid until ")
    assert "replace every other copy of it before" in first
    assert done.stdout.count("renewed ") == 2


def test_renew_errors_name_the_flag_or_the_file(tmp_path: Path) -> None:
    init_pki(tmp_path)
    done = certs("renew", "--dir", str(tmp_path), "--days", "0")
    assert done.returncode == 2
    assert "argument --days: must be more than 0 days, not 0" in done.stderr
    done = certs("renew", "--dir", str(tmp_path), "--within", "soon")
    assert done.returncode == 2
    assert "argument --within: not a number of days: 'soon'" in done.stderr
    (tmp_path / "ca.key").unlink()
    done = certs("renew", "--dir", str(tmp_path), "--force")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"ravenproxy certs renew: error: {tmp_path}/ca.key: No such file")
    _no_traceback(done)
