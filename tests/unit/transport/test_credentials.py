"""Certificate reload: the watcher on real files in a tmp dir, and a listening context that
switches every new handshake to the current set (certificate and trust store), by real TLS
handshakes on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding

from ravenproxy.errors import PKIError
from ravenproxy.pki.authority import generate_ca, issue_client_cert, issue_server_cert
from ravenproxy.pki.credentials import Credentials, PemSource, Verdict, load_credentials
from ravenproxy.pki.pemfiles import cert_pem, key_pem, write_pem_cert, write_pem_key
from ravenproxy.transport import tls
from ravenproxy.transport.credentials import CredentialFiles, CredentialsWatcher
from tests.helpers import eventually

Issued = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(Encoding.DER)


LOGGER = "ravenproxy.transport.credentials"


@pytest.fixture(scope="module")
def ca() -> Issued:
    return generate_ca("ca-one")


@pytest.fixture(scope="module")
def other_ca() -> Issued:
    return generate_ca("ca-two")


class Dir:
    """A credential directory written as an operator would: each file atomically, key first."""

    def __init__(self, path: Path) -> None:
        self.files = CredentialFiles(path / "ca.crt", path / "tls.crt", path / "tls.key")

    def write(self, ca: x509.Certificate | None, issued: Issued) -> None:
        if ca is not None:
            write_pem_cert(self.files.ca, ca)
        write_pem_key(self.files.key, issued[1])
        write_pem_cert(self.files.cert, issued[0])


@pytest.fixture
def certdir(tmp_path: Path, ca: Issued) -> Dir:
    d = Dir(tmp_path)
    d.write(ca[0], issue_server_cert(*ca, ["localhost", "127.0.0.1"]))
    return d


def watcher(
    d: Dir, changes: list[tuple[Credentials, Credentials]] | None = None
) -> CredentialsWatcher[ssl.SSLContext]:
    w: CredentialsWatcher[ssl.SSLContext] = CredentialsWatcher(
        d.files,
        tls.server_context_for,
        role="test",
        on_change=(lambda old, new: changes.append((old, new))) if changes is not None else None,
        interval=0.05,
    )
    w.load()
    return w


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


def test_a_new_consistent_set_is_taken(certdir: Dir, ca: Issued) -> None:
    changes: list[tuple[Credentials, Credentials]] = []
    w = watcher(certdir, changes)
    first = w.current
    assert w.poll() is None  # nothing changed: a stat, no read
    cert, key = issue_server_cert(*ca, ["localhost"])
    certdir.write(None, (cert, key))
    assert w.poll() is Verdict.TAKE
    assert w.current.leaf.der == der(cert)
    assert w.current.serial != first.serial
    assert changes == [(first, w.current)]
    assert w.reloads == 1
    assert w.poll() is None


def test_a_half_written_file_is_ignored_with_one_warning_then_taken_when_whole(
    certdir: Dir, ca: Issued, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    w = watcher(certdir)
    old = w.current
    cert, key = issue_server_cert(*ca, ["localhost"])
    write_pem_key(certdir.files.key, key)
    certdir.files.cert.write_bytes(cert_pem(cert)[:200])  # a writer died half-way
    assert w.poll() is Verdict.WAIT
    assert warnings(caplog) == []
    assert w.poll() is Verdict.WARN
    assert w.poll() is None
    assert w.poll() is None
    [warned] = warnings(caplog)
    assert "ignored" in warned.getMessage()
    fields = warned.__dict__["fields"]
    assert fields["file"] == str(certdir.files.cert)
    assert "incomplete PEM" in fields["reason"]
    assert w.current is old  # the old set stays in use
    write_pem_cert(certdir.files.cert, cert)
    assert w.poll() is Verdict.TAKE
    assert w.current.leaf.der == der(cert)
    assert len(warnings(caplog)) == 1


def test_a_key_written_before_its_certificate_is_not_warned_about(
    certdir: Dir, ca: Issued, caplog: pytest.LogCaptureFixture
) -> None:
    w = watcher(certdir)
    cert, key = issue_server_cert(*ca, ["localhost"])
    write_pem_key(certdir.files.key, key)
    assert w.poll() is Verdict.WAIT  # new key, old certificate: mismatched for now
    write_pem_cert(certdir.files.cert, cert)
    assert w.poll() is Verdict.TAKE
    assert warnings(caplog) == []


def test_a_certificate_from_a_ca_not_in_the_bundle_is_not_taken(
    certdir: Dir, other_ca: Issued, caplog: pytest.LogCaptureFixture
) -> None:
    w = watcher(certdir)
    old = w.current
    certdir.write(None, issue_server_cert(*other_ca, ["localhost"]))
    assert w.poll() is Verdict.WAIT
    assert w.poll() is Verdict.WARN
    assert w.current is old
    [warned] = warnings(caplog)
    assert "does not verify against the CA bundle" in warned.__dict__["fields"]["reason"]
    # The bundle gains the other CA (a CA rotation): now the set is consistent.
    write_pem_cert(certdir.files.ca, other_ca[0])
    assert w.poll() is Verdict.TAKE
    assert [c.der for c in w.current.ca_certs] == [der(other_ca[0])]


def test_a_vanished_file_is_reported_and_the_set_in_use_kept(certdir: Dir) -> None:
    w = watcher(certdir)
    old = w.current
    certdir.files.key.unlink()
    assert w.poll() is Verdict.WAIT
    assert w.poll() is Verdict.WARN
    assert w.current is old


def test_start_up_refuses_an_unusable_set_naming_the_file(certdir: Dir, ca: Issued) -> None:
    _, other_key = issue_server_cert(*ca, ["localhost"])
    write_pem_key(certdir.files.key, other_key)
    w: CredentialsWatcher[ssl.SSLContext] = CredentialsWatcher(
        certdir.files, tls.server_context_for, role="test"
    )
    with pytest.raises(PKIError, match=rf"key-file {certdir.files.key}: the key does not match"):
        w.load()


def test_start_up_warns_about_a_set_peers_will_refuse_and_goes_on(
    certdir: Dir, other_ca: Issued, caplog: pytest.LogCaptureFixture
) -> None:
    certdir.write(None, issue_server_cert(*other_ca, ["localhost"]))
    w = watcher(certdir)
    assert w.current.issuer_ca is None
    [warned] = warnings(caplog)
    assert "will not be accepted" in warned.getMessage()


async def test_the_running_watcher_takes_a_change(certdir: Dir, ca: Issued) -> None:
    w = watcher(certdir)
    task = asyncio.create_task(w.run(), name="test-cert-reload")
    try:
        cert, key = issue_server_cert(*ca, ["localhost"])
        certdir.write(None, (cert, key))
        await eventually(
            lambda: w.current.leaf.der == der(cert), 5, what="the new certificate taken"
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# -- every new handshake uses the current set --------------------------------------------------


def creds_of(ca_certs: list[x509.Certificate], issued: Issued) -> Credentials:
    return load_credentials(
        PemSource("ca-file", "ca.crt", b"".join(cert_pem(c) for c in ca_certs)),
        PemSource("cert-file", "tls.crt", cert_pem(issued[0])),
        PemSource("key-file", "tls.key", key_pem(issued[1])),
        now=dt.datetime.now(dt.UTC),
    )


@contextlib.asynccontextmanager
async def echo_server(ctx: ssl.SSLContext) -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        except (ssl.SSLError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ssl.SSLError, OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=ctx)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def open_client(
    port: int, ctx: ssl.SSLContext
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """A connection (no SNI: an IP, as the agent dials) and the server certificate's serial."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=None), 10
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    return reader, writer, x509.load_der_x509_certificate(der).serial_number


