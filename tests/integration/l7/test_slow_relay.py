"""A relay's client that reads steadily but slowly — slower than the relay's drain (the
transport's buffer from its 1 MiB high mark to its 256 KiB low one) within --idle-timeout — gets
its stream whole: idle is no progress, and the bytes the client takes restart the timeout, as
for an answer (test_slow_client.py). Until this test a relay waited its drain under one
--idle-timeout and cut such a client (counted as an idle relay). A client that stops reading is
still cut within about --idle-timeout of its last byte. CONNECT through the tunnel (the front's
callbacks splice), CONNECT to a target the server dials itself (the relay's tasks), and an
upgraded (101) stream. And a 101 is counted when it is made, also when its client takes none
of it."""

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

IDLE = 0.5
STEP, PAUSE = 16 * 1024, 0.02
"""The slow client: 16 KiB every 0.02 s (at most 800 KiB/s): the relay's 768 KiB between its
high and low marks take about a second, twice --idle-timeout."""
SIZE = 4 * 1024 * 1024
"""More than the relay's high mark (1 MiB) and the kernel's buffers hold."""
HEAD = 512 * 1024
"""A 101's head larger than the buffers: a client that reads nothing leaves it waiting."""
IDLE_KEY = 'ravenproxy_server_idle_timeouts_total{{front="http",relay="{}"}}'


