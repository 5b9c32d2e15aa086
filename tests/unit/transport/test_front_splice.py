"""The server front's splice of a client socket to a tunnel stream by callbacks
(:class:`~ravenproxy.transport.front_splice.FrontSplice`, what :func:`splice_or_relay` runs for a
front's :class:`SocketStream` and a tunnel stream): the relay's rules kept — bytes both ways
past the window, what was read before on either side, half-close both ways, --idle-timeout, a
half-closed client that resets, a reset stream, cancellation. (The client reset while its upload
waits for credit: test_relay's test, run for the splice too.)"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ravenproxy.pki.authority import generate_ca, issue_server_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from ravenproxy.transport import front_splice as splice_module
from ravenproxy.transport.bytestream import READ_LIMIT, TunnelByteStream
from ravenproxy.transport.front_splice import splice_or_relay
from ravenproxy.transport.lender import LEND_IDLE
from ravenproxy.transport.relay import CREDIT_PROBE, IDLE_ERROR, RelayResult
from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.transport.socket_stream import SocketStream
from tests.unit.transport.test_relay import accepting
from tests.unit.transport.test_session import TARGET, WAIT, StreamHandler, echo, tunnel


class Front:
    """A client socket accepted by a front and spliced to a stream through the tunnel."""

    def __init__(
        self, client: socket.socket, sock: SocketStream, task: asyncio.Task[RelayResult]
    ) -> None:
        self.client = client
        self.sock = sock
        self.task = task

    async def result(self) -> RelayResult:
        return await asyncio.wait_for(asyncio.shield(self.task), WAIT)


@contextlib.asynccontextmanager
async def front(
    on_open: StreamHandler = echo,
    *,
    idle_timeout: float | None = None,
    initial_up: bytes = b"",
    initial_down: bytes = b"",
    clients: int = 1,
) -> AsyncIterator[list[Front]]:
    async with tunnel(on_open) as t, accepting("socketstream") as (port, accepted):
        fronts: list[Front] = []
        try:
            for _ in range(clients):
                client = socket.create_connection(("127.0.0.1", port))
                client.setblocking(False)
                sock, _writer = await asyncio.wait_for(accepted.get(), WAIT)
                assert type(sock) is SocketStream
                stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
                splice = splice_or_relay(
                    TunnelByteStream(stream),
                    sock,
                    sock,
                    initial_up=initial_up,
                    initial_down=initial_down,
                    idle_timeout=idle_timeout,
                )
                assert splice.__qualname__ == "Splice.wait"  # spliced, not relayed
                fronts.append(Front(client, sock, asyncio.create_task(splice)))
            yield fronts
        finally:
            for f in fronts:
                f.client.close()
                if not f.task.done():
                    f.task.cancel()
                await asyncio.gather(f.task, return_exceptions=True)


async def recv_all(client: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while data := await asyncio.wait_for(loop.sock_recv(client, 1 << 16), WAIT):
        out += data
    return bytes(out)


async def test_bulk_both_ways_with_initial_bytes_and_half_close() -> None:
    """8 MiB up and its digest plus 8 MiB down, past the stream window both ways, with bytes
    read before on each side (a CONNECT's pipelined first bytes, a 101's target bytes): every
    byte in order, the client's EOF reaches the target, whose answer after it still comes back,
    and the splice ends cleanly with the byte counts the metrics use."""
    payload = os.urandom(8 << 20)

    async def digest_then_send(stream: TunnelStream) -> None:
        stream.accept()
        h = hashlib.sha256()
        while data := await stream.read():
            h.update(data)
        await stream.write(h.digest() + payload)
        stream.write_eof()
        with contextlib.suppress(StreamClosedError):
            await stream.read()

    async with front(digest_then_send, initial_up=b"init", initial_down=b"down") as (f,):
        loop = asyncio.get_running_loop()
        upload = os.urandom(8 << 20)
        received = asyncio.create_task(recv_all(f.client))
        await asyncio.wait_for(loop.sock_sendall(f.client, upload), WAIT)
        f.client.shutdown(socket.SHUT_WR)
        data = await asyncio.wait_for(received, WAIT)
        assert data[:4] == b"down"
        assert data[4:36] == hashlib.sha256(b"init" + upload).digest()
        assert data[36:] == payload
        result = await f.result()
        assert (result.error, result.idle) == ("", False)
        assert (result.bytes_up, result.bytes_down) == (4 + len(upload), len(data))


async def test_small_exchanges_on_one_spliced_connection() -> None:
    async with front() as (f,):
        loop = asyncio.get_running_loop()
        for i in range(50):
            message = b"request %d" % i
            await loop.sock_sendall(f.client, message)
            got = b""
            while len(got) < len(message):
                got += await asyncio.wait_for(loop.sock_recv(f.client, 1024), WAIT)
            assert got == message


async def test_idle_timeout_closes_an_idle_splice_not_a_busy_one() -> None:
    async with front(idle_timeout=0.3, clients=2) as (idle, busy):
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            await loop.sock_sendall(busy.client, b"x")
            assert await asyncio.wait_for(loop.sock_recv(busy.client, 1), WAIT) == b"x"
            await asyncio.sleep(0.1)
        result = await idle.result()
        assert (result.error, result.idle) == (IDLE_ERROR, True)
        assert not busy.task.done()
        with contextlib.suppress(ConnectionError):  # closed (aborted) for idleness
            assert await asyncio.wait_for(loop.sock_recv(idle.client, 1), WAIT) == b""


async def test_a_half_closed_client_that_resets_while_the_target_is_silent_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the relay: the request, the client's half-close, then its reset while the target has
    not answered: noticed within a few looks at the socket, the stream reset."""
    monkeypatch.setattr(splice_module, "CREDIT_PROBE", 0.1)
    streams: asyncio.Queue[TunnelStream] = asyncio.Queue()
    release = asyncio.Event()

    async def silent(stream: TunnelStream) -> None:
        stream.accept()
        await streams.put(stream)
        await release.wait()

    async with front(silent) as (f,):
        try:
            await asyncio.get_running_loop().sock_sendall(f.client, b"request")
            f.client.shutdown(socket.SHUT_WR)
            agent_stream = await asyncio.wait_for(streams.get(), WAIT)
            await asyncio.sleep(0.3)  # the splice waits for the answer now
            assert not f.task.done()
            f.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            f.client.close()  # RST
            result = await f.result()
            assert "client connection gone while not read" in result.error, result
            assert result.bytes_up == len(b"request")
            with pytest.raises(StreamClosedError):
                while await asyncio.wait_for(agent_stream.read(), WAIT):
                    pass
        finally:
            release.set()


