"""A kept-alive connection to a target that the target closed while idle: the next request on
the client's connection goes out again on a fresh one (it had no body, so that is safe)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.integration.l7.env import CLOUD_IP, EDGE_IP, L7, front_client
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


async def ask(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: str | bytes
) -> None:
    """Send ``request`` on the client's connection; its answer is the target's 200 "hi"."""
    writer.write(request.encode() if isinstance(request, str) else request)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await reader.readexactly(3) == b"hi\n"


def answer_then_close(
    served: list[int], *, abort: bool = False
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A target that answers one request, then closes the idle connection a moment later (as
    a keep-alive timeout would); each request served is counted in ``served``. ``abort``: the
    TCP connection goes at once (over TLS, asyncio's close would wait up to 30 s for the peer's
    close_notify, which a kubelet does not)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        served.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        if abort:
            writer.transport.abort()
        else:
            writer.close()

    return handle


async def test_request_after_the_target_closed_an_idle_connection(l7: L7) -> None:
    served: list[int] = []
    async with (
        tcp_server(answer_then_close(served), EDGE_IP, l7.spare_port),
        front_client(l7.http) as (reader, writer),
    ):
        request = (
            f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n\r\n"
        ).encode()
        for _ in range(2):
            await ask(reader, writer, request)
            await asyncio.sleep(0.5)  # the target closes its side meanwhile
    assert len(served) == 2


async def test_a_kept_stream_the_target_ends_while_the_client_idles_is_let_go(l7: L7) -> None:
    """The target closes its idle keep-alive connection: the server lets the kept tunnel stream
    (and the client's stream slot, --max-streams-per-client) go at once, not at the client's
    next request or its 300 s keep-alive timeout; that next request opens a fresh one."""
    streams = "ravenproxy_server_streams_open"
    served: list[int] = []
    async with tcp_server(answer_then_close(served), EDGE_IP, l7.spare_port):
        before = (await l7.cluster.metrics())[streams]
        async with front_client(l7.http) as (reader, writer):
            request = (
                f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n\r\n"
            ).encode()
            await ask(reader, writer, request)
            # The client idles on its kept-alive connection; the target has closed its side.
            await l7.cluster.wait_metric(streams, lambda v: v <= before, timeout=10)
            await ask(reader, writer, request)  # the next request goes out on a fresh stream
    assert len(served) == 2


def tls_target(l7: L7, node: str = "edge-1") -> ssl.SSLContext:
    """``node``'s kubelet serving certificate (the kubelet CA's): a target the server
    re-originates TLS to (an ``https://`` request, or a node's kubelet port), verified as it
    verifies the kubelet."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    pki = l7.base / "kubelet-pki"
    ctx.load_cert_chain(pki / f"{node}.crt", pki / f"{node}.key")
    return ctx


async def post_after_the_kept_tls_stream_went(l7: L7) -> None:
    """Through the HTTP front, a GET to edge-1's TLS target on the spare port (TLS re-originated
    over a tunnel stream), then, on the same client connection once the server has let the
    kept stream go (the target ended it), a POST: each answered 200 "hi"."""
    streams = "ravenproxy_server_streams_open"
    before = (await l7.cluster.metrics())[streams]
    async with front_client(l7.http) as (reader, writer):
        get = f"GET https://edge-1:{l7.spare_port}/x HTTP/1.1\r\nHost: edge-1\r\n\r\n"
        await ask(reader, writer, get)
        # The client idles on its kept-alive connection; the target has closed its side.
        await l7.cluster.wait_metric(streams, lambda v: v <= before, timeout=10)
        post = (
            f"POST https://edge-1:{l7.spare_port}/x HTTP/1.1\r\nHost: edge-1\r\n"
            "Content-Length: 2\r\n\r\nhi"
        )
        await ask(reader, writer, post)


async def test_a_kept_tls_stream_the_target_ends_while_the_client_idles_is_let_go(l7: L7) -> None:
    """As above, over re-originated TLS: the kept stream is TLS over a tunnel stream, and the
    connection waits for its next request in its task, not by callbacks. The target's end is
    noticed there too: the stream and the client's slot go at once, and the next request — a
    POST, which is not sent again on a fresh connection once sent on a dead one — is answered
    on a fresh stream."""
    served: list[int] = []
    target = answer_then_close(served, abort=True)
    async with tcp_server(target, EDGE_IP, l7.spare_port, tls=tls_target(l7)):
        await post_after_the_kept_tls_stream_went(l7)
    assert len(served) == 2


async def test_a_kept_direct_connection_the_target_ends_while_the_client_idles_is_let_go(
    l7: L7,
) -> None:
    """As above, on a direct route (the server's own node, no agent; its kubelet port, so TLS
    re-originated over the server's own connection): the server notices the target's end of the
    kept connection while the client idles and lets it go, so the next request — a POST, not
    sent again once sent on a dead connection — goes out on a fresh one (before: it went out on
    the dead one and was answered 502)."""
    served: list[int] = []
    async with (
        tcp_server(
            answer_then_close(served, abort=True),
            CLOUD_IP,
            l7.cloud_port,
            tls=tls_target(l7, "cloud-1"),
        ),
        front_client(l7.http) as (reader, writer),
    ):
        target = f"X-Tunnel-Proxy-Host: cloud-1:{l7.cloud_port}\r\n"
        await ask(reader, writer, f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}\r\n")
        await asyncio.sleep(0.6)  # the client idles; the target closes its side meanwhile
        post = f"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}Content-Length: 2\r\n\r\nhi"
        await ask(reader, writer, post)
    assert len(served) == 2


@contextlib.asynccontextmanager
async def close_notify_target(
    l7: L7, served: list[int], host: str, port: int, node: str
) -> AsyncIterator[None]:
    """:func:`answer_then_close` over TLS (``node``'s certificate) on ``host:port`` while the
    block runs, closing as asyncio does: a close_notify, then the TCP side kept open up to 30 s
    for the peer's (so only TLS ends); those still waiting out their TLS shutdown are aborted
    when the block ends."""
    targets: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        targets.append(writer)
        await answer_then_close(served)(reader, writer)

    async with tcp_server(handle, host, port, tls=tls_target(l7, node)):
        try:
            yield
        finally:
            for each in targets:
                each.transport.abort()


async def test_a_kept_direct_tls_connection_the_target_ends_with_close_notify_is_let_go(
    l7: L7,
) -> None:
    """As above, the target ending only TLS (a close_notify; its TCP side open): the kept
    connection is let go all the same, and the POST goes out on a fresh one (before: it went
    out on the ended TLS session and was answered 502)."""
    served: list[int] = []
    async with (
        close_notify_target(l7, served, CLOUD_IP, l7.cloud_port, "cloud-1"),
        front_client(l7.http) as (reader, writer),
    ):
        target = f"X-Tunnel-Proxy-Host: cloud-1:{l7.cloud_port}\r\n"
        await ask(reader, writer, f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}\r\n")
        await asyncio.sleep(0.6)  # the client idles; the target sends its close_notify
        post = f"POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{target}Content-Length: 2\r\n\r\nhi"
        await ask(reader, writer, post)
    assert len(served) == 2


async def test_a_kept_tls_stream_the_target_ends_with_close_notify_is_let_go(l7: L7) -> None:
    """The same over a tunnel stream (an agent's target): its stream and the client's slot
    go while the client idles, and the POST is answered on a fresh stream (before: 502)."""
    served: list[int] = []
    async with close_notify_target(l7, served, EDGE_IP, l7.spare_port, "edge-1"):
        await post_after_the_kept_tls_stream_went(l7)
    assert len(served) == 2
