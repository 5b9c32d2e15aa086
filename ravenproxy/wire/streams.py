"""Stream lifecycle as a table of ``(state, input) → next state``.

Anything missing from the table is an error: a protocol error when the input came from the peer,
a :class:`StreamError` when it came from the local application.
"""

from __future__ import annotations

import enum

from ravenproxy.wire.windows import RecvWindow, SendWindow


class State(enum.Enum):
    # Members are singletons: identity hashing (C) spares the table lookups, one a frame,
    # Enum's own __hash__ (Python, of the member's name).
    __hash__ = object.__hash__

    OPENING_LOCAL = "opening-local"
    """We sent OPEN and wait for OPEN_RESULT."""
    OPENING_REMOTE = "opening-remote"
    """The peer sent OPEN; we owe it an OPEN_RESULT."""
    OPEN = "open"
    HALF_CLOSED_LOCAL = "half-closed-local"
    """We sent FIN; the peer may still send."""
    HALF_CLOSED_REMOTE = "half-closed-remote"
    """The peer sent FIN; we may still send."""
    CLOSED = "closed"


class Input(enum.Enum):
    __hash__ = object.__hash__  # as State's

    SEND_ACCEPT = "send-accept"
    SEND_REJECT = "send-reject"
    RECV_ACCEPT = "recv-accept"
    RECV_REJECT = "recv-reject"
    SEND_DATA = "send-data"
    RECV_DATA = "recv-data"
    SEND_FIN = "send-fin"
    RECV_FIN = "recv-fin"
    SEND_RESET = "send-reset"
    RECV_RESET = "recv-reset"


S, In = State, Input

TRANSITIONS: dict[tuple[State, Input], State] = {
    (S.OPENING_LOCAL, In.RECV_ACCEPT): S.OPEN,
    (S.OPENING_LOCAL, In.RECV_REJECT): S.CLOSED,
    (S.OPENING_REMOTE, In.SEND_ACCEPT): S.OPEN,
    (S.OPENING_REMOTE, In.SEND_REJECT): S.CLOSED,
    (S.OPEN, In.SEND_DATA): S.OPEN,
    (S.OPEN, In.RECV_DATA): S.OPEN,
    (S.OPEN, In.SEND_FIN): S.HALF_CLOSED_LOCAL,
    (S.OPEN, In.RECV_FIN): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_LOCAL, In.RECV_DATA): S.HALF_CLOSED_LOCAL,
    (S.HALF_CLOSED_LOCAL, In.RECV_FIN): S.CLOSED,
    (S.HALF_CLOSED_REMOTE, In.SEND_DATA): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_REMOTE, In.SEND_FIN): S.CLOSED,
}
# A reset, either way, ends a stream from any state but CLOSED.
for _state in State:
    if _state is not S.CLOSED:
        TRANSITIONS[(_state, In.SEND_RESET)] = S.CLOSED
        TRANSITIONS[(_state, In.RECV_RESET)] = S.CLOSED
del _state

RECEIVING = frozenset(state for state, event in TRANSITIONS if event is In.RECV_DATA)
"""The states in which the peer may send DATA."""
SENDING = frozenset(state for state, event in TRANSITIONS if event is In.SEND_DATA)
"""The states in which this side may send DATA (:attr:`Stream.can_send`)."""


class Stream:
    """One stream's state and windows. The connection owns it and drives it."""

    __slots__ = ("id", "local", "recv", "send", "state")

    def __init__(self, stream_id: int, state: State, local: bool, recv: RecvWindow) -> None:
        self.id = stream_id
        self.state = state
        self.local = local
        """Opened by this side."""
        self.recv = recv
        self.send = SendWindow(0)

    def next_state(self, event: Input) -> State | None:
        """The state after ``event``, or None when the table has no such transition."""
        return TRANSITIONS.get((self.state, event))

    @property
    def can_send(self) -> bool:
        return self.state in SENDING

    def __repr__(self) -> str:
        return f"<Stream {self.id} {self.state.value}>"
