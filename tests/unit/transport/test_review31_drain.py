"""review31: ``drain_taken`` and ``untaken`` (loose, 500dfbf) where test_idle_drain.py does not
go, on real loopback connections, on asyncio's loop and on uvloop (the server's): the HTTPS
front's TLS transport (what ``get_extra_info("socket")`` is there; a slow TLS reader's progress
is seen, so it is not cut), a socket closed or reset before or during the probe (the ioctl on a
closed descriptor), and the drain cancelled from outside (server shutdown: it ends at once, its
watch left, no sweep holding it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from ravenproxy.pki.authority import generate_ca, issue_server_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from ravenproxy.server.accept import streams
from ravenproxy.transport.idle import IdleTimeout, IdleWatch, _Sweep, drain_taken, untaken
from ravenproxy.transport.socket_stream import SocketStream
from tests.unit.transport.test_idle_drain import _pair as _plain_pair

pytestmark = pytest.mark.timeout(60)

IDLE = 0.25
BIG = 512 * 1024

Runner = Callable[[Coroutine[Any, Any, Any]], Any]
RUNNERS = [pytest.param(asyncio.run, id="asyncio"), pytest.param(uvloop.run, id="uvloop")]


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context (the HTTPS front's role) and a client context trusting it."""
    tmp: Path = tmp_path_factory.mktemp("pki")
    ca, key = generate_ca("review31-ca")
    cert, cert_key = issue_server_cert(ca, key, ["front"])
    write_pem_cert(tmp / "ca.crt", ca)
    write_pem_cert(tmp / "s.crt", cert)
    write_pem_key(tmp / "s.key", cert_key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tmp / "s.crt", tmp / "s.key")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(tmp / "ca.crt")
    client.check_hostname = False
    return server, client


class _TlsClient:
    """A TLS client over a raw non-blocking socket (4 KiB receive buffer), TLS done in memory:
    what it reads off the socket, and when, is the test's (a library's client buffers a
    quarter megabyte of records whatever its reader takes)."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext) -> None:
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="front")

    async def handshake(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                data = await loop.sock_recv(self.sock, 4096)
                if not data:
                    raise ConnectionError("closed in the handshake") from None
                self.incoming.write(data)
        await self._flush()

    async def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def read_raw(self, size: int) -> int:
        """Take ``size`` bytes of records off the socket into TLS (plaintext dropped)."""
        data = await asyncio.get_running_loop().sock_recv(self.sock, size)
        self.incoming.write(data)
        with contextlib.suppress(ssl.SSLWantReadError):
            while self.tls.read(65536):
                pass
        return len(data)


@contextlib.asynccontextmanager
async def _tls_pair(
    server: ssl.SSLContext, client: ssl.SSLContext
) -> AsyncIterator[tuple[SocketStream, _TlsClient]]:
    """The HTTPS front's writer (``streams`` with a context, as the front accepts; 4 KiB send
    buffer) and a TLS client that reads its socket only when told."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setblocking(False)
    try:
        await loop.sock_connect(raw, listener.getsockname())
        conn, _ = await loop.sock_accept(listener)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        accepted = asyncio.ensure_future(streams(conn, server, limit=64 * 1024))
        peer = _TlsClient(raw, client)
        await peer.handshake()
        _, writer = await accepted
        try:
            yield writer, peer
        finally:
            writer.transport.abort()
    finally:
        raw.close()
        listener.close()


def _fill(writer: SocketStream) -> None:
    """Write as a relay does, a chunk at a time, until the writer is paused (a TLS
    transport passes one big write to its socket's transport at once, never paused)."""
    for _ in range(512):
        writer.write(b"x" * 16384)
        if writer.write_paused:
            return
    raise AssertionError("never paused")


async def _read_tls(peer: _TlsClient, pause: float, until: float) -> int:
    got = 0
    with contextlib.suppress(ConnectionError):
        while asyncio.get_running_loop().time() < until:
            got += await peer.read_raw(2048)
            await asyncio.sleep(pause)
    return got


