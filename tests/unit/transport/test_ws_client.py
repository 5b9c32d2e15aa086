"""The agent's tunnel connection (:class:`ravenproxy.transport.ws_client.ClientSide` under
:class:`~ravenproxy.transport.ws_client.TunnelClientConnection`) against a real ``websockets``
server on loopback: keepalive and its timeout, the closing handshake both ways, the close
timeout, and a connection lost while a write waits. A peer that "stops answering" is a real
server connection whose transport stops reading (it reads neither PINGs nor CLOSE frames)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, ConnectionClosedOK
from websockets.protocol import State

from ravenproxy.transport.ws_client import TunnelClientConnection, connect

WAIT = 10.0

Handler = Callable[[ServerConnection], Awaitable[None]]


@contextlib.asynccontextmanager
async def server(handler: Handler) -> AsyncIterator[tuple[str, asyncio.Queue[ServerConnection]]]:
    """A websockets server on loopback; the queue gets each connection as its handler starts.
    The handler runs until it returns (the connection is then closed by websockets)."""
    connections: asyncio.Queue[ServerConnection] = asyncio.Queue()
    seen: list[ServerConnection] = []

    async def run(ws: ServerConnection) -> None:
        connections.put_nowait(ws)
        seen.append(ws)
        await handler(ws)

    async with serve(run, "127.0.0.1", 0, ping_interval=None, compression=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        try:
            yield f"ws://127.0.0.1:{port}", connections
        finally:
            for ws in seen:  # reading again (see stop_reading): it sees the client gone
                if not ws.transport.is_closing():
                    ws.transport.resume_reading()


@contextlib.asynccontextmanager
async def dialled(uri: str, **options: Any) -> AsyncIterator[TunnelClientConnection]:
    client = await connect(uri, **options)
    try:
        yield client
    finally:
        client.transport.abort()
        await asyncio.wait_for(client.wait_closed(), WAIT)


async def until_closed(ws: ServerConnection) -> None:
    await ws.wait_closed()


async def stop_reading(ws: ServerConnection) -> None:
    """The server stops reading this connection (it answers no PING, no CLOSE) and holds it
    until the client goes (:func:`server` resumes reading at its end, to see that)."""
    ws.transport.pause_reading()
    await ws.wait_closed()


async def test_keepalive_pings_are_answered_and_the_connection_stays_up() -> None:
    async with (
        server(until_closed) as (uri, _),
        dialled(uri, ping_interval=0.05, ping_timeout=WAIT) as client,
    ):
        # A few rounds: each PONG schedules the next PING.
        for _ in range(3):
            await asyncio.sleep(0.1)
            assert client.state is State.OPEN
        assert client.latency > 0
        assert client.protocol.close_sent is None


async def test_a_missed_pong_fails_the_connection_with_1011() -> None:
    async with (
        server(stop_reading) as (uri, _),
        dialled(uri, ping_interval=0.05, ping_timeout=0.2, close_timeout=0.2) as client,
    ):
        # The PING is never answered: the client fails the connection (CLOSE 1011), the server
        # reads nothing, so the close timeout aborts it.
        await asyncio.wait_for(client.wait_closed(), WAIT)
        sent = client.protocol.close_sent
        assert sent is not None and (sent.code, sent.reason) == (1011, "keepalive ping timeout")
        with pytest.raises(ConnectionClosedError) as caught:
            async for _ in client:
                pass
        assert caught.value.sent is not None and caught.value.sent.code == 1011
        assert caught.value.rcvd is None


async def test_the_client_closes_with_its_code_and_reason() -> None:
    seen: asyncio.Future[tuple[int | None, str | None]] = asyncio.get_running_loop().create_future()

    async def handler(ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()
        seen.set_result((ws.close_code, ws.close_reason))

    async with server(handler) as (uri, _), dialled(uri) as client:
        await asyncio.wait_for(client.close(1001, "going away"), WAIT)
        assert client.connection_lost_waiter.done()
        assert await asyncio.wait_for(seen, WAIT) == (1001, "going away")
        rcvd = client.protocol.close_rcvd
        assert rcvd is not None and (rcvd.code, rcvd.reason) == (1001, "going away")  # echoed
        assert isinstance(client.close_exc, ConnectionClosedOK)
        with pytest.raises(ConnectionClosedOK):
            await client.send(b"too late")
        await client.close()  # idempotent


async def test_the_server_closes_and_the_reader_ends_with_its_code() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send(b"one")
        await ws.close(1001, "drained")

    async with server(handler) as (uri, _), dialled(uri) as client:
        got: list[bytes | memoryview] = []
        # Our reader hands the message on, then ends with the CLOSE (websockets answers it).
        await asyncio.wait_for(client.deliver(got.extend), WAIT)
        assert got == [b"one"]
        # What the session reads after the delivery: nothing more, a normal end.
        assert [m async for m in client] == []
        rcvd = client.protocol.close_rcvd
        assert rcvd is not None and (rcvd.code, rcvd.reason) == (1001, "drained")
        assert client.protocol.close_sent is not None  # answered
        await asyncio.wait_for(client.wait_closed(), WAIT)


async def test_a_close_the_server_does_not_answer_is_aborted_after_close_timeout() -> None:
    async with server(stop_reading) as (uri, _), dialled(uri, close_timeout=0.2) as client:
        await asyncio.wait_for(client.close(1000, "bye"), WAIT)
        assert client.connection_lost_waiter.done()
        assert isinstance(client.connection_exc, TimeoutError)
        exc = client.close_exc
        assert isinstance(exc, ConnectionClosedError) and exc.rcvd is None
        assert isinstance(exc.__cause__, TimeoutError)


async def test_a_connection_lost_mid_write_wakes_drain_with_connection_closed() -> None:
    async with (
        server(stop_reading) as (uri, connections),
        dialled(uri, write_limit=64 * 1024) as client,
    ):
        peer = await asyncio.wait_for(connections.get(), WAIT)
        chunk = bytes(256 * 1024)
        # Write until the kernel's buffers are full and the transport's is over the limit.
        while not client.paused:
            client.transport.write(chunk)
            await asyncio.sleep(0)
        drain = asyncio.create_task(client.drain(), name="test-drain")
        await asyncio.sleep(0.05)
        assert not drain.done()  # waits while paused
        peer.transport.abort()  # the peer goes: the connection is lost
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(drain, WAIT)
        assert not client.paused
        with pytest.raises(ConnectionClosed):
            await client.drain()


async def test_a_ping_is_answered_and_a_lost_connection_fails_the_pending_ones() -> None:
    async with server(stop_reading) as (uri, connections), dialled(uri) as client:
        peer = await asyncio.wait_for(connections.get(), WAIT)
        pending = await client.ping(b"anyone")
        peer.transport.abort()
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(pending, WAIT)
    async with server(until_closed) as (uri, _), dialled(uri) as client:
        latency = await asyncio.wait_for(await client.ping(), WAIT)
        assert latency >= 0


async def test_after_a_missed_pong_no_message_is_delivered() -> None:
    async def handler(ws: ServerConnection) -> None:
        ws.transport.pause_reading()  # answers no PING
        with contextlib.suppress(ConnectionClosed):
            for i in range(40):
                await ws.send(b"m%d" % i)
                await asyncio.sleep(0.02)
        await ws.wait_closed()

    async with (
        server(handler) as (uri, _),
        dialled(uri, ping_interval=0.05, ping_timeout=0.1, close_timeout=0.5) as client,
    ):
        late: list[bytes | memoryview] = []

        def receive(batch: list[bytes | memoryview]) -> None:
            if client.protocol.close_sent is not None:  # the client failed the connection
                late.extend(batch)

        delivery = asyncio.create_task(client.deliver(receive), name="test-deliver")
        await asyncio.wait_for(client.wait_closed(), WAIT)
        await asyncio.wait_for(delivery, WAIT)
        assert client.protocol.close_sent is not None
        assert late == []  # websockets discards what follows a fail() (RFC 6455 7.1.7)


@pytest.mark.parametrize("before", [True, False])
async def test_a_receiver_that_raises_ends_the_delivery_with_its_error(before: bool) -> None:
    """What the receiver raises ends :meth:`deliver` and is raised there, for a message that
    arrived before the delivery (handed on as it starts) and for one it reads (handed on from
    the read callback)."""
    go = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        await go.wait()
        await ws.send(b"one")
        await ws.send(b"two")
        await ws.wait_closed()

    async with server(handler) as (uri, _), dialled(uri) as client:
        got: list[bytes] = []

        def receive(batch: list[bytes | memoryview]) -> None:
            got.extend(bytes(m) for m in batch)
            raise ValueError("refused")

        if before:  # queued by the reader, as no one takes them yet
            go.set()
            async with asyncio.timeout(WAIT):
                while not client._rd.messages:
                    await asyncio.sleep(0.01)
        delivery = asyncio.create_task(client.deliver(receive), name="test-deliver")
        await asyncio.sleep(0)
        go.set()
        with pytest.raises(ValueError, match="refused"):
            await asyncio.wait_for(delivery, WAIT)
        assert got[0] == b"one"


async def test_a_read_that_got_nothing_into_the_scratch_leaves_no_trace() -> None:
    """An idle connection's read is offered the thread's shared scratch buffer; a read that got
    nothing (the transport asked for a buffer, the socket had no whole TLS record yet, or the
    readiness was spurious) makes no ``buffer_updated``. If the reader then stops parsing frames
    (a missed PONG: ``_pong_missed``) its next read goes into a buffer of its own, and what
    came there, not the scratch's stale bytes, goes to websockets."""
    go = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        await ws.send(b"before")
        await go.wait()
        await ws.send(b"after!")
        await ws.wait_closed()

    async with server(handler) as (uri, _), dialled(uri) as client:
        assert await asyncio.wait_for(client.next_messages(), WAIT) == [b"before"]
        assert client.frames_handled and client.read_buffer_size == 0  # idle: read the scratch
        client.get_buffer(-1)  # as a transport's read that then got nothing
        client._stop_frames()  # as a missed PONG does, with no read in between
        go.set()
        assert await asyncio.wait_for(client.recv(), WAIT) == b"after!"
