"""Review of rxpath2's ``FrameParser.parse_into`` (issue 15): the parser as it was at 3466b61,
kept VERBATIM below as the oracle (``_OldFrameParser``: only its name changed), against the new
``parse_into`` (and ``parse`` over it) on generated frame streams cut at every byte boundary:
binary messages of every header size, fragmented ones with control frames between fragments,
lent messages, and every frame the parser stops at (Handover, Failure, CLOSE).

Besides the events, ``parse_into`` appends to a list the reader already holds and says where
its first event that is not a binary message went (``special``): checked against the oracle's
events on a prefilled list (its prefix untouched, ``special`` the first non-message's index).
"""

from __future__ import annotations

import random
import struct

import pytest
from websockets.frames import CloseCode
from websockets.speedups import apply_mask

from ravenproxy.transport.wsframes import (
    LEND_MIN,
    OP_BINARY,
    OP_CLOSE,
    OP_CONT,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    Control,
    Event,
    Failure,
    FrameParser,
    Handover,
)

_CONTROL = (OP_CLOSE, OP_PING, OP_PONG)  # 3466b61's, which the new parser no longer has


# -- 3466b61's FrameParser, verbatim (the oracle) ---------------------------------------------


class _OldFrameParser:
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

    def parse(
        self,
        data: memoryview | bytearray,
        lend: bool = False,
        offset: int = 0,
        stop: int | None = None,
    ) -> tuple[list[Event], int]:
        """Events for the whole frames at the start of ``data[offset:stop]``, and how many bytes
        they took. The caller keeps the rest and calls again with it and what follows. Payloads
        are copied: nothing returned refers to ``data``, except, with ``lend``, an unfragmented
        unmasked message of at least :data:`LEND_MIN` bytes, which is a read-only view of
        ``data`` (and :attr:`lent` is set): the caller must not change those bytes while the
        view is held. (``offset``, ``stop``: bounds, not a slice of a reader's buffer a read.
        ``data`` a bytearray when nothing is lent: its slices, a mask's and a payload's, are
        copies made in C, cheaper than views, and unmasked by apply_mask at half the cost.)"""
        events: list[Event] = []
        pos = offset
        total = len(data) if stop is None else stop
        masked, mask_bit = self.masked, self._mask_bit
        while not self.stopped:
            if total - pos < 2:
                self.wanted = 2
                break
            b0 = data[pos]
            b1 = data[pos + 1]
            opcode = b0 & 0x0F
            length = b1 & 0x7F
            head = 2
            if length == 126:
                head = 4
            elif length == 127:
                head = 10
            if b1 & 0x80:
                head += 4
            if total - pos < head:
                self.wanted = head
                break
            if length == 126:
                length = (data[pos + 2] << 8) | data[pos + 3]
            elif length == 127:
                length = int.from_bytes(data[pos + 2 : pos + 10], "big")
            fin = b0 & 0x80
            # The usual frame (a binary message's only or first frame, no RSV bits, masked as
            # it should be, within the limit, no message open) passes _check's tests without
            # the call.
            if (
                opcode != OP_BINARY
                or b0 & 0x70
                or (b1 & 0x80) != mask_bit  # (no bool() call a frame)
                or self._in_message
                or length > self.max_size
            ):
                problem = self._check(b0 & 0x70, opcode, bool(b1 & 0x80) == masked, fin, length)
                if problem is not None:
                    self.stopped = True
                    events.append(problem)
                    break
            end = pos + head + length
            if end > total:
                self.wanted = head + length
                break
            self.last_frame = head + length
            if opcode in _CONTROL:
                events.append(Control(bytes(data[pos:end]), opcode))
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
                events.append(payload.toreadonly())
                continue
            else:
                part = bytes(payload)
            if fin and not self._in_message:
                events.append(part)
                continue
            self._in_message = True
            self._parts.append(part)
            self._part_bytes += length
            if fin:
                events.append(b"".join(self._parts))
                self._parts.clear()
                self._part_bytes = 0
                self._in_message = False
        if self.stopped:
            self.wanted = 0
        return events, pos - offset

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


# -- frames, good and bad -----------------------------------------------------------------------


def _frame(
    opcode: int,
    payload: bytes,
    masked: bool,
    *,
    fin: bool = True,
    rsv: int = 0,
    wide: int = 0,
    key: bytes = b"\x01\x82\x13\xa4",
) -> bytes:
    """One frame; ``wide``: 2 or 8 forces that extended length form for any size."""
    b0 = (0x80 if fin else 0) | rsv | opcode
    bit = 0x80 if masked else 0
    n = len(payload)
    if wide == 8 or (not wide and n >= 1 << 16):
        head = struct.pack("!BBQ", b0, bit | 127, n)
    elif wide == 2 or n >= 126:
        head = struct.pack("!BBH", b0, bit | 126, n)
    else:
        head = struct.pack("!BB", b0, bit | n)
    if masked:
        return head + key + apply_mask(payload, key)
    return head + payload


