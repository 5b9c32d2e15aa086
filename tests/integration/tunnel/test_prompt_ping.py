"""A PING on an idle tunnel is answered at once (protocol §4.7, §11), not with the next keepalive.

The real server process against a hand-written tunnel client holding an agent certificate.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from ravenproxy.wire.frames import Frame, Ping
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
