"""Sans-I/O tunnel protocol: frames, stream states, flow-control windows. No asyncio here."""

from ravenproxy.wire.codes import SUBPROTOCOL, ErrorCode
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.frames import Target

__all__ = ["SUBPROTOCOL", "Connection", "ErrorCode", "Target", "WireConfig"]
