"""WebSocket frames (RFC 6455 section 5) of an established tunnel, parsed sans-I/O.

:class:`FrameParser` turns received bytes into whole binary messages, unmasked, with one copy
per payload (the unmasking ``websockets.speedups.apply_mask`` does, or the copy out of the
reader's reusable buffer), or none: a large unmasked message may be lent, a read-only view of
the reader's buffer (:data:`LEND_MIN`). It handles only what a tunnel carries in bulk: binary
messages, fragmented or not. Everything else is ``websockets``' business, and the parser says
so instead of half-handling it:

- a control frame (PING, PONG, CLOSE) comes out whole as :class:`Control`, its raw bytes, for
  ``websockets`` to answer (it keeps the closing handshake and its state);
- a frame ``websockets`` would refuse or handles differently (a TEXT message, reserved bits,
  wrong masking, an unknown opcode, a control frame too long or fragmented, a first frame over
  the size limit, a continuation with no message to continue) stops the parser at
  :class:`Handover`: the caller hands every byte from that frame on to ``websockets``, which
  answers it exactly as it would have without this parser;
- what only the parser can know (a fragmented message that grows over the limit, or a new
  message before the last one ended) is :class:`Failure`, the close code to fail the
  connection with (RFC 6455 section 7.1.7).
"""

from __future__ import annotations

from dataclasses import dataclass

from websockets.frames import CloseCode
from websockets.speedups import apply_mask

OP_CONT = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
_CONTROL = (OP_CLOSE, OP_PING, OP_PONG)

MAX_HEADER = 14
"""Longest frame header: 2 bytes, 8 of extended length, 4 of mask."""

LEND_MIN = 64 * 1024
"""An unmasked message at least this long may be lent (``parse(lend=True)``): handed on as a
read-only view of the caller's buffer instead of a copy. Smaller ones are copied: a short
message is cheap to copy, and a view of it would pin the whole buffer."""


@dataclass(frozen=True, slots=True)
class Control:
    """A whole control frame as received (header and masked payload included)."""

    raw: bytes
    opcode: int


@dataclass(frozen=True, slots=True)
class Handover:
    """Stop here: the bytes from this point on are for ``websockets``."""


@dataclass(frozen=True, slots=True)
class Failure:
    """The connection must be failed with ``code`` (RFC 6455 section 7.1.7)."""

    code: CloseCode
    reason: str


Event = bytes | memoryview | Control | Handover | Failure
"""A whole binary message's payload (a view only if lent), or one of the above."""
MESSAGE = (bytes, memoryview)
"""The events that are binary messages, for ``isinstance`` (a tuple: ``bytes | memoryview`` in a
loop makes a union object each time)."""


