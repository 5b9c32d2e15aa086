"""HTTP framing conflicts through the fronts (issue 8, item 8; RFC 9112 §6.1-§6.3, §7.1).

- A request with both ``Content-Length`` and ``Transfer-Encoding`` is refused with 400 (one way
  the RFC allows; the other, forwarding it with both, is how requests are smuggled) and never
  reaches the target.
- A response with both is framed by ``Transfer-Encoding`` alone: ``Content-Length`` is dropped
  before it is forwarded, and the client gets the body.
- A malformed chunk size in a request body is answered with 400.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import h11
import pytest

from tests.helpers import raw_exchange
from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class _RawTarget:
    """A target on edge-1's spare (allowed) port that answers every request with fixed bytes
    and records what it received."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.received = bytearray()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.received += await reader.readuntil(b"\r\n\r\n")
            writer.write(self.answer)
            await writer.drain()
        finally:
            writer.close()


@pytest.fixture
async def target(l7: L7) -> AsyncIterator[_RawTarget]:
    t = _RawTarget(
        b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    )
    async with tcp_server(t.handle, EDGE_IP, l7.spare_port):
        yield t


async def test_request_with_content_length_and_transfer_encoding_is_refused(
    l7: L7, target: _RawTarget
) -> None:
    before = (await l7.cluster.metrics()).get(
        'ravenproxy_server_front_requests_total{front="http",status="400"}', 0.0
    )
    answer = await raw_exchange(
        l7.http,
        f"POST /x HTTP/1.1\r\nHost: edge-1:{l7.spare_port}\r\nContent-Length: 5\r\n"
        "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".encode(),
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"Connection: close" in head
    assert body == b"bad request: both Content-Length and Transfer-Encoding\n"
    assert target.received == b""  # never forwarded
    m = await l7.cluster.metrics()
    assert m['ravenproxy_server_front_requests_total{front="http",status="400"}'] == before + 1


async def test_response_with_content_length_and_transfer_encoding_is_framed_by_chunks(
    l7: L7, target: _RawTarget
) -> None:
    answer = await raw_exchange(
        l7.http,
        f"GET /x HTTP/1.1\r\nHost: edge-1:{l7.spare_port}\r\nConnection: close\r\n\r\n".encode(),
    )
    head = answer.partition(b"\r\n\r\n")[0]
    assert head.startswith(b"HTTP/1.1 200 "), answer
    fields = head.lower().split(b"\r\n")
    assert not any(f.startswith(b"content-length") for f in fields), head
    assert b"transfer-encoding: chunked" in fields, head
    # Whatever the chunking, a client's parser gets exactly the five bytes.
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/x", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(answer)
    data = b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            data += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            break
        elif event is h11.NEED_DATA:
            raise AssertionError(f"incomplete response: {answer!r}")
    assert data == b"abcde"


async def test_malformed_chunk_size_is_answered_with_400(l7: L7) -> None:
    answer = await raw_exchange(
        l7.http,
        f"POST /echo HTTP/1.1\r\nHost: edge-1:{l7.kubelet.http_port}\r\n"
        "Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".encode(),
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert body.startswith(b"edge-1: bad request body:"), body


async def test_malformed_chunk_arriving_after_the_head_is_answered_with_400(l7: L7) -> None:
    # The head goes first and is forwarded; the bad chunk comes while the server already waits
    # for the target's answer: the body pump stops that wait and the client still gets a 400.
    async with front_client(l7.http) as (reader, writer):
        writer.write(
            f"POST /echo HTTP/1.1\r\nHost: edge-1:{l7.kubelet.http_port}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n".encode()
        )
        await writer.drain()
        await asyncio.sleep(0.5)
        writer.write(b"not-hex\r\n")
        await writer.drain()
        async with asyncio.timeout(15):
            answer = await reader.read()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert body.startswith(b"edge-1: bad request body:"), body
