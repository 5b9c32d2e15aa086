"""Review of ansfast's _unread (issue 15): a request sent with no read of the target's stream
after it must still leave no chunk, end or reset of that stream unseen."""

from __future__ import annotations

from typing import cast

from ravenproxy.server.exchange_actions import OpenUpstream
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.transport.tunnel_stream import StreamClosedError
from ravenproxy.wire.codes import ErrorCode
from tests.unit.server.test_exchange import get
from tests.unit.server.test_http_callbacks import _answered_twice


async def test_a_stream_that_ended_between_requests_is_let_go_before_the_next() -> None:
    """The stream's end calls back between requests (its answers all read, nothing unread):
    the kept stream is let go then, and the next request goes to a new one (the task opens
    it), not to the ended stream whose answer would never come (a wait until --idle-timeout)."""
    path, stream, _ = _answered_twice()
    assert not path._unread
    stream.ended = True
    path._on_upstream()
    assert path.upstream is None
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert path._exit is not None and path._exit.done()
    assert [type(a) for a in path._exit.result()] == [OpenUpstream]
    assert not any(sent.startswith(b"GET /c ") for sent in stream.sent)


async def test_a_reset_that_came_while_out_of_callback_mode_is_read_after_the_request() -> None:
    """The request went out with nothing unread; the reset's callback found the path out of
    callback mode (its exit set: the task's time) — it must be read once a request goes out
    again, not assumed absent (the answer would never come)."""
    path, stream, _ = _answered_twice()
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert path.ex.phase == "forwarding" and not path._unread
    exit_ = path._exit
    assert exit_ is not None
    path._exit = None  # out of callback mode (between _leave and the task's return)
    stream.chunks.append(StreamClosedError(ErrorCode.CANCEL, "reset"))
    path._on_upstream()
    assert path._unread
    path._exit = exit_
    path._advance()  # the next callback (the client's, say): the reset is read
    assert exit_.done() and path.ex.phase != "forwarding"
