"""Frame codec: bytes ⇄ frame values. Pure functions, no state.

Every frame is a 12-byte header followed by ``length`` payload bytes::

    type u8 | flags u8 | reserved u16 (0) | stream_id u32 | length u32 | payload

Integers are big-endian. One WebSocket binary message carries one or more whole frames; a frame
never spans two messages.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ravenproxy.wire.codes import ErrorCode, Flag, FrameType
from ravenproxy.wire.errors import FrameSizeError, ProtocolError

HEADER = struct.Struct("!BBHII")
HEADER_SIZE = HEADER.size  # 12

MIN_FRAME_SIZE = 16 * 1024
MAX_FRAME_SIZE_LIMIT = 16 * 1024 * 1024
MAX_WINDOW = 2**31 - 1
MAX_TEXT = 1024
"""Longest node name, host or reason text accepted, in UTF-8 bytes."""

IN_PLACE_SHARE = 4
"""A received DATA payload stays a view into its message when it is at least 1/4 of it: what
a stalled stream's buffered views keep alive is then at most 4 times what they hold."""

COPY_BELOW = 512
"""A DATA payload shorter than this is copied whatever its share of the message: a copy of a
few hundred bytes costs less than a view (and than making a view bytes again downstream, as the
server's HTTP front does)."""

MAX_SETTING_TEXT = 256
"""Longest text a text setting (SERVER_ID) carries, in UTF-8 bytes: 64 entries."""

_U16 = struct.Struct("!H")
_U32 = struct.Struct("!I")
_SETTING = struct.Struct("!HI")
_OPEN_HEAD = struct.Struct("!IH")  # initial window, port
_RESULT_HEAD = struct.Struct("!HI")  # code, initial window
_GOAWAY_HEAD = struct.Struct("!IH")  # last stream id, code


