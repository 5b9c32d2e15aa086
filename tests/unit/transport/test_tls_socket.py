"""The tunnel's TLS transport over a non-blocking SSLSocket
(:mod:`ravenproxy.transport.tls_socket`), on loopback with the tunnel's real mutual TLS: large
transfers both ways checked by SHA-256 (with a read buffer smaller than a record, so decrypted
bytes wait in OpenSSL), partial writes and flow control, pausing and resuming reads,
close_notify, abort, EOF and a reset from the peer, the handshake's timeout and refusal; under
asyncio's loop and uvloop. The peer is either the same transport or a plain blocking SSLSocket
in a thread, which tells a close_notify from a bare FIN (``suppress_ragged_eofs=False``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import ssl
import struct
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from ravenproxy.pki import init_pki
from ravenproxy.transport import tls_socket
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.tls_handshake import handshake, open_client
from ravenproxy.transport.tls_socket import TLSSocketTransport

WAIT = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path, agents=["edge-1"])
    return path


def contexts(pki: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    srv = server_context(pki / "ca.crt", pki / "server.crt", pki / "server.key")
    cli = client_context(pki / "ca.crt", pki / "edge-1.crt", pki / "edge-1.key")
    return srv, cli


class Recorder(asyncio.BufferedProtocol):
    """Hashes what it receives; records EOF, loss, and write pauses."""

    def __init__(self, bufsize: int = 64 * 1024, keep_open: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self.buf = bytearray(bufsize)
        self.sha = hashlib.sha256()
        self.received = 0
        self.keep_open = keep_open
        self.transport: TLSSocketTransport | None = None
        self.eof = loop.create_future()
        self.lost: asyncio.Future[Exception | None] = loop.create_future()
        self.lost_calls = 0
        self.pauses = 0
        self.resumed = asyncio.Event()
        self.reached: list[tuple[int, asyncio.Future[None]]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, TLSSocketTransport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buf)

    def buffer_updated(self, nbytes: int) -> None:
        self.sha.update(memoryview(self.buf)[:nbytes])
        self.received += nbytes
        for count, fut in self.reached:
            if self.received >= count and not fut.done():
                fut.set_result(None)

    def eof_received(self) -> bool:
        self.eof.set_result(None)
        return self.keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost_calls += 1
        if not self.lost.done():
            self.lost.set_result(exc)

    def pause_writing(self) -> None:
        self.pauses += 1
        self.resumed.clear()

    def resume_writing(self) -> None:
        self.resumed.set()

    async def until(self, count: int) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.reached.append((count, fut))
        self.buffer_updated(0)
        await asyncio.wait_for(fut, WAIT)


async def pair(
    pki: Path, server_buf: int = 64 * 1024, client_buf: int = 64 * 1024
) -> tuple[Recorder, Recorder]:
    """A connected client and server, each a TLSSocketTransport with a Recorder."""
    loop = asyncio.get_running_loop()
    srv_ctx, cli_ctx = contexts(pki)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    try:

        async def accept() -> Recorder:
            raw, _ = await loop.sock_accept(listener)
            sock = srv_ctx.wrap_socket(
                raw, server_side=True, do_handshake_on_connect=False, suppress_ragged_eofs=False
            )
            try:
                await handshake(sock, WAIT)
            except BaseException:
                sock.close()
                raise
            proto = Recorder(server_buf)
            TLSSocketTransport(loop, sock, proto)
            return proto

        port = listener.getsockname()[1]
        accepted = asyncio.create_task(accept(), name="test-accept")
        try:
            _, client = await open_client(
                lambda: Recorder(client_buf),
                "127.0.0.1",
                port,
                ssl_context=cli_ctx,
                server_hostname="127.0.0.1",
                handshake_timeout=WAIT,
            )
        except BaseException:
            accepted.cancel()
            with contextlib.suppress(BaseException):
                (await accepted).transport.abort()  # type: ignore[union-attr]
            raise
        server = await accepted
    finally:
        listener.close()
    assert isinstance(client, Recorder)
    return client, server


@contextlib.asynccontextmanager
async def connected(pki: Path, **kwargs: int) -> AsyncIterator[tuple[Recorder, Recorder]]:
    client, server = await pair(pki, **kwargs)
    try:
        yield client, server
    finally:
        for side in (client, server):
            assert side.transport is not None
            side.transport.abort()
            await asyncio.wait_for(side.lost, WAIT)
            assert side.lost_calls == 1


def blob(size: int) -> bytes:
    return os.urandom(size)


async def send_all(transport: TLSSocketTransport, proto: Recorder, data: bytes, piece: int) -> None:
    """Write ``data`` in pieces, waiting while the transport's buffer is above its limit."""
    view = memoryview(data)
    for at in range(0, len(data), piece):
        transport.write(view[at : at + piece])
        if transport.get_write_buffer_size() > transport.get_write_buffer_limits()[1]:
            await asyncio.wait_for(proto.resumed.wait(), WAIT)


