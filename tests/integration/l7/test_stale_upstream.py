"""A kept-alive connection to a target that the target closed while idle: the next request on
the client's connection goes out again on a fresh one (it had no body, so that is safe)."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import EDGE_IP, L7

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


async def test_request_after_the_target_closed_an_idle_connection(l7: L7) -> None:
    served: list[int] = []

    async def one_answer_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        served.append(1)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nhi\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.close()  # idle close, as a keep-alive timeout would

    server = await asyncio.start_server(one_answer_then_close, EDGE_IP, l7.spare_port)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", l7.http)
        request = (
            f"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"X-Tunnel-Proxy-Host: edge-1:{l7.spare_port}\r\n\r\n"
        ).encode()
        for _ in range(2):
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200"), head
            assert await reader.readexactly(3) == b"hi\n"
            await asyncio.sleep(0.5)  # the target closes its side meanwhile
        writer.close()
        assert len(served) == 2
    finally:
        server.close()
        await server.wait_closed()
