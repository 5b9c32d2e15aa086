"""Errors of the wire layer. Each carries the :class:`ErrorCode` to put on the wire."""

from __future__ import annotations

from ravenproxy.errors import RavenProxyError
from ravenproxy.wire.codes import ErrorCode


class WireError(RavenProxyError):
    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message


class ProtocolError(WireError):
    """The peer broke the protocol: the whole connection is closed with this code."""

    code = ErrorCode.PROTOCOL_ERROR


class FrameSizeError(ProtocolError):
    code = ErrorCode.FRAME_SIZE_ERROR


class FlowControlError(ProtocolError):
    code = ErrorCode.FLOW_CONTROL_ERROR


class ControlFloodError(ProtocolError):
    """The peer kept us from sending our answers to its frames (it does not read them) for too
    long: the connection is closed with ENHANCE_YOUR_CALM."""

    code = ErrorCode.ENHANCE_YOUR_CALM


class StreamError(WireError):
    """A local call is not valid for this stream now (closed, wrong state, unknown id)."""


class WindowExceeded(StreamError):
    """A local send exceeds the credit the peer granted; wait for WindowUpdated."""

    code = ErrorCode.FLOW_CONTROL_ERROR


class StreamLimitError(WireError):
    """Opening one more stream would exceed the peer's MAX_CONCURRENT_STREAMS."""

    code = ErrorCode.TOO_MANY_STREAMS


class GoingAwayError(WireError):
    """The connection is draining: no new streams."""

    code = ErrorCode.GOING_AWAY
