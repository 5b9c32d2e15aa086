"""A target that closes an idle kept connection with a ``408 Request Timeout`` first (nginx's
``keepalive_timeout`` does not, Apache and others do): that is the connection's normal end, as
Go's net/http transport takes it (``is408Message``), not an answer nobody asked for. Until this
test the server counted it in ``ravenproxy_server_upstream_stray_total`` and logged an info
line per close. Now: let go at once (the client's next request goes on a fresh connection and
gets its own answer), a debug line, not counted. Through real processes: a tunnel stream (the
next request served by callbacks), TLS over one (served by the task), and a direct route's TLS
connection (the server's own node)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests.integration.l7.env import CLOUD_IP, EDGE_IP, L7, front_client
from tests.integration.l7.test_stale_upstream import tls_target
from tests.integration.l7.test_stray_answer import answer
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

STRAY = "ravenproxy_server_upstream_stray_total"
TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 19\r\n\r\n"
    b"Request Timeout\r\n\r\n"
)


def times_out(
    served: list[int],
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A target that answers a connection's one request (the first of all ``ok``, later ones
    ``second``), then, 0.2 s later while the client idles, sends a 408 and closes it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        served.append(1)
        body = b"ok" if len(served) == 1 else b"second"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(TIMEOUT_408)
        await writer.drain()
        if writer.get_extra_info("ssl_object") is not None:
            writer.transport.abort()  # asyncio's TLS close would wait for our close_notify

    return handle


async def twice(l7: L7, request: bytes) -> None:
    """``request`` twice on one client connection, an idle half second between (the target's
    408 and close meanwhile): the answers ``ok`` then ``second``; nothing counted as stray, no
    info line about it."""
    before = (await l7.cluster.metrics()).get(f'{STRAY}{{front="http"}}', 0.0)
    log_before = l7.server_log().count("bytes nobody asked for")
    async with front_client(l7.http) as (reader, writer):
        writer.write(request)
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and body == b"ok", head + body
        await asyncio.sleep(0.5)
        writer.write(request)
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and body == b"second", head + body
    after = (await l7.cluster.metrics()).get(f'{STRAY}{{front="http"}}', 0.0)
    assert after == before
    assert l7.server_log().count("bytes nobody asked for") == log_before


async def test_over_a_tunnel_stream(l7: L7) -> None:
    served: list[int] = []
    async with tcp_server(times_out(served), EDGE_IP, l7.spare_port):
        hop = f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}"
        await twice(l7, f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{hop}\r\n\r\n".encode())
    assert len(served) == 2


async def test_over_tls_over_a_tunnel_stream(l7: L7) -> None:
    served: list[int] = []
    async with tcp_server(times_out(served), EDGE_IP, l7.spare_port, tls=tls_target(l7)):
        url = f"https://edge-1:{l7.spare_port}/x"
        await twice(l7, f"GET {url} HTTP/1.1\r\nHost: edge-1\r\n\r\n".encode())
    assert len(served) == 2


async def test_over_tls_on_a_direct_route(l7: L7) -> None:
    served: list[int] = []
    target = times_out(served)
    async with tcp_server(target, CLOUD_IP, l7.cloud_port, tls=tls_target(l7, "cloud-1")):
        hop = f"X-Tunnel-Proxy-Host: cloud-1:{l7.cloud_port}"
        await twice(l7, f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{hop}\r\n\r\n".encode())
    assert len(served) == 2
