"""The relay's ends (real sockets on loopback): how one direction's end stops the other, an
outside cancellation, and what an idle relayed tunnel stream holds in memory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import struct
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from ravenproxy.transport import front_splice as splice_module
from ravenproxy.transport import relay as relay_module
from ravenproxy.transport.bytestream import (
    READ_LIMIT,
    SocketByteStream,
    TunnelByteStream,
    open_connection,
)
from ravenproxy.transport.front_splice import splice_or_relay
from ravenproxy.transport.relay import RelayResult, relay
from ravenproxy.transport.session import SessionConfig, StreamClosedError, TunnelStream
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.wire.config import WireConfig
from tests.unit.transport.test_session import TARGET, WAIT, tunnel

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def listening(handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def front(target_port: int) -> AsyncIterator[tuple[int, list[RelayResult]]]:
    """A front that relays each client to a new connection to ``target_port``."""
    results: list[RelayResult] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up = SocketByteStream(*await open_connection("127.0.0.1", target_port))
        results.append(await relay(up, reader, writer))

    async with listening(serve) as port:
        yield port, results


async def test_upstream_reset_ends_the_relay_while_the_client_is_silent() -> None:
    """Down fails (the target resets) while up waits on a silent client: up is stopped, the
    relay reports the error and the client is closed."""

    async def resetting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST

    async with listening(resetting) as target, front(target) as (port, results):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"x")
            started = time.monotonic()
            assert await asyncio.wait_for(reader.read(), WAIT) == b""
            assert time.monotonic() - started < WAIT
            for _ in range(100):
                if results:
                    break
                await asyncio.sleep(0.02)
            (result,) = results
            assert result.error.startswith("socket: ")
            assert result.bytes_up == 1
        finally:
            writer.close()


async def test_half_close_both_ways_keeps_the_answer() -> None:
    """The client's EOF reaches the target, whose answer after it still comes back; the relay
    ends cleanly once both directions are done."""

    async def answer_after_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        writer.write(data.upper())
        await writer.drain()
        writer.close()

    async with listening(answer_after_eof) as target, front(target) as (port, results):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"hello")
            writer.write_eof()
            assert await asyncio.wait_for(reader.read(), WAIT) == b"HELLO"
            for _ in range(100):
                if results:
                    break
                await asyncio.sleep(0.02)
            (result,) = results
            assert (result.error, result.bytes_up, result.bytes_down) == ("", 5, 5)
        finally:
            writer.close()


async def test_a_half_closed_client_that_resets_while_the_target_is_silent_ends_the_relay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client sends its request, half-closes (its EOF reaches the target), then resets
    while the target has not answered (and may never). The relay ends within a few looks at
    the client's socket with the client's error (and closes the target's connection). Before:
    reading had stopped at the EOF, so nothing heard of the reset until the target answered or
    the idle timeout (4 h by default)."""
    monkeypatch.setattr(relay_module, "CREDIT_PROBE", 0.1)
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # the request, to its EOF; no answer
        await release.wait()
        writer.close()

    async with listening(silent) as target, front(target) as (port, results):
        client = socket.create_connection(("127.0.0.1", port))
        try:
            client.sendall(b"request")
            client.shutdown(socket.SHUT_WR)
            await asyncio.sleep(0.3)  # the relay waits for the answer now
            assert not results
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # RST
            for _ in range(100):
                if results:
                    break
                await asyncio.sleep(0.02)
            (result,) = results
            assert "client connection gone while not read" in result.error, result
            assert result.bytes_up == len(b"request")
        finally:
            release.set()
            client.close()


async def test_cancelling_the_relay_stays_a_cancellation_and_closes_both_ends() -> None:
    accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put(reader)
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()

    async with listening(hold) as target:
        client_side: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
        client_side = asyncio.Queue()

        async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await client_side.put((reader, writer))

        async with listening(keep) as port:
            client_r, client_w = await asyncio.open_connection("127.0.0.1", port)
            server_r, server_w = await asyncio.wait_for(client_side.get(), WAIT)
            up = SocketByteStream(*await open_connection("127.0.0.1", target))
            task = asyncio.create_task(relay(up, server_r, server_w))
            target_reader = await asyncio.wait_for(accepted.get(), WAIT)
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.wait_for(client_r.read(), WAIT) == b""
            assert up.writer.is_closing()
            assert await asyncio.wait_for(target_reader.read(), WAIT) == b""
            client_w.close()


WINDOW = 16 * 1024
"""The agent's stream window in the stalled-upload tests: what the relay may send before it
waits for credit that never comes (the agent's side reads nothing)."""


