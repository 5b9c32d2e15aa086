"""review39 (issue 15, tunpath): the real server's tunnel port against a hand-written client with
a real agent certificate (edge-3) that, after the wire handshake, writes crafted WebSocket frames
straight to its TLS transport: each is refused with the close code RFC 6455 asks for (1002 for a
protocol error, 1009 for a message over the limit), the server logs the agent's end, and
another agent's (edge-1's) stream through the same server carries on throughout. The log line
says why ("closed by us: 1002 incorrect masking"), and each close is counted as a protocol error.

The frames are those tunpath's parser (``FrameParser.parse_into``) must refuse as cdb10ca's did:
unmasked, RSV bits, a continuation with no message open, a new message while one is open, a
reserved opcode, a 64-bit length with its top bit set, a fragmented message over the limit
(its last fragment's header alone), and a fragmented PING; one frame after a usual frame in the
same write (the parser's usual path first, then the refusal).
"""

from __future__ import annotations

import asyncio
import struct

import pytest
from websockets.speedups import apply_mask

from ravenproxy.wire.config import WireConfig
from tests.integration.cluster import Cluster
from tests.integration.targets import echo, tcp_server
from tests.integration.tunnel.rawpeer import raw_peer

pytestmark = pytest.mark.timeout(60)

KEY = b"\x11\x22\x33\x44"
OVER = 4 * WireConfig().max_message_size
"""A length over the server's WebSocket limit (the wire's message size, and some)."""


def _frame(b0: int, payload: bytes, *, masked: bool = True, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    bit = 0x80 if masked else 0
    if n < 126:
        head = bytes([b0, bit | n])
    elif n < 1 << 16:
        head = struct.pack("!BBH", b0, bit | 126, n)
    else:
        head = struct.pack("!BBQ", b0, bit | 127, n)
    return head + KEY + apply_mask(payload, KEY) if masked else head + payload


CASES = {
    "unmasked": (_frame(0x82, b"no mask", masked=False), 1002, "incorrect masking"),
    "rsv1": (_frame(0xC2, b"compressed?"), 1002, "reserved bits must be 0"),
    "rsv3": (_frame(0x92, b"reserved bit"), 1002, "reserved bits must be 0"),
    "lone continuation": (_frame(0x80, b"nothing open"), 1002, "unexpected continuation frame"),
    "binary while open": (
        _frame(0x02, b"first") + _frame(0x82, b"new"),
        1002,
        "expected a continuation frame",
    ),
    "reserved opcode": (_frame(0x83, b"op 3"), 1002, "invalid opcode"),
    "top bit length": (_frame(0x82, b"", length=1 << 63), 1009, "exceeds limit"),
    "fragments over the limit": (
        _frame(0x02, b"first") + _frame(0x80, b"", length=OVER),
        1009,
        "message over",
    ),
    "fragmented ping": (_frame(0x09, b"ping"), 1002, "fragmented control frame"),
}


async def _echo_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    data = bytes([n % 256]) * 4096
    writer.write(data)
    async with asyncio.timeout(10):
        assert await reader.readexactly(len(data)) == data


async def test_crafted_frames_are_refused_and_another_agent_carries_on(cluster: Cluster) -> None:
    async with tcp_server(echo) as port:
        server = cluster.start_server()
        cluster.start_agent("edge-1", f"127.0.0.1:{port}")
        target = f"edge-1:{port}"
        await cluster.wait_routable(target)
        reader, writer = await cluster.connect(target)  # edge-1's stream, open throughout
        await _echo_once(reader, writer, 0)
        codes = {}
        for i, (name, (crafted, _code, why)) in enumerate(CASES.items(), start=1):
            async with raw_peer(cluster, "edge-3") as peer:
                await peer.handshake()
                # A usual frame first (an empty wire message: no wire frames), then the crafted
                # bytes, in one write: one read of the server parses both.
                peer.ws.transport.write(_frame(0x82, b"") + crafted)
                await peer.read_until_closed(timeout=10)
                codes[name] = (peer.close_code, why in peer.close_reason, peer.close_reason)
            await _echo_once(reader, writer, i)
        writer.close()
        assert {n: c[:2] for n, c in codes.items()} == {
            name: (code, True) for name, (_crafted, code, _why) in CASES.items()
        }, codes

        def ended() -> list[str]:
            lines = server.output().splitlines()
            return [line for line in lines if "agent disconnected" in line and "edge-3" in line]

        async with asyncio.timeout(10):  # the last one's line may be a moment behind its close
            while len(ended()) < len(CASES):
                await asyncio.sleep(0.05)
        assert len(ended()) == len(CASES), ended()
        for line, (_crafted, code, why) in zip(ended(), CASES.values(), strict=True):
            assert f"closed by us: {code}" in line and why in line, line  # the log says why
        metrics = await cluster.metrics()
        assert metrics["ravenproxy_server_agents_connected"] == 1
        # Refused by the WebSocket layer, each (none reached the wire layer as a message),
        # and counted as the server's protocol-error closes.
        key = 'ravenproxy_server_agent_sessions_total{outcome="protocol_error"}'
        assert metrics.get(key, 0) == len(CASES), metrics.get(key)


async def test_the_log_line_says_why_a_crafted_frame_was_refused(cluster: Cluster) -> None:
    """Regression (review39): the server's log said "connection lost" for a frame it refused
    (only the peer's close frame was read, not its own) and counted nothing."""
    server = cluster.start_server()
    await cluster.wait_up()
    async with raw_peer(cluster, "edge-3") as peer:
        await peer.handshake()
        peer.ws.transport.write(_frame(0x82, b"no mask", masked=False))
        await peer.read_until_closed(timeout=10)
    assert peer.close_code == 1002
    async with asyncio.timeout(10):
        while "agent disconnected" not in server.output():
            await asyncio.sleep(0.05)
    ended = [line for line in server.output().splitlines() if "agent disconnected" in line]
    assert "closed by us: 1002 incorrect masking" in ended[0], ended
    metrics = await cluster.metrics()
    key = 'ravenproxy_server_agent_sessions_total{outcome="protocol_error"}'
    assert metrics.get(key, 0) == 1, metrics.get(key)