async def test_a_stream_reset_ends_it_while_the_client_is_silent() -> None:
    streams: asyncio.Queue[TunnelStream] = asyncio.Queue()

    async def hold(stream: TunnelStream) -> None:
        stream.accept()
        await streams.put(stream)
        with contextlib.suppress(StreamClosedError):
            await stream.read()

    async with front(hold) as (f,):
        agent_stream = await asyncio.wait_for(streams.get(), WAIT)
        agent_stream.reset()
        result = await f.result()
        assert result.error.startswith("CANCEL"), result
        with contextlib.suppress(ConnectionError):
            assert await recv_all(f.client) == b""


async def test_cancelling_it_stays_a_cancellation_and_closes_both_ends() -> None:
    """Server shutdown: the connection's task is cancelled while it awaits the splice."""
    streams: asyncio.Queue[TunnelStream] = asyncio.Queue()

    async def hold(stream: TunnelStream) -> None:
        stream.accept()
        await streams.put(stream)
        with contextlib.suppress(StreamClosedError):
            while await stream.read():
                pass

    async with front(hold) as (f,):
        agent_stream = await asyncio.wait_for(streams.get(), WAIT)
        await asyncio.sleep(0.05)
        f.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await f.task
        with contextlib.suppress(ConnectionError):
            assert await recv_all(f.client) == b""
        with pytest.raises(StreamClosedError):
            while await asyncio.wait_for(agent_stream.read(), WAIT):
                pass