@contextlib.asynccontextmanager
async def accepting(
    kind: str, unix_path: str | None = None
) -> AsyncIterator[tuple[int, asyncio.Queue[tuple[Any, Any]]]]:
    """A listener whose accepted sockets come out as (reader, writer): asyncio's streams, or
    one :class:`SocketStream` as the server's fronts have them (on ``unix_path``, a Unix
    socket, as the egress front's; the port is then 0)."""
    queue: asyncio.Queue[tuple[Any, Any]] = asyncio.Queue()
    if kind == "asyncio":

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await queue.put((reader, writer))

        async with listening(accepted) as port:
            yield port, queue
        return

    def made() -> SocketStream:
        stream = SocketStream(READ_LIMIT)
        queue.put_nowait((stream, stream))
        return stream

    loop = asyncio.get_running_loop()
    if unix_path is not None:
        server = await loop.create_unix_server(made, unix_path)
    else:
        server = await loop.create_server(made, "127.0.0.1", 0)
    try:
        yield 0 if unix_path is not None else server.sockets[0].getsockname()[1], queue
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("kind", "how"),
    [
        ("asyncio", "relay"),
        ("socketstream", "relay"),
        ("unix", "relay"),
        ("socketstream", "splice"),
        ("unix", "splice"),
    ],
)
@pytest.mark.parametrize("reading", ["reading", "paused"])
async def test_a_client_reset_while_its_upload_waits_for_credit_ends_the_relay(
    reading: str, kind: str, how: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's upload waits for the tunnel's credit (the agent's side reads nothing) and
    nothing comes down; then the client resets. The relay ends within a few seconds with the
    client's error, and the stream is reset (the agent drops its target). Before: nothing
    noticed until the idle timeout (4 h by default) held the stream, the client's slot and the
    socket. ``paused``: so much is uploaded that reading the client socket is paused, and only
    the kernel hears of the reset. ``unix``: the egress front's Unix socket, whose client has no
    reset (a close, with no TCP state to look at; the kernel's poll says the peer is gone).
    ``splice``: the front's splice by callbacks (:func:`splice_or_relay`) rather than the
    relay."""
    # The client's socket is looked at every 0.2 s, not every 2 s: the reset is heard sooner,
    # by the same look (the bound below is in probes).
    monkeypatch.setattr(relay_module, "CREDIT_PROBE", 0.2)
    monkeypatch.setattr(splice_module, "CREDIT_PROBE", 0.2)
    held: asyncio.Queue[TunnelStream] = asyncio.Queue()
    release = asyncio.Event()

    async def hold(stream: TunnelStream) -> None:  # the agent's side: accepts, reads nothing
        stream.accept()
        await held.put(stream)
        await release.wait()

    # Beyond the window: a little (the reader keeps reading), or more than the reader buffers
    # before it pauses reading (2 x its limit) plus what the kernel's buffers hold.
    upload = WINDOW + (8 * 1024 if reading == "reading" else 3 * READ_LIMIT + 8 * 1024 * 1024)
    results: list[RelayResult] = []
    edge = SessionConfig(wire=WireConfig(initial_stream_window=WINDOW, max_stream_window=WINDOW))
    unix = str(tmp_path / "egress.sock") if kind == "unix" else None
    async with (
        tunnel(on_open=hold, edge_config=edge) as t,
        accepting("socketstream" if unix else kind, unix) as (port, front_side),
    ):
        if unix is not None:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(unix)
        else:
            client = socket.create_connection(("127.0.0.1", port))
        task: asyncio.Task[RelayResult] | None = None
        try:
            reader, writer = await asyncio.wait_for(front_side.get(), WAIT)
            stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
            run = splice_or_relay if how == "splice" else relay
            task = asyncio.create_task(run(TunnelByteStream(stream), reader, writer))
            task.add_done_callback(lambda done: results.append(done.result()))
            agent_stream = await asyncio.wait_for(held.get(), WAIT)
            client.setblocking(False)
            sent, blocked, chunk = 0, 0, b"u" * 65536
            while sent < upload and blocked < 20:  # until sent, or 0.2 s of full buffers
                try:
                    sent += client.send(chunk[: upload - sent])
                    blocked = 0
                except BlockingIOError:
                    blocked += 1
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # the relay is waiting for credit now
            assert not task.done(), results
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()  # RST
            started = time.monotonic()
            await asyncio.wait_for(asyncio.shield(task), relay_module.CREDIT_PROBE + WAIT)
            assert time.monotonic() - started < relay_module.CREDIT_PROBE + WAIT
            (result,) = results
            assert result.error.startswith("socket: "), result
            if unix is not None:
                assert "client connection closed" in result.error, result
            elif reading == "paused":
                assert "gone while not read" in result.error, result
            else:
                assert "client connection lost" in result.error, result
            assert result.bytes_up == WINDOW
            with pytest.raises(StreamClosedError):
                while await asyncio.wait_for(agent_stream.read(), WAIT):
                    pass
        finally:
            release.set()
            client.close()
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("how", ["relay", "splice"])
async def test_a_half_closed_unix_client_is_not_taken_for_gone(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A Unix-socket client that shuts its sending side down (a half-close: it still reads the
    answer) while its upload waits for credit is not gone: the relay (or the splice) goes on."""
    monkeypatch.setattr(relay_module, "CREDIT_PROBE", 0.05)
    monkeypatch.setattr(splice_module, "CREDIT_PROBE", 0.05)
    release = asyncio.Event()

    async def hold(stream: TunnelStream) -> None:
        stream.accept()
        await release.wait()

    edge = SessionConfig(wire=WireConfig(initial_stream_window=WINDOW, max_stream_window=WINDOW))
    unix = str(tmp_path / "egress.sock")
    async with (
        tunnel(on_open=hold, edge_config=edge) as t,
        accepting("socketstream", unix) as (_port, front_side),
    ):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        task: asyncio.Task[RelayResult] | None = None
        try:
            client.connect(unix)
            reader, writer = await asyncio.wait_for(front_side.get(), WAIT)
            stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
            run = splice_or_relay if how == "splice" else relay
            task = asyncio.create_task(run(TunnelByteStream(stream), reader, writer))
            client.sendall(b"u" * (WINDOW + 4096))
            client.shutdown(socket.SHUT_WR)
            await asyncio.sleep(0.5)  # ten looks at the socket
            assert not task.done(), task.result()
        finally:
            release.set()
            client.close()
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)


IDLE_STREAMS = 200
IDLE_BYTES_PER_STREAM = 20_000
"""Python heap an idle relayed tunnel stream may hold, both ends together (the opener's relay
from a client socket, the peer's relay to its target, their sockets: asyncio's own loop here),
under tracemalloc. Before the cuts of issue 10 it was ~28 500 bytes (two tasks, four closures
and an asyncio.wait per relay; two Events, a deque and a future per tunnel stream; a deque per
StreamReaderProtocol); after them ~15 000."""


async def test_an_idle_relayed_stream_holds_little_memory() -> None:
    # The target never accepts: the kernel completes the connections into the backlog, so the
    # count holds no Python object of the target's (only the two relays and their sockets).
    target = socket.create_server(("127.0.0.1", 0), backlog=IDLE_STREAMS + 16)
    target_port = target.getsockname()[1]

    async def agent_side(stream: TunnelStream) -> None:  # the agent's shape
        reader, writer = await open_connection("127.0.0.1", target_port)
        stream.accept()
        await relay(TunnelByteStream(stream), reader, writer)

    relays: list[asyncio.Task[RelayResult]] = []
    clients: list[socket.socket] = []
    front_side: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]]
    front_side = asyncio.Queue()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await front_side.put((reader, writer))

    try:
        async with tunnel(on_open=agent_side) as t, listening(accepted) as front_port:

            async def open_one() -> None:  # the server's shape: a client relayed to a stream
                clients.append(socket.create_connection(("127.0.0.1", front_port)))
                reader, writer = await asyncio.wait_for(front_side.get(), WAIT)
                stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
                relays.append(asyncio.create_task(relay(TunnelByteStream(stream), reader, writer)))

            try:
                await open_one()  # first allocations (imports, free lists) outside the count
                await asyncio.sleep(0.1)
                gc.collect()
                tracemalloc.start()
                try:
                    before = tracemalloc.take_snapshot()
                    for _ in range(IDLE_STREAMS):
                        await open_one()
                    await asyncio.sleep(0.2)
                    gc.collect()
                    after = tracemalloc.take_snapshot()
                finally:
                    tracemalloc.stop()
                assert len(t.edge.streams) == IDLE_STREAMS + 1
                per_stream = (
                    sum(s.size_diff for s in after.compare_to(before, "filename")) / IDLE_STREAMS
                )
                assert per_stream < IDLE_BYTES_PER_STREAM, f"{per_stream:.0f} bytes per stream"
            finally:
                for task in relays:
                    task.cancel()
                await asyncio.wait_for(asyncio.gather(*relays, return_exceptions=True), WAIT)
                for sock in clients:
                    sock.close()
    finally:
        target.close()
