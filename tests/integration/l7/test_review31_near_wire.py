"""review31: varied (70a263e) on a real connection to the HTTP front (the real server, agent
and a target that records every head it gets). A request that is the last one's bytes but for
its target (``Parsed.near``: checked by C calls, the last request's lead and tail kept) must
reach the target byte for byte as it does alone on a fresh connection, and be answered (or
refused) alike: every odd target byte, %-encodings, targets not starting with "/", HTTP/1.0,
targets near the head's bound, after a request that was not near, and pipelined."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

BOUND = 64 * 1024  # the server's --max-header-size default


def _targets(port: int) -> list[bytes]:
    odd = [bytes([b]) for b in (0x00, 0x01, 0x09, 0x0B, 0x0C, 0x1F, 0x7F, 0x80, 0xC3, 0xFF)]
    long = [b"/" + b"x" * (BOUND - n) for n in range(48, 66)]  # 431 from ~64
    return [
        b"/b",
        b"/",
        b"//x",
        b"/a?b=c&d=%20#frag",
        b"/%41%zz%",
        b"/~!$&'()*+,;=:@",
        b'/"<>\\^`{|}',
        b"*",
        b"x/y",
        b"?q",
        b"http://edge-1:%d/abs" % port,
        b"edge-1:%d" % port,
        b"/caf\xc3\xa9",
        *(b"/a" + byte + b"b" for byte in odd),
        b"/a b",
        b"/a\rb",
        b"/a\nb",
        *long,
    ]


class _Target:
    """A keep-alive target that records each head it gets and answers each with its number."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                body = b"%d" % len(self.heads)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """The next answer's status line (b"" when the front closed without one)."""
    async with asyncio.timeout(20):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return b""
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
    return head.split(b"\r\n", 1)[0]


def _request(target: bytes, port: int, version: bytes = b"1.1") -> bytes:
    keep = b"Connection: keep-alive\r\n" if version == b"1.0" else b""
    return b"GET %b HTTP/%b\r\nHost: edge-1:%d\r\n%bAccept: */*\r\n\r\n" % (
        target,
        version,
        port,
        keep,
    )


@contextlib.asynccontextmanager
async def _recording(l7: L7) -> AsyncIterator[_Target]:
    """The recording target on the agent's side (in the test's own loop)."""
    recorder = _Target()
    async with tcp_server(recorder, EDGE_IP, l7.spare_port):
        yield recorder


async def _alone(l7: L7, target: _Target, request: bytes) -> tuple[bytes, bytes | None]:
    """``request`` on a fresh client connection: its answer's status line and the head the
    target got for it (None: none)."""
    before = len(target.heads)
    async with front_client(l7.http, abort=True) as (reader, writer):
        writer.write(request)
        status = await _answer(reader)
    return status, target.heads[before] if len(target.heads) > before else None


async def _after(
    l7: L7, target: _Target, warm: list[bytes], request: bytes
) -> tuple[bytes, bytes | None]:
    """``request`` on a client connection after the ``warm`` requests were answered on it."""
    async with front_client(l7.http, abort=True) as (reader, writer):
        for data in warm:
            writer.write(data)
            assert (await _answer(reader)).startswith(b"HTTP/1.1 200"), data[:80]
        before = len(target.heads)
        writer.write(request)
        status = await _answer(reader)
    return status, target.heads[before] if len(target.heads) > before else None


def _status(line: bytes) -> bytes:
    return line.split(b" ", 2)[1] if line else b""


@pytest.mark.parametrize("version", [b"1.1", b"1.0"])
async def test_a_near_request_reaches_the_target_as_it_would_alone(l7: L7, version: bytes) -> None:
    async with _recording(l7) as target:
        await _compare_each(l7, target, version)


async def _compare_each(l7: L7, target: _Target, version: bytes) -> None:
    port = l7.spare_port
    warm = _request(b"/warm", port, version)
    differ: list[tuple[bytes, object, object]] = []
    reached = 0
    for t in _targets(port):
        request = _request(t, port, version)
        alone = await _alone(l7, target, request)
        reached += alone[1] is not None
        # Twice the same request first (the replay kept), then the one that differs by its
        # target; and after a request that is not near (another field).
        for before in (
            [warm, warm],
            [_request(b"/w", port, version).replace(b"Accept", b"X-Other"), warm],
        ):
            near = await _after(l7, target, before, request)
            if (_status(near[0]), near[1]) != (_status(alone[0]), alone[1]):
                differ.append((t[:60], alone, near))
    assert not differ, differ
    assert reached >= 8, reached  # not all refused: the near path was taken


async def test_pipelined_near_requests_reach_the_target_in_order_as_alone(l7: L7) -> None:
    """The warm request and a run of near ones in one write: each reaches the target as it
    does alone, in order, each answered (a refused one ends the run: what follows it not)."""
    port = l7.spare_port
    run = [b"/warm", b"/a", b"/b?x=1", b"/a", b"//c", b"/%7e", b"/d#f"]
    async with _recording(l7) as target:
        alone = [await _alone(l7, target, _request(t, port)) for t in run]
        before = len(target.heads)
        async with front_client(l7.http, abort=True) as (reader, writer):
            writer.write(b"".join(_request(t, port) for t in run))
            statuses = [await _answer(reader) for _ in run]
        got = target.heads[before:]
    assert all(head is not None for _, head in alone)
    assert [_status(s) for s in statuses] == [_status(s) for s, _ in alone]
    assert got == [head for _, head in alone]