MAX_SIZE = 3000  # small enough that over-limit frames stay short
BIG_MAX = 4 * LEND_MIN  # the limit for streams with messages to lend (big=True)


def _good(rng: random.Random, masked: bool, big: bool) -> list[bytes]:
    """A run of frames the parser parses on: a message (maybe fragmented, control frames
    between its fragments) or a control frame."""
    kind = rng.randrange(6)
    if big and rng.random() < 0.5:  # a message to lend, whole
        return [_frame(OP_BINARY, rng.randbytes(LEND_MIN + rng.randrange(3000)), masked)]
    if kind == 0:
        return [_frame(rng.choice([OP_PING, OP_PONG]), rng.randbytes(rng.randrange(126)), masked)]
    sizes = [0, 1, 2, 125, 126, 127, 255, 256, 1023, 1024, 2000]
    if big:
        sizes += [LEND_MIN - 1, LEND_MIN, LEND_MIN + 7]
    size = rng.choice(sizes)
    payload = rng.randbytes(size)
    wide = rng.choice([0, 0, 0, 2, 8]) if size < 1 << 16 else 0
    if kind < 4:
        return [_frame(OP_BINARY, payload, masked, wide=wide)]
    cuts = sorted(rng.randrange(size + 1) for _ in range(rng.randrange(1, 4)))
    parts = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, size], strict=True)]
    out = []
    for i, part in enumerate(parts):
        opcode = OP_BINARY if i == 0 else OP_CONT
        out.append(_frame(opcode, part, masked, fin=i == len(parts) - 1, wide=wide))
        if i < len(parts) - 1 and rng.random() < 0.5:
            out.append(_frame(rng.choice([OP_PING, OP_PONG]), rng.randbytes(5), masked))
    return out


def _stopper(rng: random.Random, masked: bool) -> list[bytes]:
    """Frames the parser stops at (CLOSE, Handover, Failure), some after an open message."""
    opened = [_frame(OP_BINARY, b"open", masked, fin=False)]
    choices = [
        [_frame(OP_CLOSE, struct.pack("!H", 1000) + b"bye", masked)],
        [_frame(OP_CLOSE, b"", masked)],
        [_frame(OP_TEXT, b"text", masked)],
        [_frame(OP_BINARY, b"rsv", masked, rsv=0x40)],
        [_frame(OP_BINARY, b"rsv", masked, rsv=0x10)],
        [_frame(OP_BINARY, b"mask", not masked)],
        [_frame(0x3, b"reserved", masked)],
        [_frame(0xB, b"reserved", masked)],
        [_frame(0xF, b"", masked)],
        [_frame(OP_PING, b"p" * 126, masked)],
        [_frame(OP_PING, b"frag", masked, fin=False)],
        [_frame(OP_CONT, b"nothing open", masked)],
        [_frame(OP_BINARY, b"x" * (MAX_SIZE + 1), masked)],
        [*opened, _frame(OP_BINARY, b"new", masked)],
        [*opened, _frame(OP_TEXT, b"new", masked)],
        [*opened, _frame(OP_CONT, b"y" * MAX_SIZE, masked)],
        [*opened, _frame(OP_CLOSE, b"", masked)],
        [*opened, _frame(OP_CONT, b"wrongmask", not masked, fin=True)],
    ]
    return rng.choice(choices)


def _stream(seed: int, masked: bool, big: bool = False) -> bytes:
    rng = random.Random(seed)
    frames: list[bytes] = []
    for _ in range(rng.randrange(1, 5)):
        frames += _good(rng, masked, big)
    if rng.random() < 0.6:
        frames += _stopper(rng, masked)
        frames.append(_frame(OP_BINARY, b"after the stop", masked))  # never parsed
    return b"".join(frames)


# -- the reader each parser is driven by --------------------------------------------------------


def _norm(event: Event, data: object, lend: bool) -> tuple[str, object]:
    if isinstance(event, memoryview):
        owner = data.obj if isinstance(data, memoryview) else data
        assert lend and event.readonly and event.obj is owner  # lent: a view of the buffer
        return ("lent", bytes(event))
    if isinstance(event, bytes):
        return ("message", event)
    return (type(event).__name__, event)


_PREFILL: tuple[bytes | memoryview, ...] = (b"held 1", memoryview(b"held 2"))