async def test_large_transfers_both_ways_arrive_whole(pki: Path) -> None:
    # The client reads in 1000-byte buffers: smaller than a record, so the rest of each record
    # waits decrypted in OpenSSL (no readiness event) and must still be read.
    async with connected(pki, client_buf=1000, server_buf=256 * 1024) as (client, server):
        assert client.transport is not None and server.transport is not None
        up, down = blob(24 * 1024 * 1024 + 7), blob(8 * 1024 * 1024 + 3)
        await asyncio.gather(
            send_all(client.transport, client, up, 1024 * 1024),
            send_all(server.transport, server, down, 100_000),
            server.until(len(up)),
            client.until(len(down)),
        )
        assert server.received == len(up)
        assert server.sha.hexdigest() == hashlib.sha256(up).hexdigest()
        assert client.received == len(down)
        assert client.sha.hexdigest() == hashlib.sha256(down).hexdigest()


async def test_writelines_keeps_order_and_small_pieces(pki: Path) -> None:
    async with connected(pki) as (client, server):
        assert client.transport is not None
        pieces = [struct.pack("!I", i) * (i % 7 + 1) for i in range(5000)]
        pieces[100] = blob(3 * 1024 * 1024)
        client.transport.writelines([bytearray(p) if i % 2 else p for i, p in enumerate(pieces)])
        whole = b"".join(pieces)
        await server.until(len(whole))
        assert server.sha.hexdigest() == hashlib.sha256(whole).hexdigest()


async def test_a_stalled_reader_pauses_the_writer_and_resuming_drains_it(pki: Path) -> None:
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        server.transport.pause_reading()
        assert not server.transport.is_reading()
        client.transport.set_write_buffer_limits(high=256 * 1024)
        data = blob(1024 * 1024)
        for _ in range(16):  # far more than the socket buffers hold
            client.transport.write(data)
        # The socket took what it could: the rest is queued (partial writes) and the writer
        # was paused once.
        await asyncio.sleep(0.2)
        assert client.pauses == 1
        queued = client.transport.get_write_buffer_size()
        assert queued > 256 * 1024
        held = server.received
        await asyncio.sleep(0.1)
        assert server.received == held  # paused: nothing delivered
        server.transport.resume_reading()
        await server.until(16 * len(data))
        await asyncio.wait_for(client.resumed.wait(), WAIT)
        assert client.transport.get_write_buffer_size() == 0
        assert server.sha.hexdigest() == hashlib.sha256(data * 16).hexdigest()


