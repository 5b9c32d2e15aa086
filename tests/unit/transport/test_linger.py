"""lingering_close over a real loopback connection: the peer gets EOF first (half-close) and
can still send; what it sends is dropped until it closes, goes silent, has lingered the
longest allowed or has sent the budget; then the connection is closed (a FIN, not a reset)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from ravenproxy.transport.linger import lingering_close
from ravenproxy.transport.socket_stream import SocketStream


@contextlib.asynccontextmanager
async def accepted() -> AsyncIterator[tuple[SocketStream, socket.socket]]:
    """A SocketStream over one end of a real TCP connection on loopback; the other end."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(listener.getsockname())
    ours, _ = listener.accept()
    listener.close()
    peer.setblocking(False)
    stream = SocketStream(64 * 1024)
    try:
        await loop.connect_accepted_socket(lambda: stream, ours)
        yield stream, peer
    finally:
        stream.transport.abort()
        peer.close()


async def loop_send(peer: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(peer, data)


async def read_to_eof(peer: socket.socket) -> bytes:
    loop = asyncio.get_running_loop()
    got = b""
    while chunk := await loop.sock_recv(peer, 65536):
        got += chunk
    return got


async def test_the_peer_reads_the_answer_then_eof_while_still_sending() -> None:
    loop = asyncio.get_running_loop()
    async with accepted() as (stream, peer):
        stream.write(b"HTTP/1.1 413 ...\r\n\r\n")
        closing = asyncio.create_task(lingering_close(stream, stream))
        # The peer is still writing a body it was refused; it sees the answer and EOF first.
        assert await asyncio.wait_for(read_to_eof(peer), 5) == b"HTTP/1.1 413 ...\r\n\r\n"
        sent = 0
        for _ in range(64):  # 8 MiB: more than the socket buffers hold, all read and dropped
            await loop.sock_sendall(peer, b"x" * 131072)
            sent += 131072
        peer.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(closing, 5) == sent
        assert stream.is_closing()


async def test_a_silent_peer_is_closed_after_the_timeout() -> None:
    async with accepted() as (stream, peer):
        await loop_send(peer, b"part of a body")
        dropped = await asyncio.wait_for(lingering_close(stream, stream, timeout=0.2), 5)
        assert dropped == len(b"part of a body")
        assert stream.is_closing()
        assert await asyncio.wait_for(read_to_eof(peer), 5) == b""  # a FIN: no reset


async def test_a_peer_that_never_stops_is_closed_after_the_budget() -> None:
    loop = asyncio.get_running_loop()
    async with accepted() as (stream, peer):
        closing = asyncio.create_task(lingering_close(stream, stream, budget=1024 * 1024))

        async def flood() -> None:
            with contextlib.suppress(OSError):
                while True:
                    await loop.sock_sendall(peer, b"x" * 65536)

        flooder = asyncio.create_task(flood())
        try:
            dropped = await asyncio.wait_for(closing, 10)
        finally:
            flooder.cancel()
            await asyncio.gather(flooder, return_exceptions=True)
        assert 1024 * 1024 <= dropped < 2 * 1024 * 1024
        assert stream.is_closing()


async def test_a_peer_that_trickles_is_closed_after_the_total() -> None:
    loop = asyncio.get_running_loop()
    async with accepted() as (stream, peer):
        closing = asyncio.create_task(lingering_close(stream, stream, timeout=5, total=0.3))
        sent = 0
        with contextlib.suppress(OSError):
            while not closing.done() and sent < 200:  # a byte each 20 ms: never silent 5 s
                await loop.sock_sendall(peer, b"x")
                sent += 1
                await asyncio.sleep(0.02)
        dropped = await asyncio.wait_for(closing, 5)
        assert 0 < dropped < 200 and sent < 200
        assert stream.is_closing()


async def test_a_peer_whose_message_is_through_is_not_waited_for() -> None:
    """``through`` says the peer sent all it meant to: closed then, though it keeps its side
    open (over TLS, no half-close tells a client that reads to EOF that the answer is over)."""
    loop = asyncio.get_running_loop()
    async with accepted() as (stream, peer):
        body, seen = 3 * 131072, []

        def through(data: bytes) -> bool:
            seen.append(len(data))
            return sum(seen) >= body

        closing = asyncio.create_task(lingering_close(stream, stream, timeout=60, through=through))
        await loop.sock_sendall(peer, b"x" * body)  # and never closes nor goes silent long
        assert await asyncio.wait_for(closing, 5) == body
        assert stream.is_closing()
        assert await asyncio.wait_for(read_to_eof(peer), 5) == b""  # a FIN: no reset