def _drive(parser: object, how: str, wire: bytes, cuts: list[int], lend: bool) -> list[object]:
    """Feed ``wire`` cut at ``cuts`` as a reader does (unparsed bytes kept and given again with
    what follows; bytes of other use before ``offset`` and past ``stop``); a record of each
    call: its events, bytes used and the parser's state after it."""
    rng = random.Random(len(wire) * 31 + len(cuts))
    record: list[object] = []
    pending = b""
    at = 0
    for edge in [*cuts, len(wire)]:
        pending += wire[at:edge]
        at = edge
        lead = rng.randrange(4)
        buf = bytearray(b"\xff" * lead + pending + b"\x82\x05junk!" * rng.randrange(2))
        data: memoryview | bytearray = memoryview(buf) if lend else buf
        stop = lead + len(pending)
        if how == "old":
            events, used = parser.parse(data, lend, lead, stop)  # type: ignore[attr-defined]
        elif how == "parse":
            events, used = parser.parse(data, lend, lead, stop)  # type: ignore[attr-defined]
            assert parser.special == -1  # type: ignore[attr-defined]
        else:
            out: list[Event] = list(_PREFILL)
            used = parser.parse_into(out, data, lend, lead, stop)  # type: ignore[attr-defined]
            assert all(a is b for a, b in zip(out, _PREFILL, strict=False))
            events = out[len(_PREFILL) :]
            others = [i for i, e in enumerate(events) if not isinstance(e, bytes | memoryview)]
            want = len(_PREFILL) + others[0] if others else -1
            assert parser.special == want  # type: ignore[attr-defined]
            parser.special = -1  # type: ignore[attr-defined]  # as the reader's _sort_out does
        record.append(
            (
                [_norm(e, data, lend) for e in events],
                used,
                parser.wanted,  # type: ignore[attr-defined]
                parser.stopped,  # type: ignore[attr-defined]
                parser.last_frame,  # type: ignore[attr-defined]
                parser.lent,  # type: ignore[attr-defined]
            )
        )
        parser.lent = False  # type: ignore[attr-defined]  # the caller resets it
        pending = pending[used:]
        if parser.stopped:  # type: ignore[attr-defined]
            break
    return record


def _frame_starts(wire: bytes, masked: bool) -> list[int]:
    """Where each frame of ``wire`` starts (past the first)."""
    starts, at = [], 0
    while at + 2 <= len(wire):
        n, head = wire[at + 1] & 0x7F, 2
        if n == 126:
            n, head = struct.unpack_from("!H", wire, at + 2)[0], 4
        elif n == 127:
            n, head = struct.unpack_from("!Q", wire, at + 2)[0], 10
        at += head + (4 if wire[at + 1] & 0x80 else 0) + n
        starts.append(at)
    return starts


def _same_everywhere(
    wire: bytes, cuts_list: list[list[int]], masked: bool, lend: bool, limit: int = MAX_SIZE
) -> list[object]:
    """The old parser's record for the first cuts (the others are the same)."""
    first: list[object] = []
    for cuts in cuts_list:
        old = _drive(_OldFrameParser(masked=masked, max_size=limit), "old", wire, cuts, lend)
        for how in ("parse", "into"):
            new = _drive(FrameParser(masked=masked, max_size=limit), how, wire, cuts, lend)
            assert new == old, (how, cuts)
        first = first or old
    return first


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("seed", range(60))
def test_parse_into_is_the_old_parse_at_every_byte_boundary(seed: int, masked: bool) -> None:
    """Small streams: cut once at every byte boundary, cut at every byte, cut at random."""
    wire = _stream(seed, masked)
    rng = random.Random(seed)
    cuts_list = [[cut] for cut in range(len(wire) + 1)]
    cuts_list.append(list(range(1, len(wire))))
    cuts_list += [sorted(rng.sample(range(len(wire) + 1), min(5, len(wire)))) for _ in range(5)]
    _same_everywhere(wire, cuts_list, masked, lend=not masked and seed % 2 == 0)


@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_parse_into_is_the_old_parse_on_lent_messages(seed: int, masked: bool) -> None:
    """Streams with messages around LEND_MIN (lent when unmasked, unfragmented and whole in
    one read): cut at every byte of each frame header and at random."""
    rng = random.Random(1000 + seed)
    while True:
        wire = _stream(1000 + seed * 7 + rng.randrange(10**6), masked, big=True)
        if len(wire) > LEND_MIN:
            break
    edges = [0, *_frame_starts(wire, masked)]
    cuts = {at + i for at in edges for i in range(15)}  # every byte of each header, and past
    cuts |= {rng.randrange(len(wire) + 1) for _ in range(40)}
    cuts_list: list[list[int]] = [[]] + [[cut] for cut in sorted(cuts) if cut <= len(wire)]
    cuts_list.append(sorted({rng.randrange(len(wire) + 1) for _ in range(30)}))
    for lend in (False, True):
        record = _same_everywhere(wire, cuts_list, masked, lend, BIG_MAX)
        lent = sum(e[0] == "lent" for call in record for e in call[0])  # type: ignore[index]
        assert not lent or (lend and not masked)


def test_the_big_streams_lend_messages() -> None:
    """The big streams above are such that messages are lent (unmasked, ``lend``, whole in
    one read): the lent path's record is compared too."""
    lent = 0
    for seed in range(12):
        wire = _stream(1000 + seed, False, big=True)
        parser = FrameParser(masked=False, max_size=BIG_MAX)
        events, _ = parser.parse(memoryview(bytearray(wire)), True)
        lent += sum(isinstance(e, memoryview) for e in events)
    assert lent >= 5