async def test_a_tls_client_closing_while_its_upload_waits_for_credit_still_gets_it_all_up(
    tmp_path: Path,
) -> None:
    """A TLS front's client (no half-close: its close_notify closes the transport, a clean
    connection_lost) sends more than the stream's window and closes while the rest waits for
    credit: what the socket still holds, and the EOF, go up once credit comes (as the relay
    reads them), not lost with the splice hanging until the idle timeout."""
    ca, key = generate_ca("test-front-ca")
    cert, cert_key = issue_server_cert(ca, key, ["front"])
    write_pem_cert(tmp_path / "ca.crt", ca)
    write_pem_cert(tmp_path / "s.crt", cert)
    write_pem_key(tmp_path / "s.key", cert_key)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(tmp_path / "ca.crt")
    upload = os.urandom(512 * 1024)  # past the initial 256 KiB window
    release = asyncio.Event()
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def slow_reader(stream: TunnelStream) -> None:
        stream.accept()
        await release.wait()
        data = bytearray()
        with contextlib.suppress(StreamClosedError):
            while chunk := await stream.read():
                data += chunk
        await got.put(bytes(data))

    accepted: asyncio.Queue[SocketStream] = asyncio.Queue()

    def made() -> SocketStream:
        sock = SocketStream(READ_LIMIT)
        accepted.put_nowait(sock)
        return sock

    loop = asyncio.get_running_loop()
    server = await loop.create_server(made, "127.0.0.1", 0, ssl=server_ctx)
    task: asyncio.Task[RelayResult] | None = None
    try:
        async with tunnel(slow_reader) as t:
            port = server.sockets[0].getsockname()[1]
            _r, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="front"),
                WAIT,
            )
            sock = await asyncio.wait_for(accepted.get(), WAIT)
            stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
            task = asyncio.create_task(splice_or_relay(TunnelByteStream(stream), sock, sock))
            writer.write(upload)
            await asyncio.wait_for(writer.drain(), WAIT)
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await asyncio.wait_for(writer.wait_closed(), WAIT)
            await asyncio.wait_for(_until(lambda: sock.lost), WAIT)
            release.set()
            assert await asyncio.wait_for(got.get(), WAIT) == upload
            stream.write_eof()
            result = await asyncio.wait_for(task, WAIT)
            assert result.bytes_up == len(upload)
    finally:
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        server.close()
        await server.wait_closed()


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def test_initial_down_past_the_write_mark_pauses_the_stream_to_a_slow_client() -> None:
    """``initial_down`` (a 101's first target bytes) that fills the socket's write buffer past
    its high mark: the splice takes nothing more from the stream until the client reads (the
    pause came before the splice listened for it)."""
    streams: asyncio.Queue[TunnelStream] = asyncio.Queue()
    wrote = asyncio.Event()

    async def flood(stream: TunnelStream) -> None:
        stream.accept()
        await streams.put(stream)
        with contextlib.suppress(StreamClosedError):
            await stream.write(b"y" * (8 << 20))
            wrote.set()
            await stream.read()

    async with front(flood, initial_down=b"x" * (16 << 20)) as (f,):
        await asyncio.wait_for(streams.get(), WAIT)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wrote.wait(), 1.0)
        assert not wrote.is_set()  # the client reads nothing: nor does the splice
        assert not f.task.done()


async def test_a_connection_idle_after_a_bulk_upload_lets_its_read_buffers_go() -> None:
    """As under the relay (:data:`LEND_IDLE`): the socket's lending buffers (up to 1 MiB and
    spares) are let go once no byte came up for a while, not held by every idle connection
    that once uploaded in bulk."""
    got: asyncio.Queue[int] = asyncio.Queue()

    async def sink(stream: TunnelStream) -> None:
        stream.accept()
        total = 0
        with contextlib.suppress(StreamClosedError):
            while data := await stream.read():
                total += len(data)
                if total >= 8 << 20:
                    await got.put(total)

    async with front(sink) as (f,):
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.sock_sendall(f.client, os.urandom(8 << 20)), WAIT)
        assert await asyncio.wait_for(got.get(), WAIT) == 8 << 20
        assert f.sock.read_buffer_size > 0  # it lent the bulk's reads
        await asyncio.sleep(CREDIT_PROBE + LEND_IDLE * 2)  # the sender's last probe, then idle
        assert f.sock.read_buffer_size == 0
        assert not f.task.done()
