"""Numbers that appear on the wire: frame types, flags, settings and error codes.

``docs/protocol.md`` is the normative description; these enums are its Python spelling.
"""

from __future__ import annotations

import enum

SUBPROTOCOL = "ravenproxy.v1"
"""WebSocket subprotocol that selects this version of the protocol."""


class FrameType(enum.IntEnum):
    SETTINGS = 0x0
    OPEN = 0x1
    OPEN_RESULT = 0x2
    DATA = 0x3
    WINDOW_UPDATE = 0x4
    RESET = 0x5
    PING = 0x6
    GOAWAY = 0x7


class Flag(enum.IntFlag):
    NONE = 0x0
    FIN = 0x1
    """DATA: the sender will send no more data on this stream (half-close)."""
    ACK = 0x1
    """PING: this is the answer to a PING with the same payload."""


class Setting(enum.IntEnum):
    MAX_FRAME_SIZE = 0x1
    MAX_CONCURRENT_STREAMS = 0x2
    INITIAL_STREAM_WINDOW = 0x3
    CONNECTION_WINDOW = 0x4
    SERVER_ID = 0x5
    """Text setting (docs/protocol.md 5.1): the server's id, 4 UTF-8 bytes per entry."""


DUPLICATE_CLOSE_CODE = 4000
"""WebSocket close code of an agent closing a tunnel to a server (SERVER_ID) it already holds
a tunnel to, e.g. reached again through a load balancer (docs/protocol.md 10.1)."""


class ErrorCode(enum.IntEnum):
    """Codes carried by OPEN_RESULT, RESET and GOAWAY."""

    OK = 0
    PROTOCOL_ERROR = 1
    FLOW_CONTROL_ERROR = 2
    FRAME_SIZE_ERROR = 3
    TOO_MANY_STREAMS = 4
    REFUSED = 5
    """The target is not in the agent's allowlist (or is always denied)."""
    UNKNOWN_NODE = 6
    DIAL_FAILED = 7
    DIAL_TIMEOUT = 8
    CANCEL = 9
    """The stream is no longer wanted (the client went away)."""
    INTERNAL_ERROR = 10
    GOING_AWAY = 11
    """The sender is draining: the stream was not opened, retry elsewhere."""
    OPEN_TIMEOUT = 12
    """No OPEN_RESULT arrived in time."""
    CONNECTION_LOST = 13
    """Local only: the tunnel under the stream went away. Never sent."""
    ENHANCE_YOUR_CALM = 14
    """The peer made us queue more answers (PING acks, OPEN_RESULTs, ...) than it read."""

    @classmethod
    def parse(cls, value: int) -> ErrorCode:
        """Unknown codes from a newer peer read as INTERNAL_ERROR rather than failing."""
        try:
            return cls(value)
        except ValueError:
            return cls.INTERNAL_ERROR
