"""``drain_taken``: a drain under an :class:`IdleWatch` that the bytes the peer takes push back
(an idle timeout is about no progress), over a real loopback TCP connection whose buffers are
small: a peer that reads steadily, slower than one drain per timeout, is waited for to the
end; one that stops is cut about a timeout after its last byte. ``untaken`` counts what the
kernel holds too: the socket is reported writable only once much of its queue is free, so the
transport's buffer alone stands still while the peer reads."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest

from ravenproxy.server.accept import streams
from ravenproxy.transport.idle import IdleTimeout, IdleWatch, drain_taken, untaken
from ravenproxy.transport.socket_stream import SocketStream

pytestmark = pytest.mark.timeout(30)

IDLE = 0.25
BIG = 512 * 1024


@contextlib.asynccontextmanager
async def _pair() -> AsyncIterator[tuple[SocketStream, socket.socket]]:
    """A writer (the server's side, 4 KiB send buffer) and its peer's socket (4 KiB receive
    buffer, non-blocking), connected over loopback."""
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peer.setblocking(False)
    try:
        await asyncio.get_running_loop().sock_connect(peer, listener.getsockname())
        conn, _ = listener.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        _, writer = await streams(conn, limit=64 * 1024)
        try:
            yield writer, peer
        finally:
            writer.transport.abort()
    finally:
        peer.close()
        listener.close()


async def _read(peer: socket.socket, step: int, pause: float, until: float) -> tuple[int, float]:
    """Read ``step`` bytes every ``pause`` seconds until the loop's time ``until``: how much,
    and when the last read was (``time.monotonic``)."""
    loop, got, last = asyncio.get_running_loop(), 0, time.monotonic()
    with contextlib.suppress(ConnectionError):
        while loop.time() < until:
            got += len(await loop.sock_recv(peer, step))
            last = time.monotonic()
            await asyncio.sleep(pause)
    return got, last


async def test_a_peer_that_reads_steadily_is_waited_for() -> None:
    """2 KiB every 0.05 s (40 KiB/s): 48 KiB from the high mark to the low one take 1.2 s,
    nearly five timeouts; the drain ends, the watch never fired."""
    async with _pair() as (writer, peer):
        writer.write(b"x" * (64 * 1024 + 48 * 1024))
        assert writer.write_paused
        loop = asyncio.get_running_loop()
        reading = asyncio.create_task(_read(peer, 2048, 0.05, loop.time() + 30))
        started = time.monotonic()
        try:
            watch = IdleWatch(IDLE)
            async with watch:
                await drain_taken(writer, watch)
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        assert time.monotonic() - started > 2 * IDLE
        assert not writer.write_paused


async def test_a_peer_that_stops_is_cut_within_a_timeout_of_its_last_byte() -> None:
    async with _pair() as (writer, peer):
        writer.write(b"x" * BIG)
        loop = asyncio.get_running_loop()
        reading = asyncio.create_task(_read(peer, 2048, 0.05, loop.time() + 4 * IDLE))
        watch = IdleWatch(IDLE)
        with pytest.raises(IdleTimeout):
            async with watch:
                await drain_taken(writer, watch)
        cut = time.monotonic()
        got, stopped = await reading
        assert got > 32 * 1024  # it read through several timeouts first
        assert cut - stopped >= IDLE * 0.8, "cut while the peer still read"
        assert cut - stopped <= IDLE * 4


async def test_untaken_counts_the_kernels_queue() -> None:
    async with _pair() as (writer, peer):
        writer.write(b"x" * BIG)
        await asyncio.sleep(0.1)
        buffered = writer.transport.get_write_buffer_size()
        assert untaken(writer.transport) > buffered  # the kernel holds some too
        assert untaken(writer.transport) <= BIG
        peer.close()
