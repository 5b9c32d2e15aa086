"""Review of branch stray through real processes: legitimate answers on a kept target connection
are never taken for stray bytes.

A target answers one client connection's requests, all on one target connection, with every
framing a kept connection carries — Content-Length (empty too), chunked with extensions and
trailers, a 103 before the final answer, 204, 304 with a Content-Length, a HEAD's answer (which
ends the connection: the next one is fresh) — each written in pieces a moment apart (the last
byte alone, the head and body apart), the client idling a moment between some requests.
Over a tunnel stream (callbacks), TLS over one (the task; Python's TLS 1.3 server sends its
session tickets after the handshake) and a direct route's TLS connection: every answer reaches
the client whole, no connection is let go but the HEAD's, and
``ravenproxy_server_upstream_stray_total`` does not move.
"""

from __future__ import annotations

import asyncio
import ssl

import h11
import pytest

from tests.integration.l7.env import CLOUD_IP, EDGE_IP, L7, front_client
from tests.integration.l7.test_stale_upstream import tls_target
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

STRAY = 'ravenproxy_server_upstream_stray_total{front="http"}'

# (method, the answer's pieces, written a moment apart; the body the client gets)
ANSWERS: list[tuple[str, list[bytes], bytes]] = [
    ("GET", [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhell", b"o"], b"hello"),
    ("GET", [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", b"\r\n"], b""),
    (
        "GET",
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"3;ext=1\r\nabc\r\n",
            b"2\r\nde\r\n0\r\nX-Trailer: t\r\n",
            b"\r\n",
        ],
        b"abcde",
    ),
    (
        "GET",
        [
            b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
        ],
        b"hi",
    ),
    ("GET", [b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n"], b""),
    ("GET", [b'HTTP/1.1 304 Not Modified\r\nETag: "e"\r\nContent-Length: 57\r\n\r\n'], b""),
    ("GET", [b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", b"x", b"y", b"z"], b"xyz"),
    ("HEAD", [b"HTTP/1.1 200 OK\r\nContent-Length: 57\r\n\r\n"], b""),
    ("GET", [b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast"], b"last"),
]


def target(connections: list[int]) -> object:
    """Answers the n-th request of all its connections with ``ANSWERS[n]``, in its pieces."""
    served = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            await reader.readuntil(b"\r\n\r\n")
            _, pieces, _ = ANSWERS[served[0] % len(ANSWERS)]
            served[0] += 1
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.02)

    return handle


async def conversation(l7: L7, url: str, host: str, extra: str) -> None:
    before = (await l7.cluster.metrics()).get(STRAY, 0.0)
    client = h11.Connection(h11.CLIENT)
    async with front_client(l7.http) as (reader, writer):
        for n, (method, _, body) in enumerate(ANSWERS):
            headers = [("Host", host)] + ([("X-Tunnel-Proxy-Host", extra)] if extra else [])
            writer.write(client.send(h11.Request(method=method, target=url, headers=headers)))
            writer.write(client.send(h11.EndOfMessage()))
            got, status = b"", 0
            while True:
                event = client.next_event()
                if event is h11.NEED_DATA:
                    data = await asyncio.wait_for(reader.read(65536), 10)
                    assert data, f"the front closed at answer {n}"
                    client.receive_data(data)
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    got += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            final = [p for p in b"".join(ANSWERS[n][1]).split(b"HTTP/1.1 ") if p][-1]
            assert (status, got) == (int(final[:3]), body), n
            assert client.our_state is h11.DONE and client.their_state is h11.DONE
            client.start_next_cycle()
            if n % 3 == 2:
                await asyncio.sleep(0.3)  # the client idles: the kept connection is hooked
    after = (await l7.cluster.metrics()).get(STRAY, 0.0)
    assert after == before


@pytest.mark.parametrize("route", ["tunnel", "tls-over-tunnel", "direct-tls"])
async def test_legitimate_answers_keep_the_connection_uncounted(l7: L7, route: str) -> None:
    connections: list[int] = []
    tls: ssl.SSLContext | None = None
    host_ip, port = EDGE_IP, l7.spare_port
    if route == "tls-over-tunnel":
        tls = tls_target(l7)
    elif route == "direct-tls":
        tls, host_ip, port = tls_target(l7, "cloud-1"), CLOUD_IP, l7.cloud_port
    async with tcp_server(target(connections), host_ip, port, tls=tls):  # type: ignore[arg-type]
        if route == "tunnel":
            await conversation(l7, "/x", "127.0.0.1", f"edge-1:{port}")
        elif route == "tls-over-tunnel":
            await conversation(l7, f"https://edge-1:{port}/x", "edge-1", "")
        else:
            await conversation(l7, "/x", "127.0.0.1", f"cloud-1:{port}")
    # One connection up to the HEAD's answer (which ends it), one after.
    assert len(connections) == 2, connections


def closes_when_idle(connections: list[int]) -> object:
    """Answers one request a connection, then ends it a moment later (over TLS: close_notify,
    then the FIN), as a target closes an idle kept-alive connection."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.1)

    return handle


@pytest.mark.parametrize("route", ["tunnel", "tls-over-tunnel", "direct-tls"])
async def test_a_target_that_ends_an_idle_kept_connection_is_not_counted_stray(
    l7: L7, route: str
) -> None:
    """Its end (a FIN; over TLS a close_notify first) lets the kept connection go, as at
    812de76, and is no stray byte: the counter does not move."""
    connections: list[int] = []
    tls: ssl.SSLContext | None = None
    host_ip, port = EDGE_IP, l7.spare_port
    url, host, hop = "/x", "127.0.0.1", f"edge-1:{port}"
    if route == "tls-over-tunnel":
        tls, url, host, hop = tls_target(l7), f"https://edge-1:{port}/x", "edge-1", ""
    elif route == "direct-tls":
        tls, host_ip, port = tls_target(l7, "cloud-1"), CLOUD_IP, l7.cloud_port
        hop = f"cloud-1:{port}"
    request = f"GET {url} HTTP/1.1\r\nHost: {host}\r\n"
    request += f"X-Tunnel-Proxy-Host: {hop}\r\n\r\n" if hop else "\r\n"
    async with tcp_server(closes_when_idle(connections), host_ip, port, tls=tls):  # type: ignore[arg-type]
        before = (await l7.cluster.metrics()).get(STRAY, 0.0)
        async with front_client(l7.http) as (reader, writer):
            for _ in range(2):
                writer.write(request.encode())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200") and b"close" not in head.lower()
                assert await asyncio.wait_for(reader.readexactly(2), 10) == b"ok"
                await asyncio.sleep(0.5)  # the target ends the kept connection meanwhile
        assert (await l7.cluster.metrics()).get(STRAY, 0.0) == before
    assert len(connections) == 2
