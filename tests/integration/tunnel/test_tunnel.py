"""The tunnel core end to end: real server and agent processes, real mTLS, loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time

import pytest

from ravenproxy.agent.servers import HEALTHY_AFTER
from tests.helpers import free_port, scrape
from tests.integration.cluster import Cluster
from tests.integration.targets import Firehose, echo, hash_sink, tcp_server

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024


async def send_and_hash(cluster: Cluster, target: str, total: int) -> None:
    """Stream ``total`` random bytes to a hash sink, half-close, compare its SHA-256."""
    reader, writer = await cluster.connect(target)
    blocks = [os.urandom(MIB) for _ in range(4)]
    digest = hashlib.sha256()
    for i in range(total // MIB):
        block = blocks[i % 4]
        digest.update(block)
        writer.write(block)
        await writer.drain()
    writer.write_eof()
    line = await asyncio.wait_for(reader.readline(), 120)
    writer.close()
    assert line.decode().split() == [digest.hexdigest(), str(total)]


async def test_one_gib_through_one_stream_sha256(cluster: Cluster) -> None:
    async with tcp_server(hash_sink) as port:
        cluster.start_server()
        cluster.start_agent("edge-1", f"127.0.0.1:{port}")
        await cluster.wait_routable(f"edge-1:{port}")
        await send_and_hash(cluster, f"edge-1:{port}", 1024 * MIB)
        # A stream's bytes are counted when the server forgets it, which may be a moment after
        # the client saw the answer and closed.
        await cluster.wait_metric(
            'ravenproxy_server_bytes_total{direction="up"}', lambda v: v >= 1024 * MIB
        )


async def test_thousand_concurrent_streams_echo_their_own_data(cluster: Cluster) -> None:
    async with tcp_server(echo) as port:
        cluster.start_server()
        cluster.start_agent("edge-1", f"127.0.0.1:{port}")
        target = f"edge-1:{port}"
        await cluster.wait_routable(target)

        async def one(i: int) -> None:
            payload = i.to_bytes(4, "big") + os.urandom(16 * 1024)
            reader, writer = await cluster.connect(target)
            writer.write(payload)
            await writer.drain()
            writer.write_eof()
            got = await reader.read(-1)
            writer.close()
            assert got == payload, f"stream {i}: {len(got)} bytes back"

        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(1000))), 120)
        opened = await cluster.wait_metric(
            'ravenproxy_server_stream_opens_total{result="ok"}', lambda v: v >= 1000
        )
        assert opened >= 1000
        await cluster.wait_metric("ravenproxy_server_streams_open", lambda v: v == 0)


async def test_stalled_reader_does_not_slow_the_others(cluster: Cluster) -> None:
    firehose = Firehose()
    async with tcp_server(firehose) as fire_port, tcp_server(hash_sink) as sink_port:
        cluster.start_server()
        cluster.start_agent("edge-1", f"127.0.0.1:{fire_port}", f"127.0.0.1:{sink_port}")
        await cluster.wait_routable(f"edge-1:{sink_port}")
        stalled_reader, stalled_writer = await cluster.connect(f"edge-1:{fire_port}")
        # Let the stalled stream fill every buffer on its way.
        for _ in range(50):
            before = firehose.written
            await asyncio.sleep(0.1)
            if firehose.written == before and before:
                break
        pinned = firehose.written

        await send_and_hash(cluster, f"edge-1:{sink_port}", 256 * MIB)

        m = await cluster.metrics()
        buffered = m["ravenproxy_server_stream_buffered_max_bytes"]
        # The stalled stream holds at most its window at the server (cap 8 MiB), and the
        # firehose was stopped by backpressure instead of filling memory somewhere.
        assert buffered <= 8 * MIB, buffered
        assert firehose.written == pinned or firehose.written < 64 * MIB, firehose.written
        assert firehose.written < 64 * MIB
        # The stalled stream is alive: reading it now gets the firehose's bytes.
        data = await asyncio.wait_for(stalled_reader.readexactly(1 * MIB), 10)
        assert set(data) == {0xAB}
        stalled_writer.close()


async def test_agent_killed_mid_stream(cluster: Cluster) -> None:
    async with tcp_server(echo) as port:
        server = cluster.start_server()
        await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v == 0)
        await asyncio.sleep(0.3)
        base = await cluster.metrics()
        base_tasks = base["ravenproxy_server_asyncio_tasks"]
        base_fds = server.fd_count()

        agent = cluster.start_agent("edge-1", f"127.0.0.1:{port}")
        target = f"edge-1:{port}"
        await cluster.wait_routable(target)
        streams = []
        for _ in range(5):
            reader, writer = await cluster.connect(target)
            writer.write(b"x" * 100_000)
            assert await reader.readexactly(100_000) == b"x" * 100_000
            streams.append((reader, writer))
        assert (await cluster.metrics())["ravenproxy_server_streams_open"] == 5

        agent.kill()
        started = time.monotonic()
        for reader, writer in streams:
            try:
                rest = await asyncio.wait_for(reader.read(-1), 10)
            except ConnectionResetError:
                rest = b""
            assert rest == b""
            writer.close()
        assert time.monotonic() - started < 10  # promptly: not after a keepalive timeout

        await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v == 0)
        await cluster.wait_metric("ravenproxy_server_streams_open", lambda v: v == 0)
        await cluster.wait_metric("ravenproxy_server_asyncio_tasks", lambda v: v <= base_tasks)
        deadline = time.monotonic() + 10
        while server.fd_count() > base_fds and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert server.fd_count() <= base_fds, cluster.logs()

        # What the client sees now: no agent → 503 naming the node.
        with pytest.raises(Exception, match=r"503.*edge-1: no agent connected"):
            await cluster.connect(target)


def sockets_to(pid: int, port: int) -> int:
    """How many TCP connections to ``port`` on loopback the process ``pid`` holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    with open(f"/proc/{pid}/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return sum(1 for row in rows if int(row[2].split(":")[1], 16) == port and row[9] in inodes)


async def test_client_gone_mid_upload_to_a_stuck_target_closes_the_target_connection(
    cluster: Cluster,
) -> None:
    """A client uploads to a target that reads nothing, until every buffer on the way is full,
    then goes away. The server resets the stream (its relay, waiting for credit, ends at its
    --idle-timeout), and the agent closes its connection to the target at once: it must not
    hold it, and its splice, until the target reads again."""
    stop = asyncio.Event()

    async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await stop.wait()  # reads nothing

    async with tcp_server(stuck) as port:
        try:
            cluster.start_server("--idle-timeout", "2")
            agent = cluster.start_agent("edge-1", f"127.0.0.1:{port}")
            await cluster.wait_routable(f"edge-1:{port}")
            _, writer = await cluster.connect(f"edge-1:{port}")
            block = b"u" * MIB
            try:
                for _ in range(256):
                    writer.write(block)
                    try:
                        await asyncio.wait_for(writer.drain(), 1.0)
                    except TimeoutError:
                        break  # every buffer on the way is full
                else:
                    raise AssertionError("the upload never stalled")
            finally:
                writer.transport.abort()
            deadline = time.monotonic() + 15
            while sockets_to(agent.pid, port):
                assert time.monotonic() < deadline, (
                    "the agent kept its connection to the target\n" + cluster.logs()
                )
                await asyncio.sleep(0.1)
        finally:
            stop.set()


async def test_stream_reset_while_the_agent_dials_closes_the_dialled_connection(
    cluster: Cluster,
) -> None:
    """The server gives up on an OPEN (--open-timeout 1) while the agent's dial still waits
    (the target's accept queue is full, its SYN dropped), and resets the stream. The dial then
    succeeds: the agent must close that connection, not keep it (and fail the stream's handler
    with a traceback)."""
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    held: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        cluster.start_server("--open-timeout", "1")
        cluster.start_agent("edge-1", f"127.0.0.1:{port}", extra=("--dial-timeout", "10"))
        # Its dialled connection, not accepted, fills the accept queue (one with listen(0)).
        await cluster.wait_routable(f"edge-1:{port}")
        with pytest.raises(Exception, match=r"504"):
            await cluster.connect(f"edge-1:{port}")
        # The stream was reset: now let the agent's dial (its SYN re-sent) through.
        held.append((await loop.sock_accept(listener))[0])
        dialled, _ = await asyncio.wait_for(loop.sock_accept(listener), 15)
        held.append(dialled)
        try:
            end = await asyncio.wait_for(loop.sock_recv(dialled, 1), 10)
        except ConnectionResetError:
            end = b""
        except TimeoutError:
            raise AssertionError("the agent kept the connection\n" + cluster.logs()) from None
        assert end == b""
        assert "stream handler failed" not in cluster.logs()
    finally:
        for sock in (listener, *held):
            sock.close()


async def test_server_restart_agent_comes_back(cluster: Cluster) -> None:
    async with tcp_server(echo) as port:
        ports = {k: free_port() for k in ("tunnel", "http", "https", "metrics", "health")}
        server = cluster.start_server(ports=ports)
        agent = cluster.start_agent("edge-1", f"127.0.0.1:{port}")
        target = f"edge-1:{port}"
        await cluster.wait_routable(target)
        # A tunnel that ends sooner than HEALTHY_AFTER after it came up counts as a failed
        # dial (backoff, no quick re-dial): this one has been up long enough.
        await asyncio.sleep(HEALTHY_AFTER + 0.2)
        failed_key = 'ravenproxy_agent_connect_attempts_total{result="failed"}'
        failed_before = (await scrape(agent.ports["metrics"])).get(failed_key, 0.0)
        assert server.stop() == 0
        # Away for 3 s: the first re-dial (within 1 s) and at least one more (0.5-1.5 s later)
        # are refused.
        await asyncio.sleep(3.0)
        cluster.start_server(ports=ports)
        await cluster.wait_routable(target, timeout=30)
        assert agent.running
        reader, writer = await cluster.connect(target)
        writer.write(b"again")
        assert await reader.readexactly(5) == b"again"
        writer.close()
        output = agent.output()
        assert "tunnel down, reconnecting" in output
        # One warning for the outage, the retries at DEBUG; the metrics count every one, and
        # the tunnel up line says how many dials the return took.
        # (The agent may have met an outage at its start too, before the server listened.)
        lines = output.split("tunnel down, reconnecting", 1)[1].splitlines()
        warned = [x for x in lines if " WARNING " in x and "cannot reach the server" in x]
        retried = [x for x in lines if " DEBUG " in x and "still cannot reach the server" in x]
        assert len(warned) == 1, warned
        assert 'reason="connection refused"' in warned[0] or "reason=connection" in warned[0]
        assert retried, output[-3000:]
        failed = (await scrape(agent.ports["metrics"]))[failed_key] - failed_before
        assert failed == 1 + len(retried)
        [back] = [x for x in lines if "tunnel up" in x and "down_for=" in x]
        assert f"attempts={int(failed) + 1} " in back + " ", back
