"""In callback mode the kept tunnel stream calls :meth:`CallbackPath._advance` itself (not
``_on_upstream``, a call more per answer): ``_advance`` must take the stream's news between
requests as ``_on_upstream`` does — its end, or a chunk (bytes nobody asked for), lets the stream
go at once, and the keep-alive clock is not restarted by them."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from ravenproxy.server.exchange_actions import OpenUpstream
from ravenproxy.server.http_callbacks import CallbackPath
from ravenproxy.transport.bytestream import ByteStream, TunnelByteStream
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.transport.tunnel_stream import TunnelStream
from tests.unit.server.test_exchange import get
from tests.unit.server.test_http_callbacks import (
    _A,
    _ANSWER,
    _answered_twice,
    _forwarding,
    _Stream,
    _Transport,
    stray_count,
)


class _Hooked(_Stream):
    """A stream that records who it calls back."""

    def __init__(self) -> None:
        super().__init__()
        self.callback: object = None
        self.take: object = None

    def on_readable(self, callback: object, take: object = None) -> None:
        self.callback, self.take = callback, take


async def test_callback_mode_hooks_the_stream_to_advance_and_unhooks_it() -> None:
    path, _, _ = _answered_twice()
    stream = _Hooked()
    path.upstream = cast(ByteStream, TunnelByteStream(cast(TunnelStream, stream)))
    path._exit = None
    served = asyncio.ensure_future(path._by_callbacks())
    await asyncio.sleep(0)
    assert stream.callback == path._advance  # the answer's chunk: one call, not two
    assert stream.take == path._advance  # ... or taken as it comes, not read back
    assert path.waiting
    path._leave([])
    assert await served == []
    assert stream.callback is None and stream.take is None


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


async def test_a_chunk_between_requests_lets_the_stream_go_at_once() -> None:
    """A chunk calls _advance between requests: it answers nothing (a target that misbehaves,
    a body longer than its framing), and read after the next request it would begin that
    request's answer (812de76 left it unread for that read). The stream is let go now,
    counted, the keep-alive clock not restarted; the next request opens a new one."""
    path, stream, transport = _answered_twice()
    watch = path._calls
    assert watch is not None
    watch.last -= 10
    stamp = watch.last
    stream.chunks.append(b"xyz")
    path._advance()  # the stream's callback, between requests
    assert path.upstream is None and stray_count(path) == 1 and len(transport.out) == 2
    assert watch.last == stamp and path.waiting and path._unread
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert path._exit is not None and path._exit.done()
    assert [type(a) for a in path._exit.result()] == [OpenUpstream]
    assert len(transport.out) == 2 and not any(b"GET /c " in sent for sent in stream.sent)


def _stray_then_pipelined(chunks: list[bytes]) -> tuple[CallbackPath, _Stream, list[bytes]]:
    """A connection in callback mode that sent ``/a`` with ``/b`` pipelined behind it, on a
    kept tunnel stream that then holds ``chunks`` (the answer and more), read by its callback."""
    stream = _Stream(*chunks)
    client = get("/a", "edge-1:9100") + get("/b", "edge-1:9100")
    path, _ = _forwarding(client, stream, _A)
    path.upstream = cast(ByteStream, TunnelByteStream(cast(TunnelStream, stream)))
    path._advance()  # the stream's callback
    return path, stream, cast(_Transport, cast(SocketStream, path.reader).transport).out


@pytest.mark.parametrize(
    "chunks",
    [[_ANSWER + b"xyz"], [_ANSWER, b"xyz"], [_ANSWER, _ANSWER]],
    ids=["same-chunk", "next-chunk", "an-answer-more"],
)
async def test_bytes_past_the_answer_let_the_stream_go_before_a_pipelined_request(
    chunks: list[bytes],
) -> None:
    """The answer's end, and bytes past it — in its chunk (the exchange sees them) or in a
    chunk after it, not read yet when the pipelined request is taken (no wait for it, so no
    hook looked) — the stream is let go before ``/b`` goes out on it: a fresh one is opened
    (by the task), and ``/b``'s answer is not the target's extra bytes (812de76: it was)."""
    path, stream, out = _stray_then_pipelined(chunks)
    assert path.upstream is None and stray_count(path) == 1
    assert len(out) == 1 and out[0].endswith(b"\r\n\r\nok")
    assert path._exit is not None and path._exit.done()
    assert [type(a) for a in path._exit.result()] == [OpenUpstream]
    assert not any(b"GET /b " in sent for sent in stream.sent)


async def test_a_pipelined_request_after_a_clean_answer_stays_on_the_stream() -> None:
    path, stream, out = _stray_then_pipelined([_ANSWER])
    assert len(out) == 1
    assert path.upstream is not None and stray_count(path) == 0
    assert stream.sent[-1].startswith(b"GET /b ") and path.ex.phase == "forwarding"
