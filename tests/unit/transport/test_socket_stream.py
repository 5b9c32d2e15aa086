"""SocketStream: an accepted socket as one slotted protocol, with what the fronts and the relay
use of asyncio's streams (read, EOF, half-close, reading paused above the limit, drain)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

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