@pytest.mark.parametrize("run", RUNNERS)
def test_a_tls_client_that_reads_steadily_is_waited_for(
    run: Runner, contexts: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    """The HTTPS front: its transport is TLS over the socket; the untaken bytes it reports
    fall as the client reads (its socket is found: the kernel's queue counted), so a client
    reading 2 KiB every 0.05 s through many timeouts' worth of answer gets it whole."""

    async def main() -> tuple[bool, int, float]:
        async with _tls_pair(*contexts) as (writer, peer):
            sock = writer.transport.get_extra_info("socket")
            _fill(writer)
            loop = asyncio.get_running_loop()
            reading = asyncio.create_task(_read_tls(peer, 0.05, loop.time() + 40))
            started = time.monotonic()
            try:
                watch = IdleWatch(IDLE)
                async with watch:
                    await drain_taken(writer, watch)
                took = time.monotonic() - started
            finally:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)
            return sock is not None, untaken(writer.transport), took

    has_socket, left, took = run(main())
    assert has_socket  # the TLS transport names its socket: TIOCOUTQ is asked
    assert took > 2 * IDLE  # it did wait through several timeouts (no IdleTimeout raised)
    assert left >= 0


@pytest.mark.parametrize("run", RUNNERS)
def test_a_tls_client_that_stops_is_cut(
    run: Runner, contexts: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    async def main() -> float:
        async with _tls_pair(*contexts) as (writer, _peer):
            _fill(writer)
            started = time.monotonic()
            watch = IdleWatch(IDLE)
            with pytest.raises(IdleTimeout):
                async with watch:
                    await drain_taken(writer, watch)
            return time.monotonic() - started

    took = run(main())
    assert IDLE * 0.8 <= took <= IDLE * 8


@pytest.mark.parametrize("run", RUNNERS)
@pytest.mark.parametrize("how", ["aborted", "socket closed"])
def test_untaken_of_a_closed_connection_is_its_buffer(run: Runner, how: str) -> None:
    """The ioctl on a closed descriptor (fileno -1, or a closed socket object) raises nothing:
    what the transport still holds is the answer."""

    async def main() -> int:
        async with _plain_pair() as (writer, peer):
            writer.write(b"x" * BIG)
            await asyncio.sleep(0.05)
            if how == "aborted":
                writer.transport.abort()
                await asyncio.sleep(0)
            else:
                peer.close()
            return untaken(writer.transport)

    assert 0 <= run(main()) <= BIG


@pytest.mark.parametrize("run", RUNNERS)
def test_a_reset_during_the_drain_ends_it_at_once(run: Runner) -> None:
    """The client resets (RST) while the drain probes: the drain ends with the connection's
    error (or returns), long before an idle timeout, not an IdleTimeout."""

    async def main() -> tuple[float, BaseException | None]:
        async with _plain_pair() as (writer, peer):
            writer.write(b"x" * BIG)
            watch = IdleWatch(5.0)  # probes every 0.625 s; the reset comes first

            async def reset() -> None:
                await asyncio.sleep(0.1)
                peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
                peer.close()

            resetting = asyncio.create_task(reset())
            started = time.monotonic()
            error: BaseException | None = None
            try:
                async with watch:
                    await drain_taken(writer, watch)
            except (ConnectionError, OSError) as exc:
                error = exc
            await resetting
            return time.monotonic() - started, error

    took, error = run(main())
    assert took < 2.0, took
    assert not isinstance(error, IdleTimeout)


@pytest.mark.parametrize("run", RUNNERS)
def test_a_drain_cancelled_from_outside_ends_at_once_and_leaves_its_watch(run: Runner) -> None:
    """Server shutdown cancels the task of a client that drains slowly: the cancel goes
    through (not turned into a TimeoutError or an IdleTimeout), at once, and no sweep keeps
    the watch."""

    async def main() -> tuple[bool, float, bool]:
        async with _plain_pair() as (writer, _peer):
            writer.write(b"x" * BIG)
            watch = IdleWatch(IDLE)

            async def drains() -> None:
                async with watch:
                    await drain_taken(writer, watch)

            task = asyncio.create_task(drains())
            await asyncio.sleep(IDLE / 8 * 1.5)  # a probe has run: inside the next one
            task.cancel()
            started = time.monotonic()
            await asyncio.gather(task, return_exceptions=True)
            took = time.monotonic() - started
            held = any(watch in sweep.watches for sweep in _Sweep._all.values())
            return task.cancelled(), took, held

    cancelled, took, held = run(main())
    assert cancelled
    assert took < 0.2
    assert not held