async def test_a_read_or_flush_leaves_the_registration_update_io_would_make(
    pki: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # _read, _flush and a write straight to SSL_write skip _update_io when it would change
    # nothing: after each, a full _update_io must find the loop's registration already right
    # (partial writes, a paused reader, resuming, small messages both ways).
    misses: list[tuple[str, bool, bool]] = []
    update_io = TLSSocketTransport._update_io

    def checked(original: Callable[..., None]) -> Any:
        def run(self: TLSSocketTransport, *args: bool) -> None:  # _read(True): readiness
            original(self, *args)
            before = (self._reader, self._writer)
            update_io(self)
            if (self._reader, self._writer) != before:
                misses.append((original.__name__, *before))

        return run

    monkeypatch.setattr(TLSSocketTransport, "_read", checked(TLSSocketTransport._read))
    monkeypatch.setattr(TLSSocketTransport, "_flush", checked(TLSSocketTransport._flush))
    monkeypatch.setattr(TLSSocketTransport, "write", checked(TLSSocketTransport.write))
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        for i in range(20):  # small messages both ways
            client.transport.write(b"q" * (i + 1))
            await server.until(sum(range(1, i + 2)))
            server.transport.write(b"a")
            await client.until(i + 1)
        server.transport.pause_reading()
        data = blob(1024 * 1024)
        for _ in range(8):  # more than the sockets hold: partial writes, a writer in place
            client.transport.write(data)
        await asyncio.sleep(0.1)
        assert client.transport.get_write_buffer_size() > 0
        server.transport.resume_reading()
        await server.until(sum(range(1, 21)) + 8 * len(data))
        assert client.transport.get_write_buffer_size() == 0
    assert not misses


async def test_resume_reads_bytes_openssl_already_decrypted(pki: Path) -> None:
    # A 1000-byte buffer, paused after the first read: the record's rest is in OpenSSL, not in
    # the socket, so only resume_reading itself can deliver it.
    async with connected(pki, server_buf=1000) as (client, server):
        assert client.transport is not None and server.transport is not None
        transport = server.transport
        first = asyncio.get_running_loop().create_future()
        updated = server.buffer_updated

        def pause_after_first(nbytes: int) -> None:
            updated(nbytes)
            if not first.done():
                transport.pause_reading()
                first.set_result(None)

        server.buffer_updated = pause_after_first  # type: ignore[method-assign]
        transport.set_protocol(server)  # its read methods are bound as it is set (as uvloop's)
        data = blob(16000)  # one record
        client.transport.write(data)
        await asyncio.wait_for(first, WAIT)
        await asyncio.sleep(0.1)
        assert server.received == 1000
        transport.resume_reading()
        await server.until(len(data))
        assert server.sha.hexdigest() == hashlib.sha256(data).hexdigest()


async def test_records_larger_and_smaller_than_the_buffer_all_arrive(pki: Path) -> None:
    # A 1000-byte buffer and a burst of records around its size, the last one larger: a read
    # that fills the buffer leaves the record's rest in OpenSSL, which no readiness announces
    # (the next round, or the next loop turn, must read it); a short read ends the record, and
    # the next one waits in the socket. Nothing follows the last record: its rest must come
    # out of OpenSSL by itself.
    async with connected(pki, server_buf=1000) as (client, server):
        assert client.transport is not None
        sizes = [16000, 999, 1000, 1001, 1, 5000, 3, 1999, 16000]
        data = blob(sum(sizes))
        at = 0
        for size in sizes:  # one write, one record each
            client.transport.write(data[at : at + size])
            at += size
        await server.until(len(data))
        assert server.sha.hexdigest() == hashlib.sha256(data).hexdigest()


async def test_close_sends_close_notify_after_the_queued_data_and_the_peer_closes(
    pki: Path,
) -> None:
    async with connected(pki) as (client, server):
        assert client.transport is not None
        data = blob(5 * 1024 * 1024)
        client.transport.write(data)
        client.transport.close()
        assert client.transport.is_closing()
        client.transport.write(b"dropped")  # after close: dropped, as asyncio's transports do
        # The peer reads everything, then the close_notify (eof_received; it closes in turn).
        await asyncio.wait_for(server.eof, WAIT)
        assert server.received == len(data)
        assert server.sha.hexdigest() == hashlib.sha256(data).hexdigest()
        assert await asyncio.wait_for(server.lost, WAIT) is None
        assert await asyncio.wait_for(client.lost, WAIT) is None


def threaded_peer(
    pki: Path, act: Callable[[ssl.SSLSocket], Any]
) -> tuple[int, threading.Thread, list[Any]]:
    """A blocking TLS server in a thread: accepts one connection, runs ``act`` on it, closes;
    what ``act`` returned (or raised) lands in the list."""
    srv, _ = contexts(pki)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(WAIT)
    out: list[Any] = []

    def run() -> None:
        try:
            raw, _ = listener.accept()
            raw.settimeout(WAIT)
            with srv.wrap_socket(raw, server_side=True, suppress_ragged_eofs=False) as sock:
                out.append(act(sock))
        except Exception as exc:
            out.append(exc)
        finally:
            listener.close()

    thread = threading.Thread(target=run, name="test-tls-peer")
    thread.start()
    return listener.getsockname()[1], thread, out


async def dial(pki: Path, port: int, bufsize: int = 64 * 1024) -> Recorder:
    _, cli = contexts(pki)
    _, proto = await open_client(
        lambda: Recorder(bufsize),
        "127.0.0.1",
        port,
        ssl_context=cli,
        server_hostname="127.0.0.1",
        handshake_timeout=WAIT,
    )
    assert isinstance(proto, Recorder)
    return proto


def read_to_end(sock: ssl.SSLSocket) -> tuple[str, bytes]:
    """Everything until a close_notify (``clean``) or a bare FIN / reset (``ragged``)."""
    got = bytearray()
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except (ssl.SSLEOFError, ConnectionResetError):
        return "ragged", bytes(got)
    return "clean", bytes(got)


async def test_close_is_a_close_notify_and_abort_is_not(pki: Path) -> None:
    for how, expected in (("close", "clean"), ("abort", "ragged")):
        port, thread, out = threaded_peer(pki, read_to_end)
        try:
            client = await dial(pki, port)
            assert client.transport is not None
            client.transport.write(b"hello")
            if how == "close":
                client.transport.close()
            else:
                await asyncio.sleep(0.2)  # the peer has read the data
                client.transport.abort()
            assert await asyncio.wait_for(client.lost, WAIT) is None
            assert client.lost_calls == 1
        finally:
            await asyncio.to_thread(thread.join, WAIT)
        assert out == [(expected, b"hello")], how


async def test_the_peers_close_notify_is_eof_then_the_connection_closes(pki: Path) -> None:
    def say_and_close(sock: ssl.SSLSocket) -> bytes:
        sock.sendall(b"x" * 100_000)
        sock.unwrap()  # close_notify, and waits for ours
        return b"unwrapped"

    port, thread, out = threaded_peer(pki, say_and_close)
    try:
        client = await dial(pki, port)
        await asyncio.wait_for(client.eof, WAIT)
        assert client.received == 100_000
        assert await asyncio.wait_for(client.lost, WAIT) is None
        await asyncio.sleep(0)
        assert client.lost_calls == 1
    finally:
        await asyncio.to_thread(thread.join, WAIT)
    assert out == [b"unwrapped"]  # our close_notify answered the peer's


async def test_eof_kept_open_waits_for_the_protocols_close(pki: Path) -> None:
    def half(sock: ssl.SSLSocket) -> tuple[str, bytes]:
        sock.sendall(b"ping")
        socket.socket.shutdown(sock, socket.SHUT_WR)  # a bare FIN, no close_notify
        return read_to_end(sock)

    port, thread, out = threaded_peer(pki, half)
    try:
        client = await dial(pki, port)
        client.keep_open = True
        await asyncio.wait_for(client.eof, WAIT)
        assert client.received == 4
        assert client.transport is not None
        await asyncio.sleep(0.1)
        assert not client.transport.is_closing()
        assert not client.lost.done()
        # OpenSSL takes no more writes after a bare FIN (its session is over): close ends it.
        client.transport.close()
        assert await asyncio.wait_for(client.lost, WAIT) is None
        assert client.lost_calls == 1
    finally:
        await asyncio.to_thread(thread.join, WAIT)
    # The peer sees the end (OpenSSL 3 answered its bare FIN with a decode_error alert).
    assert len(out) == 1 and (isinstance(out[0], ssl.SSLError) or out[0][1] == b"")


async def test_a_reset_from_the_peer_is_connection_lost_with_the_error(pki: Path) -> None:
    def reset(sock: ssl.SSLSocket) -> None:
        sock.recv(10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    port, thread, out = threaded_peer(pki, reset)
    try:
        client = await dial(pki, port)
        assert client.transport is not None
        client.transport.write(b"hi")
        # A reset reads as the end of the stream (OpenSSL reports no error for it), or as
        # the error itself: either way the connection ends, once.
        exc = await asyncio.wait_for(client.lost, WAIT)
        assert exc is None or isinstance(exc, ConnectionResetError)
        assert client.lost_calls == 1
        assert client.transport.is_closing()
    finally:
        await asyncio.to_thread(thread.join, WAIT)
    assert out == [None]


async def test_writing_to_a_reset_connection_ends_it_once(pki: Path) -> None:
    def reset(sock: ssl.SSLSocket) -> None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    port, thread, _ = threaded_peer(pki, reset)
    try:
        client = await dial(pki, port)
        assert client.transport is not None
        client.transport.pause_reading()  # learn of the reset by writing only
        await asyncio.to_thread(thread.join, WAIT)
        data = blob(1024 * 1024)
        for _ in range(8):
            client.transport.write(data)
            await asyncio.sleep(0.01)
        exc = await asyncio.wait_for(client.lost, WAIT)
        assert isinstance(exc, OSError)
        assert client.lost_calls == 1
        assert client.transport.is_closing()
    finally:
        await asyncio.to_thread(thread.join, WAIT)


async def test_after_the_close_no_read_or_write_reaches_the_next_socket_on_its_number(
    pki: Path,
) -> None:
    # The transport calls the TLS object's C read() and write() (not the SSLSocket's
    # wrappers); they act on the socket's number even once the socket is closed, and the
    # next socket may take that number. Closing drops the queue and the registrations, so no
    # read or flush runs after it today; should one ever, it must fail on the closed socket,
    # not write to (or read from) another connection.
    async with connected(pki) as (client, _server):
        transport = client.transport
        assert transport is not None
        fd = transport._fd
        mine, theirs = socket.socketpair()
        transport.abort()
        taken = []  # the lowest free numbers, up to the transport's old one
        while not taken or taken[-1] < fd:
            taken.append(os.dup(mine.fileno()))
        try:
            assert taken[-1] == fd, "the old number was not free: the test cannot tell"
            theirs.sendall(b"not for the tunnel")
            transport._queue.append(b"for the closed tunnel")
            transport._flush()
            transport._read(False)
            theirs.setblocking(False)
            with pytest.raises(BlockingIOError):
                theirs.recv(100)  # nothing written to the socket on the old number
            assert mine.recv(100) == b"not for the tunnel"  # nor read from it
        finally:
            for n in taken:
                os.close(n)
            mine.close()
            theirs.close()


async def test_extra_info_names_the_peer_and_the_tls_session(pki: Path) -> None:
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        info = server.transport.get_extra_info
        assert info("peername") == client.transport.get_extra_info("sockname")
        assert isinstance(info("ssl_object"), ssl.SSLSocket)
        assert info("cipher")[1] == "TLSv1.3"
        assert dict(x[0] for x in info("peercert")["subject"])["commonName"]
        assert info("sslcontext") is info("ssl_object").context
        assert info("nothing", 7) == 7


async def test_the_handshake_times_out_against_a_silent_server() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        ctx = ssl.create_default_context()
        with pytest.raises(TimeoutError):
            await open_client(
                asyncio.Protocol,
                "127.0.0.1",
                listener.getsockname()[1],
                ssl_context=ctx,
                server_hostname="127.0.0.1",
                handshake_timeout=0.3,
            )
    finally:
        listener.close()


async def test_a_refused_dial_raises_connection_refused() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(ConnectionRefusedError):
        await open_client(
            asyncio.Protocol,
            "127.0.0.1",
            port,
            ssl_context=ssl.create_default_context(),
            server_hostname="127.0.0.1",
            handshake_timeout=WAIT,
        )


async def test_a_refused_handshake_is_reported_to_the_observer(pki: Path) -> None:
    loop = asyncio.get_running_loop()
    srv, _ = contexts(pki)
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # trusts the CA, presents no certificate
    anonymous.load_verify_locations(pki / "ca.crt")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    seen: list[ssl.SSLError] = []

    async def accept() -> None:
        raw, _ = await loop.sock_accept(listener)
        sock = srv.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        try:
            await handshake(sock, WAIT, on_error=seen.append)
        finally:
            sock.close()

    try:
        server = asyncio.create_task(accept(), name="test-accept")
        # TLS 1.3: the client's side completes; the refusal arrives as an alert after it.
        with contextlib.suppress(ssl.SSLError, ConnectionError, TimeoutError):
            _, proto = await open_client(
                Recorder,
                "127.0.0.1",
                listener.getsockname()[1],
                ssl_context=anonymous,
                server_hostname="127.0.0.1",
                handshake_timeout=WAIT,
            )
            assert isinstance(proto, Recorder)
            await asyncio.wait_for(proto.lost, WAIT)
        with pytest.raises(ssl.SSLError):
            await server
    finally:
        listener.close()
    assert len(seen) == 1
    assert "certificate" in str(seen[0]).lower()


def test_a_transfer_and_close_under_uvloop(pki: Path) -> None:
    async def main() -> None:
        async with connected(pki, client_buf=1000) as (client, server):
            assert client.transport is not None and server.transport is not None
            data = blob(16 * 1024 * 1024)
            await asyncio.gather(
                send_all(server.transport, server, data, 1024 * 1024),
                client.until(len(data)),
            )
            assert client.sha.hexdigest() == hashlib.sha256(data).hexdigest()
            client.transport.close()
            await asyncio.wait_for(server.eof, WAIT)
            assert await asyncio.wait_for(client.lost, WAIT) is None

    uvloop.run(main())


def test_shutdown_is_bounded(monkeypatch: pytest.MonkeyPatch, pki: Path) -> None:
    """A peer that never reads nor closes: close() ends the connection after SHUTDOWN_TIMEOUT."""
    monkeypatch.setattr(tls_socket, "SHUTDOWN_TIMEOUT", 0.5)

    async def main() -> None:
        async with connected(pki) as (client, server):
            assert client.transport is not None and server.transport is not None
            server.transport.pause_reading()
            data = blob(1024 * 1024)
            for _ in range(16):
                client.transport.write(data)
            client.transport.close()
            assert await asyncio.wait_for(client.lost, WAIT) is None

    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    run(main())