@dataclass(frozen=True, slots=True)
class Target:
    """Where a stream should go: the node it is for, and the host:port the agent dials."""

    node: str
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.node}→{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Settings:
    """SETTINGS: the sender's limits, as (id, value) pairs."""

    stream_id = 0
    values: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Open:
    """OPEN: a new stream to ``target``, with the receive window the opener grants."""

    stream_id: int
    window: int
    target: Target


@dataclass(frozen=True, slots=True)
class OpenResult:
    """OPEN_RESULT: the answer to an OPEN (``code`` OK, or why not)."""

    stream_id: int
    code: ErrorCode
    window: int
    message: str = ""


@dataclass(frozen=True, slots=True)
class Data:
    """DATA: bytes of one stream; ``fin``: the sender's last."""

    stream_id: int
    data: bytes | memoryview
    """Received: a view into the message it came in when it is a large part of it (parsed in
    place, no copy before it reaches a socket), else a copy (a small view must not keep a
    large message alive; a payload under :data:`COPY_BELOW` bytes is always a copy)."""
    fin: bool = False


@dataclass(frozen=True, slots=True)
class WindowUpdate:
    """WINDOW_UPDATE: more credit to send, on one stream or (stream 0) the connection."""

    stream_id: int
    increment: int


@dataclass(frozen=True, slots=True)
class Reset:
    """RESET: a stream ended abnormally, with its code."""

    stream_id: int
    code: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class Ping:
    """PING, or its acknowledgement (``ack``) with the same payload."""

    payload: bytes
    ack: bool = False
    stream_id = 0


@dataclass(frozen=True, slots=True)
class GoAway:
    """GOAWAY: the sender drains; streams after ``last_stream_id`` were not taken."""

    last_stream_id: int
    code: ErrorCode
    reason: str = ""
    stream_id = 0


Frame = Settings | Open | OpenResult | Data | WindowUpdate | Reset | Ping | GoAway


def _text(value: str, what: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > MAX_TEXT:
        raise ValueError(f"{what} longer than {MAX_TEXT} bytes")
    return raw


def text_setting(key: int, text: str) -> tuple[tuple[int, int], ...]:
    """A text setting as SETTINGS entries: 4 UTF-8 bytes per entry, in order, the last one
    padded with zero bytes (docs/protocol.md 5.1). Old peers ignore the unknown id, so the
    text travels in SETTINGS without changing its fixed 6-byte entry layout."""
    raw = text.encode("utf-8")
    if len(raw) > MAX_SETTING_TEXT:
        raise ValueError(f"setting text longer than {MAX_SETTING_TEXT} bytes")
    if b"\0" in raw:
        raise ValueError("setting text contains a NUL character")
    raw += b"\0" * (-len(raw) % 4)
    return tuple((key, _U32.unpack_from(raw, pos)[0]) for pos in range(0, len(raw), 4))


def read_text_setting(values: tuple[tuple[int, int], ...], key: int) -> str | None:
    """The text of setting ``key`` in received SETTINGS entries; None when absent. Too long or
    invalid UTF-8 is a connection error."""
    chunks = [_U32.pack(v) for k, v in values if k == key]
    if not chunks:
        return None
    if len(chunks) * 4 > MAX_SETTING_TEXT:
        raise ProtocolError(f"setting 0x{key:x} text longer than {MAX_SETTING_TEXT} bytes")
    raw = b"".join(chunks).rstrip(b"\0")
    if b"\0" in raw:
        raise ProtocolError(f"setting 0x{key:x} text contains a NUL byte")
    return _decode_text(raw, f"setting 0x{key:x} text")


def _header(type_: FrameType, flags: int, stream_id: int, length: int) -> bytes:
    return HEADER.pack(type_, flags, 0, stream_id, length)


def encode_data_header(stream_id: int, length: int, fin: bool) -> bytes:
    """Header of a DATA frame, for callers that send the payload without copying it."""
    return HEADER.pack(FrameType.DATA, Flag.FIN if fin else 0, 0, stream_id, length)


def encode(frame: Frame) -> bytes:
    """One frame → its bytes (header + payload)."""
    match frame:
        case Data(stream_id, data, fin):
            return encode_data_header(stream_id, len(data), fin) + bytes(data)
        case WindowUpdate(stream_id, increment):
            return _header(FrameType.WINDOW_UPDATE, 0, stream_id, 4) + _U32.pack(increment)
        case Open(stream_id, window, target):
            node = _text(target.node, "node name")
            host = _text(target.host, "host")
            body = (
                _OPEN_HEAD.pack(window, target.port)
                + _U16.pack(len(node))
                + node
                + _U16.pack(len(host))
                + host
            )
            return _header(FrameType.OPEN, 0, stream_id, len(body)) + body
        case OpenResult(stream_id, code, window, message):
            body = _RESULT_HEAD.pack(code, window) + _text(message, "message")
            return _header(FrameType.OPEN_RESULT, 0, stream_id, len(body)) + body
        case Reset(stream_id, code, message):
            body = _U16.pack(code) + _text(message, "message")
            return _header(FrameType.RESET, 0, stream_id, len(body)) + body
        case Ping(payload, ack):
            if len(payload) != 8:
                raise ValueError("PING payload must be 8 bytes")
            return _header(FrameType.PING, Flag.ACK if ack else 0, 0, 8) + payload
        case GoAway(last_stream_id, code, reason):
            body = _GOAWAY_HEAD.pack(last_stream_id, code) + _text(reason, "reason")
            return _header(FrameType.GOAWAY, 0, 0, len(body)) + body
        case Settings(values):
            body = b"".join(_SETTING.pack(k, v) for k, v in values)
            return _header(FrameType.SETTINGS, 0, 0, len(body)) + body
    raise TypeError(f"not a frame: {frame!r}")


def _decode_text(raw: bytes | memoryview, what: str) -> str:
    if len(raw) > MAX_TEXT:
        raise ProtocolError(f"{what} longer than {MAX_TEXT} bytes")
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not valid UTF-8") from None


def _need_stream(type_: FrameType, stream_id: int) -> None:
    if stream_id == 0:
        raise ProtocolError(f"{type_.name} on stream 0")


def _need_conn(type_: FrameType, stream_id: int) -> None:
    if stream_id != 0:
        raise ProtocolError(f"{type_.name} on stream {stream_id}, must be stream 0")


# Per frame decoded: a dict lookup and plain ints, not an enum constructor call and an IntFlag
# operation (both Python-level code in the enum module).
_FRAME_TYPES = {int(t): t for t in FrameType}
_FIN = int(Flag.FIN)
_ACK = int(Flag.ACK)


def _decode_one(
    type_byte: int, flags: int, stream_id: int, payload: memoryview, message_size: int
) -> Frame | None:
    """``message_size``: of the immutable message ``payload`` is part of, 0 for one that may
    change (DATA payloads are then copied)."""
    type_ = _FRAME_TYPES.get(type_byte)
    if type_ is None:
        return None  # unknown frame types are ignored, so later versions can add some
    size = len(payload)
    if type_ is FrameType.DATA:
        _need_stream(type_, stream_id)
        in_place = 0 < message_size <= size * IN_PLACE_SHARE and size >= COPY_BELOW
        data = payload if in_place else bytes(payload)
        return Data(stream_id, data, bool(flags & _FIN))
    if type_ is FrameType.WINDOW_UPDATE:
        if size != 4:
            raise FrameSizeError(f"WINDOW_UPDATE payload is {size} bytes, must be 4")
        increment = _U32.unpack_from(payload)[0]
        if not 0 < increment <= MAX_WINDOW:
            raise ProtocolError(f"WINDOW_UPDATE increment {increment} out of range")
        return WindowUpdate(stream_id, increment)
    if type_ is FrameType.OPEN:
        _need_stream(type_, stream_id)
        try:
            window, port = _OPEN_HEAD.unpack_from(payload)
            pos = _OPEN_HEAD.size
            (n,) = _U16.unpack_from(payload, pos)
            node = _decode_text(payload[pos + 2 : pos + 2 + n], "node name")
            pos += 2 + n
            (h,) = _U16.unpack_from(payload, pos)
            if pos + 2 + h != size:
                raise FrameSizeError("OPEN payload length does not match its fields")
            host = _decode_text(payload[pos + 2 : pos + 2 + h], "host")
        except struct.error:
            raise FrameSizeError("OPEN payload truncated") from None
        if len(node.encode()) != n:
            raise FrameSizeError("OPEN payload truncated")
        if window > MAX_WINDOW:
            raise ProtocolError(f"OPEN window {window} out of range")
        return Open(stream_id, window, Target(node, host, port))
    if type_ is FrameType.OPEN_RESULT:
        _need_stream(type_, stream_id)
        if size < _RESULT_HEAD.size:
            raise FrameSizeError("OPEN_RESULT payload truncated")
        code, window = _RESULT_HEAD.unpack_from(payload)
        if window > MAX_WINDOW:
            raise ProtocolError(f"OPEN_RESULT window {window} out of range")
        msg = _decode_text(payload[_RESULT_HEAD.size :], "message")
        return OpenResult(stream_id, ErrorCode.parse(code), window, msg)
    if type_ is FrameType.RESET:
        _need_stream(type_, stream_id)
        if size < 2:
            raise FrameSizeError("RESET payload truncated")
        (code,) = _U16.unpack_from(payload)
        return Reset(stream_id, ErrorCode.parse(code), _decode_text(payload[2:], "message"))
    if type_ is FrameType.PING:
        _need_conn(type_, stream_id)
        if size != 8:
            raise FrameSizeError(f"PING payload is {size} bytes, must be 8")
        return Ping(bytes(payload), bool(flags & _ACK))
    if type_ is FrameType.GOAWAY:
        _need_conn(type_, stream_id)
        if size < _GOAWAY_HEAD.size:
            raise FrameSizeError("GOAWAY payload truncated")
        last, code = _GOAWAY_HEAD.unpack_from(payload)
        reason = _decode_text(payload[_GOAWAY_HEAD.size :], "reason")
        return GoAway(last, ErrorCode.parse(code), reason)
    # SETTINGS
    _need_conn(type_, stream_id)
    if size % _SETTING.size:
        raise FrameSizeError(f"SETTINGS payload is {size} bytes, not a multiple of 6")
    values = tuple(_SETTING.iter_unpack(payload))
    return Settings(tuple((int(k), int(v)) for k, v in values))


def decode_message(message: bytes | bytearray | memoryview, max_frame_size: int) -> list[Frame]:
    """All frames of one WebSocket message. A frame cut short or a DATA payload larger than
    ``max_frame_size`` (the receiver's own setting) is a connection error."""
    view = memoryview(message)
    total = len(view)
    # Views of an immutable message stay valid; a caller's mutable buffer may be reused. A
    # read-only view counts as immutable: the tunnel reader's lent messages (wsframes), whose
    # buffer is not reused while a view of it is held; such views keep that whole buffer alive.
    if isinstance(message, bytes):
        message_size = total
    elif isinstance(message, memoryview) and message.readonly and message.obj is not None:
        message_size = memoryview(message.obj).nbytes
    else:
        message_size = 0
    pos = 0
    frames: list[Frame] = []
    while pos < total:
        if total - pos < HEADER_SIZE:
            raise FrameSizeError("message ends inside a frame header")
        type_byte, flags, reserved, stream_id, length = HEADER.unpack_from(view, pos)
        pos += HEADER_SIZE
        if length > total - pos:
            raise FrameSizeError("message ends inside a frame payload")
        if length > max_frame_size:
            raise FrameSizeError(f"frame of {length} bytes exceeds MAX_FRAME_SIZE {max_frame_size}")
        if reserved:
            raise ProtocolError("reserved header bits are set")
        frame = _decode_one(type_byte, flags, stream_id, view[pos : pos + length], message_size)
        pos += length
        if frame is not None:
            frames.append(frame)
    return frames
