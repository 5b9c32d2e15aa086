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

import pytest

from ravenproxy.transport.bytestream import SocketByteStream, TunnelByteStream, open_connection
from ravenproxy.transport.relay import RelayResult, relay
from ravenproxy.transport.session import TunnelStream
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
