"""What :meth:`Connection.receive_message` reports to the application."""

from __future__ import annotations

from dataclasses import dataclass

from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import Target


@dataclass(frozen=True, slots=True)
class SettingsReceived:
    """The peer's SETTINGS arrived."""

    values: dict[str, int]
    server_id: str | None = None
    """The peer's SERVER_ID text setting, if it sent one."""


@dataclass(frozen=True, slots=True)
class StreamOpenRequested:
    """The peer wants a stream to ``target``: answer with accept_stream or reject_stream."""

    stream_id: int
    target: Target


@dataclass(frozen=True, slots=True)
class StreamAccepted:
    """The peer accepted a stream we opened."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamRejected:
    """The peer refused a stream we opened."""

    stream_id: int
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class DataReceived:
    """Payload for a stream. The application must call ``consumed(stream_id, len(data))`` once it
    has written or dropped these bytes: that is what returns credit to the sender."""

    stream_id: int
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The peer half-closed: it will send no more data on this stream."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamReset:
    """The peer reset a stream."""

    stream_id: int
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class WindowUpdated:
    """More credit to send: on one stream, or on the whole connection when ``stream_id`` is 0."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class PingAcked:
    """The peer answered our PING, ``rtt`` seconds after it was sent."""

    rtt: float


@dataclass(frozen=True, slots=True)
class GoAwayReceived:
    """The peer is draining: it takes no stream after ``last_stream_id``."""

    last_stream_id: int
    code: ErrorCode
    reason: str


Event = (
    SettingsReceived
    | StreamOpenRequested
    | StreamAccepted
    | StreamRejected
    | DataReceived
    | StreamEnded
    | StreamReset
    | WindowUpdated
    | PingAcked
    | GoAwayReceived
)
