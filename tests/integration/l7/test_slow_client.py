"""A client that reads its answer steadily but slowly — slower than the transport's buffer
drains from its high mark to its low one within --idle-timeout — gets it whole: an idle
timeout is about no progress (HAProxy's ``timeout client``, Envoy's ``idle_timeout``), and the
bytes the client takes restart it. Until this test the front waited for each write's drain
under one --idle-timeout and cut such a client mid-answer (counted as an idle request). A
client that stops reading is still cut, within about --idle-timeout of its last byte. For an
answer over the tunnel (the first request, the connection's task; a later one, its
callbacks) and for a refusal larger than the buffers (a 404 naming a long unknown node)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator

import pytest

from tests.integration.cluster import Cluster
from tests.integration.l7.test_limits import bed
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

IDLE = 0.25
STEP, PAUSE = 4096, 0.05
"""The slow client: 4 KiB every 0.05 s (80 KiB/s): the 48 KiB between the transport's high and
low marks take 0.6 s, more than twice --idle-timeout."""
SIZE = 256 * 1024
"""More than the kernel's buffers (~50 KiB, the client's segments Ethernet's) and the
transport's high mark hold: the old front cut the slow client after ~200 KiB."""
KEY = 'ravenproxy_server_idle_timeouts_total{front="http",relay="request"}'


async def sized(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A target that answers ``GET /N`` with N bytes, at once."""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        size = int(head.split(b" ")[1][1:])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size + b"x" * size)
        await writer.drain()


@contextlib.asynccontextmanager
async def slow_client(
    port: int,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client whose socket holds little (4 KiB receive buffer, a 2 KiB stream limit): what
    it has not read stays in the server's buffers."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # Ethernet's segment size announced: the server's kernel sizes its send buffer by segments
    # (~50 KiB taken here; loopback's 64 KiB ones: megabytes, and the front's buffer nothing).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1400)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=STEP // 2)
    try:
        yield reader, writer
    finally:
        writer.transport.abort()


async def read_slowly(reader: asyncio.StreamReader, until: float = float("inf")) -> bytes:
    """What the connection brings, :data:`STEP` bytes every :data:`PAUSE` seconds, until its
    end (a reset too) or ``until`` (the loop's time)."""
    got = bytearray()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionResetError):
        while loop.time() < until:
            chunk = await reader.read(STEP)
            if not chunk:
                break
            got += chunk
            await asyncio.sleep(PAUSE)
    return bytes(got)


def body_of(answer: bytes) -> tuple[bytes, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


@pytest.mark.parametrize("later", [False, True], ids=["first", "later"])
async def test_a_slow_client_that_reads_steadily_gets_its_whole_answer(
    cluster: Cluster, later: bool
) -> None:
    async with tcp_server(sized) as port:
        async with bed(cluster, "--idle-timeout", str(IDLE), allow=(port,)):
            async with slow_client(cluster.http_port) as (reader, writer):
                host = f"edge-1:{port}"
                if later:  # the next request is served by the connection's callbacks
                    writer.write(f"GET /6 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                    async with asyncio.timeout(10):
                        await reader.readuntil(b"xxxxxx")
                writer.write(
                    f"GET /{SIZE} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
                )
                start = time.monotonic()
                head, body = body_of(await read_slowly(reader))
                took = time.monotonic() - start
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert len(body) == SIZE, f"cut after {len(body)} of {SIZE} bytes"
            assert took > 4 * IDLE  # it was slow: the old front cut it
            m = await cluster.metrics()
            assert m.get(KEY, 0) == 0


@pytest.mark.parametrize("later", [False, True], ids=["first", "later"])
async def test_a_slow_client_that_stops_reading_is_cut_within_the_idle_timeout(
    cluster: Cluster, later: bool
) -> None:
    """It reads steadily for a while (several --idle-timeout), then stops: cut within about
    --idle-timeout (a probe's eighth late at most, the sweep's too, the metrics' polling),
    counted once as an idle request."""
    async with tcp_server(sized) as port:
        async with bed(cluster, "--idle-timeout", str(IDLE), allow=(port,)):
            async with slow_client(cluster.http_port) as (reader, writer):
                host = f"edge-1:{port}"
                if later:
                    writer.write(f"GET /6 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                    async with asyncio.timeout(10):
                        await reader.readuntil(b"xxxxxx")
                writer.write(f"GET /{4 * SIZE} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                loop = asyncio.get_running_loop()
                first = await read_slowly(reader, until=loop.time() + 6 * IDLE)
                stopped = time.monotonic()
                assert not (await cluster.metrics()).get(KEY), "cut while it read steadily"
                for _ in range(100):
                    m = await cluster.metrics()
                    if m.get(KEY):
                        break
                    await asyncio.sleep(0.05)
                cut = time.monotonic() - stopped
                assert m.get(KEY) == 1, (cut, len(first))
                rest = bytearray()
                with contextlib.suppress(ConnectionResetError):
                    async with asyncio.timeout(10):
                        while chunk := await reader.read(65536):
                            rest += chunk
            # Measured from the client's last read, not from the server's last look at its progress
            # (every eighth of IDLE; the window's update after that read; the read's PAUSE before
            # `stopped`): the cut may come up to ~IDLE/4 early by this clock (0.425 s of 0.5 seen).
            assert IDLE * 0.5 <= cut <= IDLE * 6, cut  # (a busy machine's timers are late)
            _, body = body_of(first + rest)
            assert len(body) < 4 * SIZE  # reset: its answer could not end whole


async def test_a_slow_client_that_reads_steadily_gets_its_whole_refusal(cluster: Cluster) -> None:
    """404 for an unknown node whose long name the answer says (larger than the buffers)."""
    name = "n" * SIZE
    async with bed(cluster, "--idle-timeout", str(IDLE), "--max-header-size", str(2 * SIZE)):
        async with slow_client(cluster.http_port) as (reader, writer):
            writer.write(f"GET /x HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
            head, body = body_of(await read_slowly(reader))
        assert head.startswith(b"HTTP/1.1 404 "), head[:100]
        assert body == f"{name}: unknown node\n".encode(), f"cut after {len(body)} bytes"
        m = await cluster.metrics()
        assert m['ravenproxy_server_front_requests_total{front="http",status="404"}'] == 1
        assert m.get(KEY, 0) == 0
