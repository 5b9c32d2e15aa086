"""In callback mode the kept tunnel stream calls :meth:`CallbackPath._advance` itself (not
``_on_upstream``, a call more per answer): ``_advance`` must take the stream's news between
requests as ``_on_upstream`` does — its end lets the stream go at once, a chunk is noticed and
not read, and the keep-alive clock is not restarted by them."""

from __future__ import annotations

import asyncio
from typing import cast

from ravenproxy.server.exchange_actions import OpenUpstream
from ravenproxy.transport.bytestream import ByteStream, TunnelByteStream
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.transport.tunnel_stream import TunnelStream
from tests.unit.server.test_exchange import get
from tests.unit.server.test_http_callbacks import _ANSWER, _answered_twice, _Stream


class _Hooked(_Stream):
    """A stream that records who it calls back."""

    def __init__(self) -> None:
        super().__init__()
        self.callback: object = None

    def on_readable(self, callback: object) -> None:
        self.callback = callback


async def test_callback_mode_hooks_the_stream_to_advance_and_unhooks_it() -> None:
    path, _, _ = _answered_twice()
    stream = _Hooked()
    path.upstream = cast(ByteStream, TunnelByteStream(cast(TunnelStream, stream)))
    path._exit = None
    served = asyncio.ensure_future(path._by_callbacks())
    await asyncio.sleep(0)
    assert stream.callback == path._advance  # the answer's chunk: one call, not two
    assert path.waiting
    path._leave([])
    assert await served == []
    assert stream.callback is None


async def test_the_streams_end_between_requests_lets_it_go_at_once() -> None:
    """The end calls _advance between requests: the stream is let go now (the next request
    opens a new one), not sent the request whose answer would never come."""
    path, stream, _ = _answered_twice()
    watch = path._calls
    assert watch is not None
    watch.last -= 10
    stamp = watch.last
    stream.ended = True
    path._advance()  # the stream's callback
    assert path.upstream is None and path._unread
    assert watch.last == stamp  # the keep-alive clock goes on: no byte of the client came
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert path._exit is not None and path._exit.done()
    assert [type(a) for a in path._exit.result()] == [OpenUpstream]
    assert not any(sent.startswith(b"GET /c ") for sent in stream.sent)


async def test_a_chunk_between_requests_is_noticed_not_read_until_the_next_goes_out() -> None:
    path, stream, transport = _answered_twice()
    watch = path._calls
    assert watch is not None
    watch.last -= 10
    stamp = watch.last
    reads = stream.reads
    stream.chunks.append(_ANSWER)
    path._advance()  # the stream's callback, between requests
    assert stream.reads == reads and len(transport.out) == 2 and path._unread
    assert watch.last == stamp and path.waiting and path.upstream is not None
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert len(transport.out) == 3 and transport.out[-1].endswith(b"ok")
    assert path.ex.phase == "head"
