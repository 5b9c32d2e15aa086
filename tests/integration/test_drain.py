"""Server drain on SIGTERM, through the CLI: ``/readyz`` turns 503 at once, the fronts stop
accepting, a kept-alive idle client connection does not hold the drain open, an open stream
finishes (every line; also as a kept-alive connection's second request, served by callbacks),
and the process exits 0 as soon as it has; a stream still open at
``--drain-timeout`` is cut and the process exits anyway (bounded).

The stream is a ``kubectl logs -f``-like chunked response from the fake kubelet (one line every
50 ms) on edge-1, through the HTTP front and edge-1's agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import h11
import pytest

from ravenproxy.pki.authority import issue_server_cert
from ravenproxy.pki.pemfiles import load_cert, load_key, write_pem_cert, write_pem_key
from tests.helpers import http_get
from tests.integration.cluster import Cluster, Proc
from tests.integration.l7.env import Kubelet, start_kubelet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Bed:
    def __init__(self, cluster: Cluster, kubelet: Kubelet) -> None:
        self.cluster = cluster
        self.kubelet = kubelet

    @property
    def server(self) -> Proc:
        assert self.cluster.server is not None
        return self.cluster.server

    def host(self) -> str:
        return f"edge-1:{self.kubelet.http_port}"


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    cluster = Cluster(tmp_path)
    ca = load_cert(cluster.certs / "ca.crt")
    ca_key = load_key(cluster.certs / "ca.key")
    cert, key = issue_server_cert(ca, ca_key, ["edge-1", "127.0.0.1"], common_name="edge-1")  # type: ignore[arg-type]
    write_pem_cert(tmp_path / "kubelet.crt", cert)
    write_pem_key(tmp_path / "kubelet.key", key)
    kubelet = start_kubelet(
        tmp_path, "127.0.0.1", tmp_path / "kubelet.crt", tmp_path / "kubelet.key", None
    )
    try:
        yield Bed(cluster, kubelet)
    finally:
        cluster.stop_all()
        kubelet.stop()


async def start(bed: Bed, drain_timeout: float) -> None:
    # The kubelet's certificate is the cluster CA's (an https:// request verifies it).
    kubelet_ca = str(bed.cluster.certs / "ca.crt")
    bed.cluster.start_server("--drain-timeout", str(drain_timeout), "--kubelet-ca-file", kubelet_ca)
    kubelet = bed.kubelet
    bed.cluster.start_agent(
        "edge-1", f"127.0.0.1:{kubelet.http_port}", f"127.0.0.1:{kubelet.tls_port}"
    )
    await bed.cluster.wait_routable(bed.host())


class LogStream:
    """A ``follow=true&lines=N`` response read line by line over the HTTP front."""

    def __init__(self, bed: Bed, lines: int, *, kept_alive: bool = False) -> None:
        self.bed, self.lines = bed, lines
        self.kept_alive = kept_alive
        """The log is the connection's second request (the first answered): a kept-alive
        connection's request, served by callbacks (server/http_callbacks.py)."""
        self.conn = h11.Connection(h11.CLIENT)
        self.received = 0
        self.complete = False
        self.status = 0
        self.first_line = asyncio.Event()

    async def run(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.bed.cluster.http_port)
        if self.kept_alive:
            first = h11.Request(
                method="GET", target="/healthz", headers=[("Host", self.bed.host())]
            )
            writer.write(self.conn.send(first) + self.conn.send(h11.EndOfMessage()))
            while not isinstance(event := self.conn.next_event(), h11.EndOfMessage):
                assert not isinstance(event, h11.ConnectionClosed), "closed before one answer"
                if event is h11.NEED_DATA:
                    self.conn.receive_data(await asyncio.wait_for(reader.read(65536), 10))
            self.conn.start_next_cycle()
        target = f"/containerLogs/default/web-1/app?follow=true&lines={self.lines}"
        request = h11.Request(
            method="GET",
            target=target,
            headers=[("Host", "x"), ("X-Tunnel-Proxy-Host", self.bed.host())],
        )
        writer.write(self.conn.send(request) + self.conn.send(h11.EndOfMessage()))
        try:
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA:
                    data = await asyncio.wait_for(reader.read(65536), 10)
                    self.conn.receive_data(data)
                    if not data:
                        return  # cut: the connection closed before the end of the response
                elif isinstance(event, h11.Response):
                    self.status = event.status_code
                elif isinstance(event, h11.Data):
                    self.received += bytes(event.data).count(b"\n")
                    self.first_line.set()
                elif isinstance(event, h11.EndOfMessage):
                    self.complete = True
                    return
        except h11.RemoteProtocolError:
            return  # cut mid-chunk
        finally:
            writer.close()


