"""Pipelining and optimistic clients: what a client sends past a request before it has the
answer loses nothing. A refused request's answer reaches a client that keeps writing (pipelined
requests after it, a CONNECT's tunnel bytes sent before the 200), and a pipelined request does
not go out on a kept target connection already known to be closed."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from tests.integration.l7.env import EDGE_IP, L7
from tests.integration.l7.test_errors import front_count
from tests.integration.l7.test_stale_upstream import answer_then_close, ask

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

MORE = 8 * 1024 * 1024
"""Bytes a client sends past the refused head: more than the front takes in one read and than
loopback's socket buffers hold on both ends, so some are still on their way when it refuses."""


async def refused_while_sending(l7: L7, front: str, head: bytes, more: bytes) -> bytes:
    """Send ``head`` and then ``more`` (repeated to :data:`MORE` bytes) to ``front``, all of it
    before reading; then read the answer (head and its Content-Length of body). A front that
    closes while bytes are still coming resets the connection (RST): the writes, or the read,
    fail with ConnectionResetError and the answer is lost. (Over TLS the front's transport
    sends a close_notify and drops what comes until the client's FIN, so it resets nothing,
    but a client's TLS stack may stop writing at the close_notify, as asyncio's does: the
    front lingers there too when it knows more is coming — here, in the head's record.)"""
    tls = ssl.create_default_context(cafile=str(l7.ca)) if front == "https" else None
    port = l7.http if front == "http" else l7.https
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        async with asyncio.timeout(30):
            writer.write(head + more)  # over TLS: the head's record carries more
            for _ in range(MORE // len(more)):
                writer.write(more)
                await writer.drain()  # the old front's reset fails this (or the read below)
            answer = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":")[1])
                for line in answer.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            return answer + await reader.readexactly(length)
    finally:
        writer.transport.abort()


@pytest.mark.parametrize("front", ["http", "https"])
async def test_a_refused_request_with_pipelined_followers_gets_its_answer(
    l7: L7, front: str
) -> None:
    """A whole request refused (an unknown node) with pipelined requests after it, still
    arriving: the front answers, then lingers (half-closes over plain TCP, reads and drops what
    comes) instead of closing a socket that gets more bytes — which resets the connection, and
    the answer with it (before: closed at once, as if the client were done)."""
    before = await l7.cluster.metrics()
    request = b"GET /a HTTP/1.1\r\nHost: edge-9:80\r\n\r\n"
    follower = b"GET /b HTTP/1.1\r\nHost: edge-9:80\r\n\r\n" * 1000
    answer = await refused_while_sending(l7, front, request, follower)
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]
    assert answer.endswith(b"\r\n\r\nedge-9: unknown node\n"), answer
    after = await l7.cluster.metrics()
    assert front_count(after, front, 404) == front_count(before, front, 404) + 1


@pytest.mark.parametrize("front", ["http", "https"])
async def test_a_refused_optimistic_connect_gets_its_answer(l7: L7, front: str) -> None:
    """A CONNECT refused (an unknown node) whose client sent its tunnel's bytes right after the
    head, before the 200 (an optimistic client): it gets the refusal, not a reset (before: the
    front closed at once, a CONNECT not being "midway" in a request)."""
    before = await l7.cluster.metrics()
    head = b"CONNECT edge-9:80 HTTP/1.1\r\nHost: edge-9:80\r\n\r\n"
    answer = await refused_while_sending(l7, front, head, b"\x16\x03\x01" * 20000)
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]
    assert answer.endswith(b"\r\n\r\nedge-9: unknown node\n"), answer
    after = await l7.cluster.metrics()
    assert front_count(after, front, 404) == front_count(before, front, 404) + 1


async def test_an_answer_that_closes_the_connection_reaches_a_pipelining_client(l7: L7) -> None:
    """A request that says ``Connection: close``, pipelined requests after it still arriving:
    its answer is sent, then the connection lingers as after a refusal (before: closed at once,
    and the bytes still coming reset it, the answer with it)."""
    served: list[int] = []
    server = await asyncio.start_server(answer_then_close(served), EDGE_IP, l7.spare_port)
    try:
        target = f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n"
        head = f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}Connection: close\r\n\r\n"
        follower = f"GET /y HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}\r\n".encode() * 500
        answer = await refused_while_sending(l7, "http", head.encode(), follower)
        assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        assert answer.endswith(b"\r\n\r\nhi\n"), answer
        assert len(served) == 1
    finally:
        server.close()
        await server.wait_closed()


async def test_a_pipelined_request_after_the_target_closed_goes_on_a_fresh_stream(
    l7: L7,
) -> None:
    """A pipelined POST, its head begun behind the GET before the GET was answered (so the
    parser holds it): the target closes its kept connection after answering the GET, then the
    POST's head is through. Nothing of the POST was sent, so it goes on a fresh stream (before:
    on the closed one, and a POST, not sent again once sent, was answered 502)."""
    served: list[int] = []
    server = await asyncio.start_server(answer_then_close(served), EDGE_IP, l7.spare_port)
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", l7.http)
        target = f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n"
        get = f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}\r\n"
        post = f"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}Content-Length: 2\r\n\r\nhi"
        cut = post.index(target)
        await ask(reader, writer, get + post[:cut])  # the GET, and the POST's first line
        await asyncio.sleep(0.6)  # the target closes its side meanwhile
        await ask(reader, writer, post[cut:])
        assert len(served) == 2
    finally:
        if writer is not None:
            writer.close()
        server.close()
        await server.wait_closed()
