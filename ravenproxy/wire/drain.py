"""GOAWAY either way — the end of a :class:`~ravenproxy.wire.connection.Connection`'s new
streams — and who is told when that happens: a base of the connection, which owns every
attribute named here.

Whoever keeps decisions that hold only while a connection takes new streams (the server's
agent registry: a keep-alive client's route is reused without asking while the registry's
generation has not moved, its agent checked once when it has) hands down
:attr:`Drain.on_draining` and is called at each change that ends that: a GOAWAY sent
(:meth:`Drain.goaway`, a connection error's included), one received, and :meth:`Drain.ended`
(the session over the connection ended). Each of them, not only the first: a call more costs a
check; one missed would route a request to an agent that refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ravenproxy.wire import events as ev
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import Frame, GoAway
from ravenproxy.wire.streams import Input, State, Stream


class Drain:
    goaway_sent: GoAway | None
    goaway_received: GoAway | None
    on_draining: Callable[[], None] | None
    """Called (no argument) each time the connection stops taking new streams for one more
    reason (see the module): set by who holds the connection, None: nobody asks."""
    streams: dict[int, Stream]
    _highest_peer_id: int

    if TYPE_CHECKING:  # the connection's

        def _emit(self, frame: Frame) -> None: ...

        def _transition(self, stream: Stream, event: Input) -> None: ...

    def goaway(self, code: ErrorCode = ErrorCode.OK, reason: str = "") -> None:
        """Drain: the peer may not open new streams; open ones finish normally."""
        if self.goaway_sent is None or code is not ErrorCode.OK:
            self._send_goaway(code, reason)

    def ended(self) -> None:
        """The session over this connection ended (it carries nothing more): tell
        :attr:`on_draining`. The connection itself does not change."""
        if self.on_draining is not None:
            self.on_draining()

    def _send_goaway(self, code: ErrorCode, reason: str) -> None:
        self.goaway_sent = GoAway(self._highest_peer_id, code, clip(reason))
        self._emit(self.goaway_sent)
        if self.on_draining is not None:
            self.on_draining()

    def _recv_goaway(self, frame: GoAway, out: list[ev.Event]) -> None:
        self.goaway_received = frame
        if self.on_draining is not None:
            self.on_draining()
        out.append(ev.GoAwayReceived(frame.last_stream_id, frame.code, frame.reason))
        # Our opens above last_stream_id were never seen by the peer: fail them so the caller
        # can retry elsewhere.
        for stream in [s for s in self.streams.values() if s.local and s.id > frame.last_stream_id]:
            if stream.state is State.OPENING_LOCAL:
                self._transition(stream, Input.RECV_REJECT)
                out.append(ev.StreamRejected(stream.id, ErrorCode.GOING_AWAY, frame.reason))


def clip(text: str, limit: int = 512) -> str:
    """``text`` cut to ``limit`` bytes of UTF-8 (a frame's reason or message), whole
    characters only."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", errors="ignore")