async def idle_keepalive(
    bed: Bed, *, tls: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client connection that got one answer and stays open, idle, kept alive. ``tls``: its
    request is an ``https://`` one (TLS re-originated to the kubelet's TLS port): a connection
    its task serves between requests, not callbacks."""
    reader, writer = await asyncio.open_connection("127.0.0.1", bed.cluster.http_port)
    target = f"https://edge-1:{bed.kubelet.tls_port}/healthz" if tls else "/healthz"
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {bed.host()}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)
    return reader, writer


async def readyz(port: int) -> int:
    status, _ = await http_get(port, "/readyz", timeout=2)
    return status


async def wait_exit(proc: Proc, within: float) -> tuple[int, float]:
    """The process's exit code and when it exited (monotonic), or a failure after ``within``."""
    assert proc.popen is not None
    deadline = time.monotonic() + within
    while (code := proc.popen.poll()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"server still running {within:g}s later:\n{proc.output()[-3000:]}")
        await asyncio.sleep(0.02)
    return code, time.monotonic()


@pytest.mark.parametrize("kept_alive", [False, True], ids=["first-request", "kept-alive"])
async def test_sigterm_drains_an_open_stream_then_exits_0(bed: Bed, kept_alive: bool) -> None:
    # kept_alive: the stream is the answer to a kept-alive connection's second request, in the
    # middle of it when the drain starts: finished, not closed as a connection waiting for a
    # next request would be.
    await start(bed, drain_timeout=30)
    health = bed.server.ports["health"]
    assert await readyz(health) == 200
    idle_reader, idle_writer = await idle_keepalive(bed)
    lines = 60  # 3 s of stream
    stream = LogStream(bed, lines, kept_alive=kept_alive)
    reading = asyncio.create_task(stream.run())
    try:
        await asyncio.wait_for(stream.first_line.wait(), 10)

        bed.server.kill(signal.SIGTERM)
        signalled = time.monotonic()
        # /readyz answers 503 at once, so the Service stops sending requests here.
        while await readyz(health) != 503:
            await asyncio.sleep(0.005)
        flipped = time.monotonic() - signalled
        assert flipped < 0.5, f"/readyz still 200 {flipped:.3f}s after SIGTERM"

        # The fronts accept no new connection once draining.
        async def refused() -> bool:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", bed.cluster.http_port)
            except ConnectionRefusedError:
                return True
            except ConnectionResetError:
                # A connect that raced the listener's close (reset out of its accept queue):
                # not an answer either way; the next try sees the port closed.
                return False
            writer.close()
            return False

        deadline = time.monotonic() + 2
        while not await refused():
            assert time.monotonic() < deadline, "the HTTP front still accepts while draining"
            await asyncio.sleep(0.02)

        # The idle kept-alive connection is closed by the server (it holds no request).
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""

        await asyncio.wait_for(reading, 15)
        ended = time.monotonic()
    finally:
        idle_writer.close()
        if not reading.done():
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
    assert stream.status == 200
    assert stream.complete and stream.received == lines, (
        stream.received,
        bed.server.output()[-3000:],
    )
    # Exits 0 once the stream is done: well before --drain-timeout (30 s).
    code, exited = await wait_exit(bed.server, within=10)
    assert code == 0, bed.server.output()[-3000:]
    assert exited - ended < 5, f"exit {exited - ended:.1f}s after the last stream ended"
    log = bed.server.output()
    assert "server draining" in log
    assert "server drained" in log


async def test_an_idle_connection_its_task_serves_does_not_hold_the_drain_open(bed: Bed) -> None:
    """The drain closes a kept-alive connection waiting for a next request in its task (one
    kept over re-originated TLS, which callbacks do not serve) as it closes one served by
    callbacks: the server exits at once, not at --drain-timeout."""
    await start(bed, drain_timeout=30)
    reader, writer = await idle_keepalive(bed, tls=True)
    try:
        bed.server.kill(signal.SIGTERM)
        signalled = time.monotonic()
        code, exited = await wait_exit(bed.server, within=10)
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
    assert code == 0, bed.server.output()[-3000:]
    assert exited - signalled < 5, f"exited {exited - signalled:.1f}s after SIGTERM"


async def test_a_stream_open_at_the_drain_timeout_is_cut_and_the_server_exits(bed: Bed) -> None:
    await start(bed, drain_timeout=1)
    stream = LogStream(bed, lines=2000)  # 100 s: outlives the drain
    reading = asyncio.create_task(stream.run())
    try:
        await asyncio.wait_for(stream.first_line.wait(), 10)
        bed.server.kill(signal.SIGTERM)
        signalled = time.monotonic()
        code, exited = await wait_exit(bed.server, within=15)
        await asyncio.wait_for(reading, 10)
    finally:
        if not reading.done():
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
    assert code == 0, bed.server.output()[-3000:]
    assert exited - signalled < 8, f"exited {exited - signalled:.1f}s after SIGTERM"
    assert not stream.complete and 0 < stream.received < 2000
    assert "drain timeout" in bed.server.output()


async def test_a_lingering_refused_connection_does_not_hold_the_drain_open(bed: Bed) -> None:
    """A refused request (an unknown node) on plain TCP lingers — half-closed, what still comes
    read and dropped — while its client keeps sending (pipelined requests): the drain closes it
    at once, as it closes an idle kept-alive one, and the server exits then, not when the
    lingering ends (up to 30 s while the client keeps sending) or at --drain-timeout."""
    await start(bed, drain_timeout=30)
    reader, writer = await asyncio.open_connection("127.0.0.1", bed.cluster.http_port)

    async def pipelining() -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                writer.write(b"GET /b HTTP/1.1\r\nHost: edge-9:80\r\n\r\n")
                await writer.drain()
                await asyncio.sleep(0.2)

    writer.write(b"GET /a HTTP/1.1\r\nHost: edge-9:80\r\n\r\n")
    sending = asyncio.create_task(pipelining())
    try:
        answer = await asyncio.wait_for(reader.read(), 10)  # to the half-close's EOF
        assert answer.startswith(b"HTTP/1.1 404 "), answer
        assert answer.endswith(b"edge-9: unknown node\n"), answer
        await asyncio.sleep(1)  # lingering: the client goes on sending
        assert not sending.done()
        bed.server.kill(signal.SIGTERM)
        signalled = time.monotonic()
        code, exited = await wait_exit(bed.server, within=40)
    finally:
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        writer.close()
    assert code == 0, bed.server.output()[-3000:]
    assert exited - signalled < 5, f"exited {exited - signalled:.1f}s after SIGTERM"