class FrameParser:
    """Parses the frames one side receives. ``masked``: frames must be masked (the server side
    receives from a client); ``max_size``: longest message, as ``websockets``' ``max_size``."""

    def __init__(self, *, masked: bool, max_size: int) -> None:
        self.masked = masked
        self._mask_bit = 0x80 if masked else 0  # the MASK bit the frames must have
        self.max_size = max_size
        self._parts: list[bytes] = []
        self._part_bytes = 0
        self._in_message = False
        self.stopped = False
        """After :class:`Handover` or :class:`Failure`, or after a CLOSE: parse nothing more."""
        self.wanted = 2
        """Bytes the frame at the head of the unparsed input needs in total (header included):
        the smallest input the next call can make progress with."""
        self.last_frame = 0
        """Size of the last whole frame parsed (header included)."""
        self.lent = False
        """Whether a call with ``lend`` returned a view of its ``data`` (the caller resets it)."""
        self.special = -1
        """Where in its ``out`` :meth:`parse_into` appended its first event that is not a
        binary message; -1: none since the caller last reset it to -1."""

    def parse(
        self,
        data: memoryview | bytearray,
        lend: bool = False,
        offset: int = 0,
        stop: int | None = None,
    ) -> tuple[list[Event], int]:
        """Events for the whole frames at the start of ``data[offset:stop]``, and how many bytes
        they took: :meth:`parse_into` a list of their own."""
        events: list[Event] = []
        self.special = -1
        used = self.parse_into(events, data, lend, offset, len(data) if stop is None else stop)
        self.special = -1
        return events, used

    def parse_into(
        self, out: list[Event], data: memoryview | bytearray, lend: bool, offset: int, stop: int
    ) -> int:
        """Append to ``out`` the events for the whole frames at the start of
        ``data[offset:stop]``; return how many bytes they took. The caller keeps the rest and
        calls again with it and what follows. Payloads are copied: nothing appended refers to
        ``data``, except, with ``lend``, an unfragmented unmasked message of at least
        :data:`LEND_MIN` bytes, which is a read-only view of ``data`` (and :attr:`lent` is set):
        the caller must not change those bytes while the view is held. (``offset``, ``stop``:
        bounds, not a slice of a reader's buffer a read. ``data`` a bytearray when nothing is
        lent: its slices, a mask's and a payload's, are copies made in C, cheaper than views,
        and unmasked by apply_mask at half the cost.)

        The first event appended that is not a binary message (a :class:`Control`, a
        :class:`Handover`, a :class:`Failure`) sets :attr:`special` to its index in ``out``,
        if it was negative: the reader hands the messages on as ``out`` holds them, without
        looking at each event, unless that is set (and then resets it to -1)."""
        pos = offset
        total = stop
        masked, mask_bit = self.masked, self._mask_bit
        usual_head = 6 if masked else 2  # the usual frame's header: a 7-bit length, the key
        while not self.stopped:
            if total - pos < 2:
                self.wanted = 2
                break
            b0 = data[pos]
            b1 = data[pos + 1]
            # The usual frame (a binary message's only frame, no RSV bits, masked as it should
            # be, no message open: what _check lets through, within the limit) told apart by
            # two compares and a subtraction: b1 less the MASK bit this side needs is the
            # 7-bit length only where b1's MASK bit is that one. Any other frame has its bits
            # taken apart by `&`s (no specialised `&` on 3.11: ~70 instructions each, six a
            # frame before, a message on both ends).
            length = b1 - mask_bit
            usual = b0 == 0x82 and -1 < length < 128 and not self._in_message
            if usual:
                head = usual_head
            else:
                length = b1 & 0x7F
                head = 6 if b1 & 0x80 else 2
            if length >= 126:
                head += 2 if length == 126 else 8
            if total - pos < head:
                self.wanted = head
                break
            if length >= 126:
                if length == 126:
                    length = (data[pos + 2] << 8) | data[pos + 3]
                else:
                    length = int.from_bytes(data[pos + 2 : pos + 10], "big")
            if not usual or length > self.max_size:  # _check's (the usual frame passes it)
                opcode = b0 & 0x0F
                fin = b0 & 0x80
                problem = self._check(b0 & 0x70, opcode, bool(b1 & 0x80) == masked, fin, length)
                if problem is not None:
                    self.stopped = True
                    if self.special < 0:
                        self.special = len(out)
                    out.append(problem)
                    break
            else:
                opcode, fin = OP_BINARY, 0x80
            end = pos + head + length
            if end > total:
                self.wanted = head + length
                break
            self.last_frame = head + length
            # A control frame: the opcodes _check lets through are CONT, BINARY and the three
            # control ones, which (RFC 6455 section 5.5) are those from OP_CLOSE up (an int
            # compare, not a search of a tuple a frame).
            if opcode >= OP_CLOSE:
                if self.special < 0:
                    self.special = len(out)
                out.append(Control(bytes(data[pos:end]), opcode))
                if opcode == OP_CLOSE:
                    self.stopped = True
                pos = end
                continue
            start, pos = pos + head, end
            payload = data[start:end]
            if masked:
                part = apply_mask(payload, data[start - 4 : start])  # type: ignore[arg-type]
            elif lend and fin and length >= LEND_MIN and not self._in_message:
                assert type(payload) is memoryview  # what lends is a view
                self.lent = True
                out.append(payload.toreadonly())
                continue
            else:
                # bytes of the slice by a concatenation, not a bytes() type call (~510 of
                # ~1 860 instructions a message, valgrind: a request on the agent); the
                # same bytes, a bytes object either way.
                part = b"" + payload
            if fin and not self._in_message:
                out.append(part)
                continue
            self._in_message = True
            self._parts.append(part)
            self._part_bytes += length
            if fin:
                out.append(b"".join(self._parts))
                self._parts.clear()
                self._part_bytes = 0
                self._in_message = False
        if self.stopped:
            self.wanted = 0
        return pos - offset

    def _check(
        self, rsv: int, opcode: int, mask_ok: bool, fin: int, length: int
    ) -> Handover | Failure | None:
        if rsv or not mask_ok:
            return Handover()
        if opcode in _CONTROL:
            return None if fin and length <= 125 else Handover()
        if opcode == OP_CONT:
            if not self._in_message:
                return Handover()
            if self._part_bytes + length > self.max_size:
                return Failure(
                    CloseCode.MESSAGE_TOO_BIG,
                    f"message over {self.max_size} bytes",
                )
            return None
        if opcode == OP_BINARY:
            if self._in_message:
                return Failure(CloseCode.PROTOCOL_ERROR, "expected a continuation frame")
            return None if length <= self.max_size else Handover()
        if self._in_message and opcode == OP_TEXT:
            return Failure(CloseCode.PROTOCOL_ERROR, "expected a continuation frame")
        return Handover()  # TEXT, or an opcode RFC 6455 reserves
