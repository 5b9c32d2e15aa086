"""``Connection: Upgrade`` with SPDY/3.1 (what ``kubectl exec/attach/port-forward`` speak to a
kubelet): after the 101 the connection is a raw bidirectional stream, half-close included."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


async def spdy_target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers an upgrade with 101, then reads to EOF and replies with what it got, reversed."""
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"upgrade: spdy/3.1" in head.lower(), head
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
        b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
    )
    received = await reader.read()  # to the client's half-close
    writer.write(b"got:" + received[::-1])
    await writer.drain()
    writer.close()


async def test_spdy_upgrade_becomes_a_raw_stream_with_half_close(l7: L7) -> None:
    # The agent's allowlist admits edge-1's spare port: the SPDY target listens there.
    async with (
        tcp_server(spdy_target, EDGE_IP, l7.spare_port),
        front_client(l7.http) as (reader, writer),
    ):
        writer.write(
            f"POST /attach/default/web-1/app?stdin=true HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{l7.http}\r\nX-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n"
            "Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            "X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n".encode()
            + b"early-bytes|"  # sent before the 101: must reach the target after it
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert b"upgrade: spdy/3.1" in head.lower()
        assert b"x-stream-protocol-version: v4.channel.k8s.io" in head.lower()
        writer.write(b"raw frames")
        writer.write_eof()  # half-close: the answer still comes back
        rest = await asyncio.wait_for(reader.read(), 10)
        assert rest == b"got:" + b"early-bytes|raw frames"[::-1]
