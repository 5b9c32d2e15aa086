"""A target that sends more than its answer — ``Content-Length: 2`` and more bytes (garbage,
or a whole answer nobody asked for), in the answer's read or a moment later, while the client's
connection idles — must not have those bytes become the client's next answer (a response
desync: until 812de76 they did; garbage failed the next request, which a GET then retried on a
fresh connection, a POST got 502). The server
lets that target connection go (counted in ``ravenproxy_server_upstream_stray_total``), keeps
the client's, and the client's next request goes on a fresh one and gets its own answer.
Through real processes: a tunnel stream (the next request served by callbacks), TLS over one
(served by the task), and a direct route's TLS connection (the server's own node)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tests.integration.l7.env import CLOUD_IP, EDGE_IP, L7, front_client
from tests.integration.l7.test_stale_upstream import tls_target
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

STRAY = "ravenproxy_server_upstream_stray_total"


EXTRA = {
    "garbage": b"xyz\r\n\r\n",
    # A whole answer nobody asked for: kept, it was the next request's (812de76).
    "answer": b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz",
}


def overlong(
    served: list[int], *, later: bool, extra: str
) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    """A target whose first answer (of all its connections) says ``Content-Length: 2`` and
    sends ``ok`` and more (:data:`EXTRA`; ``later``: 0.2 s after ``ok``, while the client
    idles), and whose later answers are ``second``, each on whichever connection asked."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            served.append(1)
            if len(served) > 1:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")
            elif later:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
                await asyncio.sleep(0.2)
                writer.write(EXTRA[extra])
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + EXTRA[extra])
            await writer.drain()

    return handle


async def answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """The next answer on the client's connection: its head and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await asyncio.wait_for(reader.readexactly(length), 10)


async def twice(l7: L7, request: bytes) -> None:
    """``request`` twice on one client connection, an idle half second between: the first
    answered ``ok``, the second ``second``; one stray connection counted."""
    before = (await l7.cluster.metrics()).get(f'{STRAY}{{front="http"}}', 0.0)
    async with front_client(l7.http) as (reader, writer):
        writer.write(request)
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and body == b"ok", head + body
        await asyncio.sleep(0.5)
        writer.write(request)
        head, body = await answer(reader)
        assert head.startswith(b"HTTP/1.1 200") and body == b"second", head + body
    after = (await l7.cluster.metrics()).get(f'{STRAY}{{front="http"}}', 0.0)
    assert after == before + 1


@pytest.mark.parametrize("extra", EXTRA)
@pytest.mark.parametrize("later", [False, True], ids=["same-read", "later"])
async def test_over_a_tunnel_stream(l7: L7, later: bool, extra: str) -> None:
    served: list[int] = []
    async with tcp_server(overlong(served, later=later, extra=extra), EDGE_IP, l7.spare_port):
        hop = f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}"
        await twice(l7, f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{hop}\r\n\r\n".encode())
    assert len(served) == 2


@pytest.mark.parametrize("extra", EXTRA)
@pytest.mark.parametrize("later", [False, True], ids=["same-read", "later"])
async def test_over_tls_over_a_tunnel_stream(l7: L7, later: bool, extra: str) -> None:
    served: list[int] = []
    target = overlong(served, later=later, extra=extra)
    async with tcp_server(target, EDGE_IP, l7.spare_port, tls=tls_target(l7)):
        url = f"https://edge-1:{l7.spare_port}/x"
        await twice(l7, f"GET {url} HTTP/1.1\r\nHost: edge-1\r\n\r\n".encode())
    assert len(served) == 2


@pytest.mark.parametrize("extra", EXTRA)
@pytest.mark.parametrize("later", [False, True], ids=["same-read", "later"])
async def test_over_tls_on_a_direct_route(l7: L7, later: bool, extra: str) -> None:
    served: list[int] = []
    target = overlong(served, later=later, extra=extra)
    async with tcp_server(target, CLOUD_IP, l7.cloud_port, tls=tls_target(l7, "cloud-1")):
        hop = f"X-Tunnel-Proxy-Host: cloud-1:{l7.cloud_port}"
        await twice(l7, f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n{hop}\r\n\r\n".encode())
    assert len(served) == 2
