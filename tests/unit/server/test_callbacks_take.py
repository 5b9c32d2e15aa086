"""In callback mode an answer's chunk is handed to :meth:`CallbackPath._advance` as the tunnel
stream gets it (the stream's ``take``), not queued for ``_advance`` to read back: taken only
while the exchange forwards an answer and the client takes bytes; otherwise the stream holds it
and calls back, and the call back does what a read of it did before."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import cast
from unittest import mock

from ravenproxy.server.exchange_actions import Close
from ravenproxy.server.http_callbacks import KEEPALIVE_TIMEOUT
from ravenproxy.transport.socket_stream import SocketStream
from tests.unit.server.test_exchange import get
from tests.unit.server.test_http_callbacks import (
    _A,
    _ANSWER,
    IDLE,
    _answered_twice,
    _forwarding,
    _fresh,
    _Stream,
    _Transport,
    stray_count,
)


def _feed(path: object, stream: _Stream, data: bytes) -> bool:
    """TunnelStream._feed's contract: a chunk that finds the stream holding none is offered
    to ``take`` first; one not taken is held and the callback called. Whether it was taken."""
    advance = path._advance  # type: ignore[attr-defined]
    if not stream.chunks and advance(data):
        return True
    stream.chunks.append(data)
    advance()
    return False


async def test_an_answer_taken_as_it_comes_is_written_and_not_read_back() -> None:
    stream = _Stream()
    path, watch = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    assert _feed(path, stream, _ANSWER)
    out = cast(_Transport, cast(SocketStream, path.reader).transport).out
    assert out == [_ANSWER] and stream.reads == 0
    assert path.ex.phase == "head" and path.waiting
    assert watch.timeout_now() == KEEPALIVE_TIMEOUT and _fresh(watch)
    assert path._exit is not None and not path._exit.done()


async def test_an_answer_in_two_chunks_is_taken_twice_and_stamped_between() -> None:
    stream = _Stream()
    path, watch = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    assert _feed(path, stream, memoryview(_ANSWER[:-1]))  # a view of a tunnel message
    assert path.ex.phase == "forwarding" and _fresh(watch) and watch.timeout_now() == IDLE
    assert _feed(path, stream, _ANSWER[-1:])
    out = cast(_Transport, cast(SocketStream, path.reader).transport).out
    assert b"".join(out) == _ANSWER and stream.reads == 0 and path.waiting


async def test_a_chunk_for_a_client_that_stops_reading_is_held_for_the_task() -> None:
    """Not taken: the stream holds it (its credit with it) and the task reads it once the
    client took what was written, as before the take."""
    stream = _Stream()
    path, watch = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    sock = cast(SocketStream, path.reader)
    sock.write_paused = True
    assert path._advance(_ANSWER) is False
    assert cast(_Transport, sock.transport).out == [] and path._exit is not None
    assert not path._exit.done()  # the refusal alone does not leave: the call back does
    assert not _feed(path, stream, _ANSWER)
    assert stream.chunks == [_ANSWER] and path._exit.result() == [] and _fresh(watch)


async def test_a_chunk_between_requests_is_not_taken_and_lets_the_stream_go() -> None:
    """Between requests a chunk answers nothing: not taken as an answer, it is held and the
    call back's news rule lets the stream go (as for a chunk read back)."""
    path, stream, transport = _answered_twice()
    assert not _feed(path, stream, b"xyz")
    assert path.upstream is None and stray_count(path) == 1 and len(transport.out) == 2
    assert path._unread


async def test_a_chunk_from_inside_a_callback_is_not_taken() -> None:
    """Called back while busy (a write that made the session read): held, marked unread;
    the loop running sees it."""
    stream = _Stream()
    path, _ = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    path._busy = True
    path._unread = False
    assert path._advance(_ANSWER) is False
    assert path._unread and path.ex.phase == "forwarding"


async def test_a_chunk_out_of_callback_mode_is_not_taken() -> None:
    stream = _Stream()
    path, _ = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    path._exit = None
    assert path._advance(_ANSWER) is False
    assert cast(_Transport, cast(SocketStream, path.reader).transport).out == []


@contextlib.contextmanager
def _socket_reads() -> Iterator[list[int | None]]:
    """Every SocketStream.read_nowait while it lasts: what each returned's length (None)."""
    reads: list[int | None] = []
    real = SocketStream.read_nowait

    def counted(self: SocketStream, n: int = -1) -> bytes | None:
        data = real(self, n)
        reads.append(None if data is None else len(data))
        return data

    with mock.patch.object(SocketStream, "read_nowait", counted):
        yield reads


async def test_an_answers_end_reads_the_client_only_if_something_came() -> None:
    stream = _Stream()
    path, _ = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    sock = cast(SocketStream, path.reader)
    with _socket_reads() as reads:
        assert _feed(path, stream, _ANSWER)
        assert reads == [] and path.waiting  # nothing came: no read that finds nothing
        sock.data_received(get("/b", "edge-1:9100"))
        path._advance()  # the socket's callback
        assert len(reads) == 1 and stream.sent[-1].startswith(b"GET /b ")
        assert _feed(path, stream, _ANSWER)
        assert len(reads) == 1 and path.waiting


async def test_a_request_that_came_during_the_answer_is_read_at_its_end() -> None:
    stream = _Stream()
    path, _ = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    sock = cast(SocketStream, path.reader)
    with _socket_reads() as reads:
        sock.data_received(get("/b", "edge-1:9100"))
        path._advance()  # the socket's callback while forwarding: not read yet
        assert reads == [] and path.ex.phase == "forwarding"
        assert _feed(path, stream, _ANSWER)
        assert len(reads) == 1 and reads[0] and stream.sent[-1].startswith(b"GET /b ")
        assert path.ex.phase == "forwarding"


async def test_a_client_eof_during_the_answer_closes_at_its_end() -> None:
    stream = _Stream()
    path, _ = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    sock = cast(SocketStream, path.reader)
    sock.eof_received()
    path._advance()  # the socket's callback while forwarding
    assert _feed(path, stream, _ANSWER)
    assert path._exit is not None and [type(a) for a in path._exit.result()] == [Close]
