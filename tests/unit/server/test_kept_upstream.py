"""A direct route's kept connection (a socket the server dialled, no agent), hooked while its
client waits for a next request (:mod:`ravenproxy.server.kept_upstream`): bytes it gets then
answer nothing and let it go (counted), as its end does (not counted); before the hook, the
hook looks at them. 812de76 left such bytes buffered: they began the next request's answer."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest

from ravenproxy.server.exchange_actions import OpenUpstream
from ravenproxy.server.kept_upstream import QUIET, STRAY, TIMED_OUT, closes_idle, news
from ravenproxy.transport.bytestream import ByteStream, SocketByteStream
from ravenproxy.transport.socket_stream import SocketStream
from tests.unit.server.test_exchange import get
from tests.unit.server.test_http_callbacks import (
    _A,
    _ANSWER,
    _Connection,
    _forwarding,
    _Stream,
    _Transport,
    stray_count,
)


def _kept_direct() -> tuple[_Connection, SocketStream]:
    """A connection answered once, waiting for its next request, whose kept target connection
    is a direct socket (the task's wait: hooked, not served by callbacks)."""
    path, _ = _forwarding(get("/a", "edge-1:9100"), _Stream(_ANSWER), _A)
    path._advance()
    assert path.ex.phase == "head" and path.waiting
    path._hooked = None
    target = SocketStream(64 * 1024)
    target.connection_made(cast(asyncio.Transport, _Transport()))
    path.upstream = cast(ByteStream, SocketByteStream(target, target))
    return cast(_Connection, path), target


def _next_opens_a_fresh_one(path: _Connection) -> None:
    cast(SocketStream, path.reader).data_received(get("/b", "edge-1:9100"))
    path._advance()
    assert path._exit is not None and path._exit.done()
    assert [type(a) for a in path._exit.result()] == [OpenUpstream]


async def test_bytes_on_a_kept_direct_connection_let_it_go() -> None:
    path, target = _kept_direct()
    path._hook_kept()
    path._kept_ended()
    assert path.upstream is not None  # nothing came: kept
    target.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz")
    assert path.upstream is None and stray_count(path) == 1
    _next_opens_a_fresh_one(path)


async def test_bytes_that_came_before_the_hook_let_it_go_at_the_hook() -> None:
    path, target = _kept_direct()
    target.data_received(b"xyz")
    path._hook_kept()
    path._kept_ended()
    assert path.upstream is None and stray_count(path) == 1
    _next_opens_a_fresh_one(path)


async def test_the_end_of_a_kept_direct_connection_lets_it_go_uncounted() -> None:
    path, target = _kept_direct()
    path._hook_kept()
    target.eof_received()
    assert path.upstream is None and stray_count(path) == 0


async def test_a_pipelined_request_does_not_go_out_on_it() -> None:
    """No wait before the request (pipelined), so no hook: its bytes are looked at first."""
    path, target = _kept_direct()
    target.data_received(b"xyz")
    path.waiting = False  # the next request is at hand
    path._let_go_ended()
    assert path.upstream is None and stray_count(path) == 1


TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


async def test_a_408_on_a_kept_direct_connection_is_its_end_uncounted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A target that closes its idle connection with a 408 first: let go as its end is (the
    next request on a fresh one), not stray, a debug line, no info line."""
    path, target = _kept_direct()
    path._hook_kept()
    with caplog.at_level(logging.DEBUG, logger="ravenproxy.server.kept_upstream"):
        target.data_received(TIMEOUT_408)
    assert path.upstream is None and stray_count(path) == 0
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert "closed its idle connection (408)" in caplog.records[0].getMessage()
    _next_opens_a_fresh_one(path)


@pytest.mark.parametrize(
    "got",
    [TIMEOUT_408, b"HTTP/1.0 408 Request Time-out\r\n\r\n", b"HTTP/1.1 408", b"HTTP/1.1 408 "],
)
def test_a_408_head_is_the_idle_close(got: bytes) -> None:
    """Go's ``is408Message``: ``HTTP/1.`` any minor version, `` 408``, 12 bytes at least."""
    assert closes_idle(got)
    assert news(lambda: got) == TIMED_OUT
    assert news(lambda: memoryview(got)) == TIMED_OUT


@pytest.mark.parametrize(
    "got",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 40",
        b"\r\nHTTP/1.1 408 Request Timeout\r\n\r\n",
        b"HTTP/2.0 408 x",
        b"HTTP/1.1 508 Loop Detected\r\n\r\n",
        b"xyz\r\n",
    ],
)
def test_other_bytes_are_stray(got: bytes) -> None:
    assert not closes_idle(got)
    assert news(lambda: got) == STRAY


def test_empty_lines_stay_quiet() -> None:
    assert news(lambda: b"\r\n\r\n") == QUIET