async def round_trip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
    writer.write(b"ping\n")
    return await asyncio.wait_for(reader.readline(), 10)


async def close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ssl.SSLError, OSError):
        await writer.wait_closed()


async def test_new_handshakes_use_the_current_certificate_and_ca(
    ca: Issued, other_ca: Issued
) -> None:
    first = issue_server_cert(*ca, ["127.0.0.1"])
    agent = creds_of([ca[0]], issue_client_cert(*ca, "edge-1"))
    refusals: list[ssl.SSLError] = []
    listening = tls.server_context_for(creds_of([ca[0]], first), on_handshake_error=refusals.append)
    current = [tls.server_context_for(creds_of([ca[0]], first))]
    tls.follow_current(listening, lambda: current[0])
    client = tls.client_context_for(agent, server_hostname_check=False)

    async with echo_server(listening) as port:
        r1, w1, serial = await open_client(port, client)
        assert serial == first[0].serial_number
        assert await round_trip(r1, w1) == b"ping\n"

        # A renewed certificate from the same CA: new handshakes show it...
        second = issue_server_cert(*ca, ["127.0.0.1"])
        current[0] = tls.server_context_for(creds_of([ca[0]], second))
        r2, w2, serial = await open_client(port, client)
        assert serial == second[0].serial_number
        assert await round_trip(r2, w2) == b"ping\n"
        # ...and the connection made before goes on.
        assert await round_trip(r1, w1) == b"ping\n"

        # A new CA: the server's trust store changes with it, so the agent's certificate of
        # the old CA is refused at its next handshake, and the observer hears of it.
        third = issue_server_cert(*other_ca, ["127.0.0.1"])
        current[0] = tls.server_context_for(creds_of([other_ca[0]], third))
        trusting_both = tls.client_context_for(
            creds_of([ca[0], other_ca[0]], issue_client_cert(*ca, "edge-1")),
            server_hostname_check=False,
        )
        r3, w3, serial = await open_client(port, trusting_both)
        assert serial == third[0].serial_number  # TLS 1.3: our side completes first
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            line = await round_trip(r3, w3)
            if not line:
                raise ConnectionError("closed")
        await eventually(lambda: refusals, 5, what="the refusal observed")
        assert "certificate" in str(refusals[-1]).lower()
        # The connections made before the CA change are not cut by it.
        assert await round_trip(r1, w1) == b"ping\n"
        assert await round_trip(r2, w2) == b"ping\n"
        # An agent certificate of the new CA is accepted.
        new_agent = creds_of([other_ca[0]], issue_client_cert(*other_ca, "edge-1"))
        r4, w4, _ = await open_client(
            port, tls.client_context_for(new_agent, server_hostname_check=False)
        )
        assert await round_trip(r4, w4) == b"ping\n"
        for w in (w1, w2, w3, w4):
            await close(w)


