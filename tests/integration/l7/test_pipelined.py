"""Pipelining and optimistic clients: what a client sends past a request before it has the
answer loses nothing. A refused request's answer reaches a client that keeps writing (pipelined
requests after it, a CONNECT's tunnel bytes sent before the 200), and a pipelined request does
not go out on a kept target connection already known to be closed."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable

import pytest

from tests.integration.l7.env import CLOUD_IP, EDGE_IP, L7, front_client
from tests.integration.l7.test_errors import front_count
from tests.integration.l7.test_stale_upstream import answer_then_close, ask, tls_target
from tests.integration.targets import tcp_server

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
    async with front_client(port, tls=tls, abort=True) as (reader, writer), asyncio.timeout(30):
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
    async with tcp_server(answer_then_close(served), EDGE_IP, l7.spare_port):
        target = f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n"
        head = f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}Connection: close\r\n\r\n"
        follower = f"GET /y HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}\r\n".encode() * 500
        answer = await refused_while_sending(l7, "http", head.encode(), follower)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.endswith(b"\r\n\r\nhi\n"), answer
    assert len(served) == 1


@pytest.mark.parametrize("front", ["http", "https"])
async def test_a_declined_optimistic_upgrade_gets_its_answer(l7: L7, front: str) -> None:
    """An upgrade request whose client sends its new protocol's bytes right after the head,
    before any 101 (an optimistic client), and whose target answers without switching: the
    connection cannot carry more (those bytes are not HTTP), so the front closes it after the
    answer — lingering, as after an optimistic CONNECT's refusal (before: at once, and the
    bytes still coming reset the connection, the answer with it). (From the HTTPS front the
    target is reached over re-originated TLS.)"""
    served: list[int] = []
    tls = tls_target(l7) if front == "https" else None
    handle = answer_then_close(served, abort=tls is not None)
    async with tcp_server(handle, EDGE_IP, l7.spare_port, tls=tls):
        target = f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n"
        head = (
            f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}"
            "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
        )
        answer = await refused_while_sending(l7, front, head.encode(), b"\x81\x05hello" * 5000)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    assert answer.endswith(b"\r\n\r\nhi\n"), answer
    assert len(served) == 1


async def test_a_pipelined_request_after_the_target_closed_goes_on_a_fresh_stream(
    l7: L7,
) -> None:
    """A pipelined POST, its head begun behind the GET before the GET was answered (so the
    parser holds it): the target closes its kept connection after answering the GET, then the
    POST's head is through. Nothing of the POST was sent, so it goes on a fresh stream (before:
    on the closed one, and a POST, not sent again once sent, was answered 502)."""
    served: list[int] = []
    async with (
        tcp_server(answer_then_close(served), EDGE_IP, l7.spare_port),
        front_client(l7.http) as (reader, writer),
    ):
        target = f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n"
        get = f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}\r\n"
        post = f"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}Content-Length: 2\r\n\r\nhi"
        cut = post.index(target)
        await ask(reader, writer, get + post[:cut])  # the GET, and the POST's first line
        await asyncio.sleep(0.6)  # the target closes its side meanwhile
        await ask(reader, writer, post[cut:])
    assert len(served) == 2


def close_notify_with_the_answer(
    ctx: ssl.SSLContext, served: list[str]
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A TLS target (``ctx``) that answers one request per connection ("hi\\n") and ends TLS
    in the same write (its close_notify right behind the answer's record, then its FIN), as a
    server closing an idle kept connection right after answering does; each method served is
    noted in ``served``. TLS by hand (memory BIOs): asyncio's would write the close_notify in
    a write of its own."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(incoming, outgoing, server_side=True)

        async def more() -> None:
            writer.write(outgoing.read())
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("the client left")
            incoming.write(data)

        try:
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    await more()
            writer.write(outgoing.read())
            got = b""
            while b"\r\n\r\n" not in got or (got.startswith(b"POST") and not got.endswith(b"hi")):
                try:
                    got += tls.read(65536)
                except ssl.SSLWantReadError:
                    await more()
            served.append(got.split(b" ", 1)[0].decode())
            tls.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi\n")
            with contextlib.suppress(ssl.SSLWantReadError):
                tls.unwrap()  # the close_notify (the peer's is not waited for)
            writer.write(outgoing.read())  # the answer's record and the close_notify: one write
        finally:
            writer.close()

    return handle


@pytest.mark.parametrize("route", ["tunnel", "direct"])
async def test_a_pipelined_post_behind_an_answer_that_ended_tls_goes_on_a_fresh_one(
    l7: L7, route: str
) -> None:
    """A POST pipelined (in one write) behind a GET to a TLS target (re-originated TLS, over a
    tunnel stream or a direct route's connection) that ends TLS with its answer: the
    close_notify comes in the same read as the answer, so it is known when the answer ends,
    before the POST (parsed already) goes out. It goes on a fresh connection (before: on the
    ended TLS session, answered 502)."""
    served: list[str] = []
    if route == "tunnel":
        ip, port, node = EDGE_IP, l7.spare_port, "edge-1"
        url, host = f"https://edge-1:{port}/x", "edge-1"
        extra = ""
    else:
        ip, port, node = CLOUD_IP, l7.cloud_port, "cloud-1"
        url, host = "/x", "127.0.0.1"
        extra = f"X-Tunnel-Proxy-Host: cloud-1:{port}\r\n"
    async with (
        tcp_server(close_notify_with_the_answer(tls_target(l7, node), served), ip, port),
        front_client(l7.http) as (reader, writer),
    ):
        get = f"GET {url} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n"
        post = f"POST {url} HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Length: 2\r\n\r\nhi"
        writer.write((get + post).encode())
        for _ in range(2):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert await reader.readexactly(3) == b"hi\n"
    assert served == ["GET", "POST"]
