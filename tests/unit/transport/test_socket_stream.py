"""SocketStream: an accepted socket as one slotted protocol, with what the fronts and the relay
use of asyncio's streams (read, EOF, half-close, reading paused above the limit, drain), and
the relay's lending reads (views of buffers of its own, on asyncio's loop and uvloop)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from ravenproxy.transport import socket_stream
from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.lender import LEND_FROM, LEND_READ, LEND_SMALL
from ravenproxy.transport.socket_stream import SocketStream


@contextlib.asynccontextmanager
async def accepted(limit: int = 64 * 1024) -> AsyncIterator[tuple[SocketStream, socket.socket]]:
    """A SocketStream over one end of a real socket pair; the other end, blocking-free."""
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    stream = SocketStream(limit)
    try:
        await asyncio.get_running_loop().connect_accepted_socket(lambda: stream, ours)
        yield stream, peer
    finally:
        stream.transport.abort()
        peer.close()


async def test_reads_what_the_peer_sends_then_eof_and_still_writes() -> None:
    loop = asyncio.get_running_loop()
    async with accepted() as (stream, peer):
        assert not hasattr(stream, "__dict__")
        await loop.sock_sendall(peer, b"hello world")
        assert await stream.read(5) == b"hello"
        assert await stream.read(100) == b" world"
        peer.shutdown(socket.SHUT_WR)
        assert await stream.read(100) == b""
        assert await stream.read(100) == b""
        # Half-close: our direction is still open after the peer's EOF.
        assert stream.can_write_eof()
        stream.write(b"answer")
        await stream.drain()
        stream.write_eof()
        got = b""
        while chunk := await loop.sock_recv(peer, 100):
            got += chunk
        assert got == b"answer"


async def test_a_read_waits_for_data() -> None:
    loop = asyncio.get_running_loop()
    async with accepted() as (stream, peer):
        pending = asyncio.create_task(stream.read(100))
        await asyncio.sleep(0.05)
        assert not pending.done()
        await loop.sock_sendall(peer, b"late")
        assert await asyncio.wait_for(pending, 5) == b"late"


async def test_reading_pauses_above_twice_the_limit_and_resumes_when_read() -> None:
    loop = asyncio.get_running_loop()
    async with accepted(limit=1024) as (stream, peer):
        await loop.sock_sendall(peer, b"x" * 8192)
        for _ in range(100):
            if not stream.transport.is_reading():
                break
            await asyncio.sleep(0.01)
        assert not stream.transport.is_reading()  # over twice the limit buffered: TCP pushes back
        total = 0
        while total < 8192:
            total += len(await asyncio.wait_for(stream.read(512), 5))
        assert stream.transport.is_reading()


async def test_drain_after_the_connection_is_lost_raises() -> None:
    async with accepted() as (stream, peer):
        peer.close()
        assert await asyncio.wait_for(stream.read(10), 5) == b""
        stream.transport.abort()
        await asyncio.sleep(0)
        with pytest.raises(ConnectionError):
            await stream.drain()
        assert stream.is_closing()


async def test_wait_closed_returns_once_the_connection_is_gone() -> None:
    async with accepted() as (stream, peer):
        stream.write(b"bye")
        stream.close()
        await asyncio.wait_for(stream.wait_closed(), 5)
        assert stream.is_closing()
        assert peer.recv(16) == b"bye"
        await asyncio.wait_for(stream.wait_closed(), 5)  # again: at once


async def test_served_by_callbacks_with_read_nowait() -> None:
    loop = asyncio.get_running_loop()
    async with accepted() as (stream, peer):
        calls: list[bytes | None] = []
        assert stream.read_nowait(100) is None  # nothing yet
        stream.on_data(lambda: calls.append(stream.read_nowait(3)))
        await loop.sock_sendall(peer, b"hello")
        while not calls:
            await asyncio.sleep(0.01)
        assert calls == [b"hel"]
        assert stream.read_nowait(100) == b"lo"  # the rest stays buffered until taken
        peer.shutdown(socket.SHUT_WR)
        while len(calls) < 2:
            await asyncio.sleep(0.01)
        assert calls[1] == b""  # the EOF calls back too
        stream.on_data(None)
        assert not stream.write_paused


class _Transport:
    """A transport that only reads (pausing is all it is asked)."""

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def test_read_nowait_hands_on_bytes_no_later_data_changes() -> None:
    """A whole buffer taken is bytes: one chunk as it came (the same object), several joined
    (the bytearray they were gathered in copied): what comes afterwards changes neither."""
    stream = SocketStream(1024)
    stream.connection_made(_Transport())  # type: ignore[arg-type]
    one = b"GET / HTTP/1.1\r\n"
    stream.data_received(one)
    taken = stream.read_nowait(READ_LIMIT)
    assert taken is one
    stream.data_received(b"ab")
    stream.data_received(b"cd")  # gathered in a bytearray
    joined = stream.read_nowait(READ_LIMIT)
    assert type(joined) is bytes and joined == b"abcd"
    stream.data_received(b"ef")
    stream.data_received(b"gh")
    assert (taken, joined) == (one, b"abcd")
    assert stream.read_nowait(READ_LIMIT) == b"efgh"


async def test_pending_is_false_only_when_read_nowait_would_return_none() -> None:
    """``pending`` False promises a read_nowait that finds nothing: a whole buffer taken clears
    it; a part taken, the EOF, the loss, bytes read past a lending switch do not."""
    stream = SocketStream(1024)
    stream.connection_made(_Transport())  # type: ignore[arg-type]
    assert not stream.pending and stream.read_nowait(READ_LIMIT) is None
    stream.data_received(b"GET / HTTP/1.1\r\n")
    assert stream.pending
    assert stream.read_nowait(READ_LIMIT) and not stream.pending  # all of it taken
    stream.data_received(b"abcd")
    assert stream.read_nowait(2) == b"ab" and stream.pending  # a part: the rest is there
    assert stream.read_nowait(READ_LIMIT) == b"cd" and not stream.pending
    stream.data_received(b"ef")
    stream.eof_received()
    assert stream.read_nowait(READ_LIMIT) == b"ef" and stream.pending  # the EOF is still to read
    assert stream.read_nowait(READ_LIMIT) == b"" and stream.pending
    lost = SocketStream(1024)
    lost.connection_made(_Transport())  # type: ignore[arg-type]
    assert lost.read_nowait(READ_LIMIT) is None and not lost.pending
    lost.connection_lost(ConnectionResetError())
    assert lost.pending
    with pytest.raises(ConnectionResetError):
        lost.read_nowait(READ_LIMIT)


class _LendingTransport(_Transport):
    def set_protocol(self, protocol: object) -> None:
        pass


async def test_pending_stays_while_lent_views_wait_behind_the_buffer() -> None:
    """The chunk that switched to lending is in the buffer, what came after in lent views: the
    buffer taken whole leaves the views to read (``pending`` stays)."""
    stream = SocketStream(1 << 20)
    stream.connection_made(_LendingTransport())  # type: ignore[arg-type]
    assert stream.lend_reads()
    first = b"x" * LEND_FROM
    stream.data_received(first)  # switches to lending; this chunk is buffered as ever
    stream._lent(memoryview(b"more"))  # what the lender read next
    assert stream.read_nowait() == first and stream.pending
    assert stream.read_nowait() == b"more"
    assert stream.read_nowait() is None and not stream.pending


# -- lending (the relay's bulk upload) ----------------------------------------------------------
# On both loops: uvloop picks its read callbacks (into our buffer, or into bytes of its own) when
# reading starts, asyncio's when the protocol is set.
LOOPS = [pytest.param(asyncio.run, id="asyncio"), pytest.param(uvloop.run, id="uvloop")]


async def _send_all(peer: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(peer, data)


async def _lending_keeps_held_views_intact() -> None:
    data = os.urandom(8 << 20)
    async with accepted(limit=READ_LIMIT) as (stream, peer):
        assert stream.lend_reads()
        await _send_all(peer, b"small")  # small traffic never switches
        assert await stream.read_chunk(100) == b"small"
        sender = asyncio.create_task(_send_all(peer, data))
        got = bytearray()
        held: list[tuple[memoryview, bytes]] = []  # views still held, as the tunnel holds them
        views = 0
        while len(got) < len(data):
            chunk = await asyncio.wait_for(stream.read_chunk(READ_LIMIT), 10)
            assert chunk
            if isinstance(chunk, memoryview):
                views += 1
                assert chunk.readonly  # what the tunnel takes by reference, uncopied
                held.append((chunk, bytes(chunk)))
                if len(held) > 6:
                    held.pop(0)
            got += chunk
            # A buffer is never read into while a view of that part of it is held.
            assert all(view == copy for view, copy in held)
        await sender
        assert got == data  # in order: what came before the switch, then the views
        assert views > 8
        peer.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(stream.read_chunk(100), 5) == b""


@pytest.mark.parametrize("run", LOOPS)
def test_lending_reads_hand_out_views_in_order_and_keep_held_ones_intact(
    run: Callable[[Awaitable[None]], None],
) -> None:
    run(asyncio.wait_for(_lending_keeps_held_views_intact(), 60))


async def _lending_pauses_and_reads_to_the_eof() -> None:
    async with accepted(limit=64 * 1024) as (stream, peer):
        assert stream.lend_reads()
        data = os.urandom(4 << 20)
        sender = asyncio.create_task(_send_all(peer, data))
        first = await asyncio.wait_for(stream.read(LEND_FROM), 5)  # read(): bytes, always
        assert type(first) is bytes
        for _ in range(500):
            if not stream.transport.is_reading():
                break
            await asyncio.sleep(0.01)
        assert not stream.transport.is_reading()  # over twice the limit lent out: TCP pushes back
        got = bytearray(first)
        views = 0
        while len(got) < len(data):
            chunk = await asyncio.wait_for(stream.read_chunk(16 * 1024), 5)
            assert 0 < len(chunk) <= 16 * 1024  # a view is cut to what was asked for
            views += isinstance(chunk, memoryview)
            got += chunk
        assert views
        await sender
        assert got == data
        assert stream.transport.is_reading()
        await _send_all(peer, b"tail")
        peer.shutdown(socket.SHUT_WR)
        rest = b""
        while chunk := await asyncio.wait_for(stream.read(100), 5):
            rest += chunk
        assert rest == b"tail"
        assert stream.read_nowait() == b""


@pytest.mark.parametrize("run", LOOPS)
def test_lending_pauses_above_twice_the_limit_and_reads_on_to_the_eof(
    run: Callable[[Awaitable[None]], None],
) -> None:
    run(asyncio.wait_for(_lending_pauses_and_reads_to_the_eof(), 60))


async def _read_holding(
    stream: SocketStream, peer: socket.socket, data: bytes
) -> tuple[list[memoryview | bytes], int]:
    """Send ``data`` from ``peer`` and read it all, holding every chunk read (a lagging tunnel
    holds every view); the chunks and the most lending buffer bytes the stream held meanwhile."""
    sender = asyncio.create_task(_send_all(peer, data))
    got = bytearray()
    held: list[memoryview | bytes] = []
    most = 0
    while len(got) < len(data):
        chunk = await asyncio.wait_for(stream.read_chunk(READ_LIMIT), 10)
        held.append(chunk)
        got += chunk
        most = max(most, stream.read_buffer_size)
    await sender
    assert got == data
    return held, most


async def _lending_lets_its_buffers_go_once_idle() -> None:
    """A reader lagging behind (the tunnel holds every view) makes the stream read on into
    spare buffers; once its reader caught up and no data came for LEND_IDLE, the stream holds
    no buffer, and a later bulk lends again, intact."""
    data = os.urandom(16 << 20)
    async with accepted(limit=READ_LIMIT) as (stream, peer):
        assert stream.lend_reads()
        for _ in range(2):
            held, most = await _read_holding(stream, peer, data)
            assert any(isinstance(chunk, memoryview) for chunk in held)
            assert most > LEND_READ  # lagging behind, it read on into spares
            waiting = asyncio.create_task(stream.read_chunk(100))  # caught up: it waits
            await asyncio.sleep(2 * socket_stream.LEND_IDLE)
            assert not waiting.done()
            assert stream.read_buffer_size == 0  # idle: no buffer held
            assert b"".join(held) == data  # the views held stayed intact
            await _send_all(peer, b"x")
            assert await asyncio.wait_for(waiting, 5) == b"x"
            assert stream.read_buffer_size <= LEND_SMALL  # it starts small again
        peer.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(stream.read_chunk(100), 5) == b""


@pytest.mark.parametrize("run", LOOPS)
def test_a_lending_stream_lets_its_buffers_go_once_idle(
    run: Callable[[Awaitable[None]], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket_stream, "LEND_IDLE", 0.1)
    run(asyncio.wait_for(_lending_lets_its_buffers_go_once_idle(), 60))


async def _lending_buffers_follow_the_pace() -> None:
    """Buffers grow to LEND_READ while the socket holds more than a read takes (bulk), and go
    back to LEND_SMALL once the reads are small (a trickle): a slow upload does not hold a
    1 MiB buffer. The bytes stay whole and in order throughout."""
    bulk, piece = os.urandom(8 << 20), os.urandom(8 * 1024)
    async with accepted(limit=READ_LIMIT) as (stream, peer):
        assert stream.lend_reads()
        held, most = await _read_holding(stream, peer, bulk)
        assert b"".join(held) == bulk
        assert most >= LEND_READ  # the reads filled what they were offered: large buffers
        held.clear()  # the tunnel sent them all
        trickle = bytearray()
        for _ in range(8):
            await _send_all(peer, piece)
            trickle += await asyncio.wait_for(stream.read_chunk(READ_LIMIT), 5)
            await asyncio.sleep(0.01)
        assert trickle == piece * 8
        assert 0 < stream.read_buffer_size <= LEND_SMALL  # small reads: a small buffer
        peer.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(stream.read_chunk(100), 5) == b""


@pytest.mark.parametrize("run", LOOPS)
def test_lending_buffers_grow_for_bulk_and_shrink_for_a_trickle(
    run: Callable[[Awaitable[None]], None],
) -> None:
    run(asyncio.wait_for(_lending_buffers_follow_the_pace(), 60))
