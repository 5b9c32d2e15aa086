"""A peer that floods control frames and never reads: the server stays bounded and closes it.

The real server process, a real agent serving another node, and a hand-written tunnel client
with a real agent certificate that sends PINGs as fast as the server takes them and reads
nothing. Every PING asks for an answer the flooder never collects; the server must stop reading
it instead of queueing answers without bound, then close it with ENHANCE_YOUR_CALM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest

from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import GoAway, Ping, encode
from tests.integration.cluster import Cluster, Proc
from tests.integration.targets import echo, tcp_server
from tests.integration.tunnel.rawpeer import raw_peer

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024
FLOOD_BYTES = 64 * MIB
"""What the flooder tries to send (the issue saw +177 MB of server RSS from 50 MiB)."""
FLOOD_SECONDS = 60
"""The flood stops after this long whatever happened."""
STALL = 3.0
"""A send blocked this long means the server stopped reading the flooder."""
RSS_GROWTH_LIMIT = 50 * MIB
FLOOD_LOG = "peer floods control frames, closing"


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def sample_rss(proc: Proc, peak: list[int], stop: asyncio.Event) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss(proc.pid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def keep_requesting(
    cluster: Cluster, target: str, stop: asyncio.Event, results: list[float | str]
) -> None:
    """Echo requests through the other agent, one after another, until told to stop."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            async with asyncio.timeout(15):
                reader, writer = await cluster.connect(target)
                writer.write(b"x" * 1024)
                await reader.readexactly(1024)
                writer.close()
            results.append(time.monotonic() - started)
        except Exception as exc:  # recorded, asserted on below
            results.append(f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(0.05)


async def test_control_flood_from_a_peer_that_never_reads(cluster: Cluster) -> None:
    async with tcp_server(echo) as port:
        server = cluster.start_server()
        cluster.start_agent("edge-1", f"127.0.0.1:{port}")
        target = f"edge-1:{port}"
        await cluster.wait_routable(target)
        # edge-3 is in no gateway: its tunnel serves only edge-3, never the other agent's node.
        async with raw_peer(cluster, "edge-3", max_queue=1) as flooder:
            await flooder.handshake()
            await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v == 2)
            baseline = rss(server.pid)
            peak = [baseline]
            stop = asyncio.Event()
            results: list[float | str] = []
            sampler = asyncio.create_task(sample_rss(server, peak, stop))
            requester = asyncio.create_task(keep_requesting(cluster, target, stop, results))
            # 256 KiB messages of 13 107 PINGs each, every one of which asks for an answer.
            message = b"".join(encode(Ping(os.urandom(8))) for _ in range(256 * 1024 // 20))
            sent = 0
            deadline = time.monotonic() + FLOOD_SECONDS
            stalled = False
            try:
                while sent < FLOOD_BYTES and time.monotonic() < deadline:
                    try:
                        await asyncio.wait_for(flooder.ws.send(message), STALL)
                    except TimeoutError:
                        stalled = True
                        break
                    sent += len(message)
                # Still reading nothing: the server must give up on us by itself.
                for _ in range(300):
                    if FLOOD_LOG in server.output():
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)  # requests keep flowing meanwhile
            finally:
                stop.set()
                await asyncio.gather(sampler, requester)
            growth = peak[0] - baseline
            assert growth < RSS_GROWTH_LIMIT, (
                f"server RSS grew {growth / MIB:.0f} MiB while the flooder sent "
                f"{sent / MIB:.0f} MiB of PINGs (stalled: {stalled})"
            )
            assert stalled, f"the server read all {sent / MIB:.0f} MiB without pausing"
            assert FLOOD_LOG in server.output(), server.output()[-3000:]
            # Now read: the answers that did go out, then GOAWAY(ENHANCE_YOUR_CALM), then close.
            frames = await flooder.read_until_closed(timeout=30)
        goaways = [f for f in frames if isinstance(f, GoAway)]
        assert [g.code for g in goaways] == [ErrorCode.ENHANCE_YOUR_CALM], goaways
        assert flooder.close_code in (None, 1008), flooder.close_code
        failures = [r for r in results if isinstance(r, str)]
        assert not failures, failures
        assert len(results) >= 10, results
        key = 'ravenproxy_server_agent_sessions_total{outcome="flood_closed"}'
        await cluster.wait_metric(key, lambda v: v == 1)  # counted when the session has ended
        m = await cluster.metrics()
        assert m["ravenproxy_server_agents_connected"] == 1  # the real agent stays
        log = server.output()
        line = next(x for x in log.splitlines() if FLOOD_LOG in x)
        assert "node=edge-3" in line, line
