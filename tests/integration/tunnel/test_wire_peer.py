"""The real server process against a hand-written tunnel client holding an agent certificate:
PINGs answered at once (protocol sections 4.7, 11), a protocol error closed and counted."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import Frame, GoAway, Ping
from tests.integration.cluster import Cluster
from tests.integration.tunnel.rawpeer import raw_peer

pytestmark = pytest.mark.timeout(90)

ACK_WITHIN = 0.1
"""The acceptance bound; a loopback round trip takes about a millisecond."""


async def test_ping_on_an_idle_tunnel_is_acked_within_100ms(cluster: Cluster) -> None:
    cluster.start_server()
    await cluster.wait_up()
    async with raw_peer(cluster, "edge-3") as peer:
        await peer.handshake()
        # Idle: nothing else in flight. The server's own keepalive (10 s) is far away, so an
        # answer that waits for the next flush arrives seconds late.
        await asyncio.sleep(0.5)
        delays = []
        for _ in range(3):
            payload = os.urandom(8)

            def is_ack(frame: Frame, payload: bytes = payload) -> bool:
                return isinstance(frame, Ping) and frame.ack and frame.payload == payload

            started = time.monotonic()
            await peer.send(Ping(payload))
            await peer.wait_for(is_ack, timeout=15)
            delays.append(time.monotonic() - started)
            await asyncio.sleep(0.3)
    assert max(delays) < ACK_WITHIN, f"PING acks took {[f'{d * 1000:.0f} ms' for d in delays]}"


async def test_a_peer_that_breaks_the_protocol_gets_goaway_and_is_counted(cluster: Cluster) -> None:
    server = cluster.start_server()
    await cluster.wait_up()
    async with raw_peer(cluster, "edge-3") as peer:
        await peer.handshake()
        await peer.ws.send("a text message")  # binary only (section 2)
        frames = await peer.read_until_closed(timeout=15)
    goaways = [f for f in frames if isinstance(f, GoAway)]
    assert [g.code for g in goaways] == [ErrorCode.PROTOCOL_ERROR], frames
    assert peer.close_code == 1002
    key = 'ravenproxy_server_agent_sessions_total{outcome="protocol_error"}'
    await cluster.wait_metric(key, lambda v: v == 1)  # counted when the session has ended
    assert "peer broke the protocol" in server.output()
