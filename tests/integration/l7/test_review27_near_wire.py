"""Review of branch varhead (issue 15), on a real connection to the HTTP front (the real server and
agent): tests/unit/server/test_review27_near.py's finding. After a keep-alive request that came
with a CR LF before it (llhttp skips it: the same head as the request before), a request with no
field at all followed by the last one's field lines must be what llhttp parses — a request
without Host, refused 400, the connection closed (f667209) — not the last request with another
target, sent on to the target (varhead: the kept bytes, CR LF included, lined up with the head's
request line, which has none)."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


async def test_a_request_without_fields_after_one_that_came_after_a_crlf(l7: L7) -> None:
    seen: list[bytes] = []  # the request lines the target got

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                seen.append(head.split(b"\r\n", 1)[0])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    first = b"GET /ok HTTP/1.1\r\nHost: edge-1:%d\r\n\r\n" % l7.spare_port
    crafted = b"GET /xyz HTTP/1.1\r\n\r\nHost: edge-1:%d\r\n\r\n" % l7.spare_port
    ok = b"HTTP/1.1 200 OK\r\n"
    async with (
        tcp_server(target, EDGE_IP, l7.spare_port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        for data in (first, b"\r\n" + first):
            writer.write(data)
            async with asyncio.timeout(20):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(ok) and await reader.readexactly(2) == b"ok"
        writer.write(crafted)
        async with asyncio.timeout(20):
            answer = await reader.readuntil(b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400 "), (answer, seen)  # varhead: 200, /xyz sent on
        assert b"GET /xyz HTTP/1.1" not in seen, seen
        async with asyncio.timeout(20):
            while await reader.read(65536):  # the front closes the connection after its refusal
                pass