async def test_the_front_context_follows_too_and_keeps_alpn(ca: Issued) -> None:
    first = issue_server_cert(*ca, ["127.0.0.1"])
    listening = tls.https_server_context_for(creds_of([ca[0]], first))
    listening.set_alpn_protocols(["http/1.1"])
    second = issue_server_cert(*ca, ["127.0.0.1"])
    renewed = tls.https_server_context_for(creds_of([ca[0]], second))
    renewed.set_alpn_protocols(["http/1.1"])
    tls.follow_current(listening, lambda: renewed)
    client = ssl.create_default_context(cadata=cert_pem(ca[0]).decode())
    client.check_hostname = False
    client.set_alpn_protocols(["http/1.1"])
    async with echo_server(listening) as port:
        reader, writer, serial = await open_client(port, client)
        assert serial == second[0].serial_number
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        assert await round_trip(reader, writer) == b"ping\n"
        await close(writer)


async def test_the_running_watcher_takes_a_renamed_in_file_of_equal_size_and_mtime(
    certdir: Dir, ca: Issued
) -> None:
    """The running watcher looks from a timer callback (ravenproxy.ticks): a key and
    certificate renamed into place with the old ones' sizes and mtimes are still taken (their
    inodes and ctimes differ), at the real 1 s interval."""
    w = watcher(certdir)
    w.interval = 1.0
    files = (certdir.files.key, certdir.files.cert)
    old = [path.stat() for path in files]
    for _ in range(50):  # ECDSA signatures vary in length: issue until one has the old size
        cert, key = issue_server_cert(*ca, ["localhost", "127.0.0.1"])
        if [len(key_pem(key)), len(cert_pem(cert))] == [st.st_size for st in old]:
            break
    else:
        pytest.skip("no certificate of the old size in 50 issues")
    task = asyncio.create_task(w.run(), name="test-cert-reload")
    try:
        await asyncio.sleep(0.3)
        for path, st, pem in zip(files, old, (key_pem(key), cert_pem(cert)), strict=True):
            staged = path.with_name(path.name + ".new")
            staged.write_bytes(pem)
            os.utime(staged, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(staged, path)
            new = path.stat()
            assert (new.st_size, new.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
        await eventually(lambda: w.current.leaf.der == der(cert), 5, what="the new certificate")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
