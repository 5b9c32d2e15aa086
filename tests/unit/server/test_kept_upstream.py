"""A direct route's kept connection (a socket the server dialled, no agent), hooked while its
client waits for a next request (:mod:`ravenproxy.server.kept_upstream`): bytes it gets then
answer nothing and let it go (counted), as its end does (not counted); before the hook, the
hook looks at them. 812de76 left such bytes buffered: they began the next request's answer."""

from __future__ import annotations

import asyncio
from typing import cast

from ravenproxy.server.exchange_actions import OpenUpstream
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
