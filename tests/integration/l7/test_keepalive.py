"""A kept-alive client connection's later requests, which the HTTP front serves by callbacks
(:mod:`ravenproxy.server.http_callbacks`), against the real server and agent: every way a
request can leave that path and come back to it gets the same answers as the first request of a
connection — many requests in a row, pipelined ones, a head in pieces, a body in pieces, an
answer larger than the client reads at once (backpressure), a client that half-closes after its
request, one that goes away mid-answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

BIG = 4 * 1024 * 1024


async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """``/ok`` → ``ok``; ``/big`` → BIG bytes; ``/echo`` → the request body; ``/stream`` → a
    chunked answer that never ends (a line every 10 ms)."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            path = lines[0].split(" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            if path == "/big":
                payload = bytes(range(256)) * (BIG // 256)
            elif path == "/echo":
                payload = body
            elif path == "/stream":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                while True:
                    writer.write(b"5\r\nline\n\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.01)
            else:
                payload = b"ok"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
            writer.write(payload)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def client(l7: L7) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """The target on edge-1's spare port, and one client connection to the HTTP front."""
    async with (
        tcp_server(target, EDGE_IP, l7.spare_port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        yield reader, writer


def request(l7: L7, path: str, body: bytes | None = None, extra: str = "") -> bytes:
    method = "GET" if body is None else "POST"
    head = f"{method} {path} HTTP/1.1\r\nHost: edge-1:{l7.spare_port}\r\n{extra}"
    if body is not None:
        head += f"Content-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + (body or b"")


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    async with asyncio.timeout(20):
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.decode().split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        return status, await reader.readexactly(length)


async def test_many_requests_pipelined_and_in_pieces_on_one_connection(l7: L7) -> None:
    opened = 'ravenproxy_server_stream_opens_total{result="ok"}'
    before = (await l7.cluster.metrics())[opened]
    async with client(l7) as (reader, writer):
        for i in range(50):
            writer.write(request(l7, f"/ok?{i}"))
            assert await answer(reader) == (200, b"ok")
        # Three requests in one write: the second and third wait for the answer before them.
        writer.write(request(l7, "/ok") + request(l7, "/echo", b"abc") + request(l7, "/ok"))
        assert [await answer(reader) for _ in range(3)] == [
            (200, b"ok"),
            (200, b"abc"),
            (200, b"ok"),
        ]
        # A head in pieces, then a body in pieces.
        whole = request(l7, "/echo", b"x" * 3000)
        for cut in (10, 40, len(whole) - 1000, len(whole) - 1):
            writer.write(whole[:cut])
            await asyncio.sleep(0.05)
            writer.write(whole[cut:])
            assert await answer(reader) == (200, b"x" * 3000)
        writer.write(request(l7, "/ok"))
        assert await answer(reader) == (200, b"ok")
    # ... all of it over the one stream the first request opened.
    assert (await l7.cluster.metrics())[opened] == before + 1


async def test_an_answer_larger_than_the_client_reads_is_held_back(l7: L7) -> None:
    async with client(l7) as (reader, writer):
        writer.write(request(l7, "/ok"))
        assert await answer(reader) == (200, b"ok")
        writer.write(request(l7, "/big"))
        await asyncio.sleep(1.0)  # the client reads nothing meanwhile: the answer waits
        status, body = await answer(reader)
        assert status == 200 and body == bytes(range(256)) * (BIG // 256)
        # The connection goes on serving.
        writer.write(request(l7, "/echo", b"after"))
        assert await answer(reader) == (200, b"after")


async def test_a_client_that_half_closes_after_its_request_gets_the_answer(l7: L7) -> None:
    async with client(l7) as (reader, writer):
        writer.write(request(l7, "/ok"))
        assert await answer(reader) == (200, b"ok")
        writer.write(request(l7, "/echo", b"last"))
        writer.write_eof()
        assert await answer(reader) == (200, b"last")
        async with asyncio.timeout(10):
            assert await reader.read() == b""  # then the server closes


async def test_a_client_gone_mid_answer_releases_the_stream(l7: L7) -> None:
    streams = "ravenproxy_server_streams_open"
    before = (await l7.cluster.metrics())[streams]
    async with client(l7) as (reader, writer):
        writer.write(request(l7, "/ok"))
        assert await answer(reader) == (200, b"ok")
        writer.write(request(l7, "/stream"))
        async with asyncio.timeout(10):
            await reader.readuntil(b"line\n")
        writer.transport.abort()
    async with asyncio.timeout(20):  # the endless answer's stream is reset
        while (await l7.cluster.metrics())[streams] > before:
            await asyncio.sleep(0.1)


async def test_a_later_head_over_the_limit_is_refused_whole_in_pieces_or_pipelined(
    l7: L7,
) -> None:
    """A kept-alive connection's next head over --max-header-size (the callbacks look at the
    parser only once something of it was parsed or begun) is refused with 431 as a first one
    is: arriving in one write, in pieces, or begun in the write of the request before it."""
    over = request(l7, "/ok", extra=f"X-Big: {'a' * 80_000}\r\n")
    for how in ("whole", "pieces", "pipelined"):
        async with client(l7) as (reader, writer):
            writer.write(request(l7, "/ok"))
            assert await answer(reader) == (200, b"ok")
            if how == "whole":
                writer.write(over)
            elif how == "pieces":
                for cut in range(0, len(over), 20_000):
                    writer.write(over[cut : cut + 20_000])
                    await asyncio.sleep(0.05)
            else:
                writer.write(request(l7, "/ok") + over[:100])
                assert await answer(reader) == (200, b"ok")
                await asyncio.sleep(0.05)
                writer.write(over[100:])
            status, _ = await answer(reader)
            assert status == 431, how