async def stream_out(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A target that sends :data:`SIZE` bytes once it heard from the client; an upgrade
    request is answered 101 first (a ``big`` one: with a :data:`HEAD`-sized field, and
    nothing after)."""
    first = await reader.read(4)
    if first == b"GET ":
        head = await reader.readuntil(b"\r\n\r\n")
        big = b"/big" in head.split(b"\r\n", 1)[0]
        field = b"X-Pad: " + b"p" * HEAD + b"\r\n" if big else b""
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: raw\r\n"
            + field
            + b"\r\n"
        )
        if big:
            await reader.read()
            return
    writer.write(b"y" * SIZE)
    await writer.drain()
    await reader.read()


@contextlib.asynccontextmanager
async def served(cluster: Cluster, route: str) -> AsyncIterator[str]:
    """A server (--idle-timeout :data:`IDLE`) and agent; the target's host:port, through the
    tunnel (``tunnel``: edge-1) or dialled by the server itself (``direct``: cloud-1)."""
    async with tcp_server(stream_out) as port:
        allow = ("--allow", f"127.0.0.1:{port}") if route == "direct" else ()
        flags = ("--idle-timeout", str(IDLE), "--max-header-size", str(2 * HEAD), *allow)
        async with bed(cluster, *flags, allow=(port,)):
            yield f"{'cloud-1' if route == 'direct' else 'edge-1'}:{port}"


@contextlib.asynccontextmanager
async def slow_client(
    port: int, holds: int = 64 * 1024
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client whose socket holds little (``holds``: its receive buffer; Ethernet's segment
    size announced: the server's kernel holds ~50 KiB for it): what it has not read stays in
    the server's buffers."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, holds)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1400)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=STEP)
    try:
        yield reader, writer
    finally:
        writer.transport.abort()


async def opened(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, kind: str
) -> None:
    """CONNECT (``connect``) or an upgrade (``upgrade``) to ``host``, up to its 200 or 101."""
    if kind == "connect":
        # Then "RAW ", the target's cue (an upgrade's is its request).
        writer.write(f"CONNECT {host} HTTP/1.1\r\nHost: {host}\r\n\r\nRAW ".encode())
        want = b"HTTP/1.1 200 "
    else:
        writer.write(
            f"GET /up HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: raw\r\n\r\n"
            "".encode()
        )
        want = b"HTTP/1.1 101 "
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(want), head


async def read_slowly(reader: asyncio.StreamReader, until: float = float("inf")) -> int:
    """How many bytes the connection brings, :data:`STEP` every :data:`PAUSE` seconds, until
    all of :data:`SIZE` came, its end (a reset too) or ``until`` (the loop's time)."""
    got = 0
    loop = asyncio.get_running_loop()
    with contextlib.suppress(ConnectionResetError):
        while got < SIZE and loop.time() < until:
            chunk = await reader.read(STEP)
            if not chunk:
                break
            got += len(chunk)
            await asyncio.sleep(PAUSE)
    return got


CASES = [("tunnel", "connect"), ("direct", "connect"), ("tunnel", "upgrade")]


@pytest.mark.parametrize(("route", "kind"), CASES, ids=["-".join(c) for c in CASES])
async def test_a_slow_relay_client_that_reads_steadily_gets_its_stream_whole(
    cluster: Cluster, route: str, kind: str
) -> None:
    async with served(cluster, route) as host:
        assert cluster.server is not None
        async with slow_client(cluster.server.ports["http"]) as (reader, writer):
            await opened(reader, writer, host, kind)
            start = time.monotonic()
            got = await read_slowly(reader)
            took = time.monotonic() - start
            assert got == SIZE, f"cut after {got} of {SIZE} bytes"
            assert took > 4 * IDLE  # it was slow: the old relay cut it
        m = await cluster.metrics()
        assert m.get(IDLE_KEY.format(kind), 0) == 0


@pytest.mark.parametrize(("route", "kind"), CASES, ids=["-".join(c) for c in CASES])
async def test_a_slow_relay_client_that_stops_reading_is_cut_within_the_idle_timeout(
    cluster: Cluster, route: str, kind: str
) -> None:
    """It reads steadily for several --idle-timeout, then stops: cut within about
    --idle-timeout (a probe's eighth late at most, the sweep's too, the metrics' polling),
    counted once as an idle relay."""
    key = IDLE_KEY.format(kind)
    async with served(cluster, route) as host:
        assert cluster.server is not None
        async with slow_client(cluster.server.ports["http"]) as (reader, writer):
            await opened(reader, writer, host, kind)
            loop = asyncio.get_running_loop()
            got = await read_slowly(reader, until=loop.time() + 4 * IDLE)
            stopped = time.monotonic()
            assert got < SIZE
            assert not (await cluster.metrics()).get(key), "cut while it read steadily"
            for _ in range(200):
                m = await cluster.metrics()
                if m.get(key):
                    break
                await asyncio.sleep(0.05)
            cut = time.monotonic() - stopped
            assert m.get(key) == 1, (cut, got)
        # Measured from the client's last read, not from the server's last look at its progress
        # (every eighth of IDLE; the window's update after that read; the read's PAUSE before
        # `stopped`): the cut may come up to ~IDLE/4 early by this clock (0.425 s of 0.5 seen).
        assert IDLE * 0.5 <= cut <= IDLE * 6, cut  # (a busy machine's timers are late)


async def test_a_101_is_counted_when_made_though_its_client_takes_none_of_it(
    cluster: Cluster,
) -> None:
    """The 101's head (larger than the buffers) waits for a client that reads nothing: the
    client is cut at --idle-timeout (an idle request); the 101 was made, and counted, before
    (53cce6d counted it after the drain: not at all)."""
    async with served(cluster, "tunnel") as host:
        assert cluster.server is not None
        async with slow_client(cluster.server.ports["http"], 4096) as (_, writer):
            writer.write(
                f"GET /big HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: raw\r\n"
                "\r\n".encode()
            )
            for _ in range(200):
                m = await cluster.metrics()
                if m.get(IDLE_KEY.format("request")):
                    break
                await asyncio.sleep(0.05)
        assert m.get(IDLE_KEY.format("request")) == 1
        assert m.get('ravenproxy_server_front_requests_total{front="http",status="101"}') == 1


async def slow_target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads what comes, :data:`STEP` bytes every :data:`PAUSE` seconds, to the EOF; answers
    how many."""
    got = 0
    while chunk := await reader.read(STEP):
        got += len(chunk)
        await asyncio.sleep(PAUSE)
    writer.write(str(got).encode())
    await writer.drain()
    writer.close()


async def test_a_dialled_target_that_reads_an_upload_steadily_gets_it_whole(
    cluster: Cluster,
) -> None:
    """The other way: CONNECT to a target the server dials, which reads the client's upload
    slowly (its socket holds little): the relay's drain of the target's socket (the dialled
    stream's 64 KiB high mark, a read of up to 1 MiB from the client at a time) is no idleness
    while the target takes bytes."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # the accepted's
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1400)
    server = await asyncio.start_server(slow_target, sock=listener, limit=STEP)
    port = listener.getsockname()[1]
    try:
        flags = ("--idle-timeout", str(IDLE), "--allow", f"127.0.0.1:{port}")
        async with bed(cluster, *flags), slow_client(cluster.http_port) as (reader, writer):
            await opened(reader, writer, f"cloud-1:{port}", "connect")
            start = time.monotonic()
            writer.write(b"u" * SIZE)
            writer.write_eof()
            async with asyncio.timeout(60):
                answer = await reader.read()
            took = time.monotonic() - start
            assert answer == str(len(b"RAW ") + SIZE).encode(), answer
            assert took > 4 * IDLE  # it was slow: the old relay cut it
            m = await cluster.metrics()
            assert m.get(IDLE_KEY.format("connect"), 0) == 0
    finally:
        server.close()
        await server.wait_closed()
