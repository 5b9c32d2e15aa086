"""review39 (issue 15, tunpath): ``FrameParser.parse_into`` tells the usual frame apart by
``b0 == 0x82`` and ``b1 - mask_bit`` in 0..127. A tunnel peer is untrusted input: every frame
the old parser refused must be refused the same way, any it accepted parsed the same. Here
exhaustively, against cdb10ca's parser (the oracle kept verbatim in
tests/unit/transport/test_tunpath_parse_into.py):

- every first byte (FIN x RSV1-3 x the 16 opcodes) with every second byte (MASK bit x every
  7-bit length, 125/126/127 included), on both sides (server: masked; agent: unmasked), with
  and without a fragmented message open, whole and cut inside the header and the payload;
- 16- and 64-bit lengths at their edges: 0, 125, 126, 65 535, 65 536, the limit and one over,
  a 64-bit length with its top bit set, 2**64 - 1, lengths encoded non-minimally;
- fragmented messages with PING/PONG/CLOSE between the fragments, a continuation with no
  message open, a new data frame (BINARY, TEXT) while one is open, the limit crossed by a later
  fragment; the MASK bit the wrong way for each side.

Each compares events (kind, exact type, bytes) and the parser's state after each call (bytes
used, ``wanted``, ``stopped``, ``last_frame``, ``lent``, ``special``) with the oracle's, through
the scratch bytearray, a view and lending (the harness of test_tunpath_parse_into.py).
"""

from __future__ import annotations

import struct

import pytest
from websockets.frames import CloseCode
from websockets.speedups import apply_mask

from ravenproxy.transport.wsframes import (
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
from tests.unit.transport.test_tunpath_parse_into import _Cdb10caFrameParser, _same

KEY = b"\x37\xfa\x21\x3d"
LIMIT = 300
"""The size limit of the exhaustive sweep: some 7-bit and most extended lengths are over it."""


def _head(b0: int, b1: int, length: int, ext: str = "minimal") -> bytes:
    """A header with bytes ``b0``, ``b1`` (its 7-bit length field replaced when ``length``
    needs more, unless ``ext`` says how to encode it), the key if ``b1`` has the MASK bit."""
    field = b1 & 0x7F
    if ext == "16":
        field = 126
    elif ext == "64":
        field = 127
    elif field < 126 and length != field:
        field = 126 if length < 1 << 16 else 127
    out = bytes([b0, (b1 & 0x80) | field])
    if field == 126:
        out += struct.pack("!H", length)
    elif field == 127:
        out += struct.pack("!Q", length)
    return out + (KEY if b1 & 0x80 else b"")


def _frame(b0: int, b1: int, payload: bytes, ext: str = "minimal") -> bytes:
    head = _head(b0, b1, len(payload), ext)
    return head + (apply_mask(payload, KEY) if b1 & 0x80 else payload)


def _usual(masked: bool, payload: bytes, *, b0: int = 0x82) -> bytes:
    return _frame(b0, 0x80 if masked else 0, payload)


def _parse_both(
    masked: bool,
    data: bytes,
    stops: list[int],
    max_size: int = LIMIT,
    hows: tuple[type, ...] = (bytearray, memoryview),
) -> None:
    """Both parsers over ``data`` as one read, and over it cut at each of ``stops`` (the rest
    given again with what follows, as the reader does), as a bytearray and as a view."""
    for stop in stops:
        results = []
        for cls in (_Cdb10caFrameParser, FrameParser):
            record = []
            for how in hows:
                parser = cls(masked=masked, max_size=max_size)
                pending = data
                for edge in (stop, len(data)):
                    out: list[Event] = []
                    parser.special = -1
                    chunk = pending[: edge - (len(data) - len(pending))]
                    buf = bytearray(chunk)
                    used = parser.parse_into(out, how(buf), False, 0, len(buf))
                    record.append(
                        (
                            [
                                (type(e).__name__, bytes(e) if isinstance(e, bytes) else e)
                                for e in out
                            ],
                            used,
                            parser.wanted,
                            parser.stopped,
                            parser.last_frame,
                            parser.special,
                            parser._in_message,
                        )
                    )
                    pending = pending[used:]
                    if parser.stopped:
                        break
            results.append(record)
        assert results[1] == results[0], (masked, data[:16].hex(), stop)


def _payload_len(b1: int) -> int:
    """A length for a header whose 7-bit field is ``b1 & 0x7F``: that, or, for 126 and 127, one
    within the limit (so a frame the parser accepts parses through its payload)."""
    field = b1 & 0x7F
    return field if field < 126 else {126: 200, 127: 260}[field]


@pytest.mark.parametrize("masked", [True, False], ids=["server", "agent"])
@pytest.mark.parametrize("open_message", [False, True], ids=["idle", "open"])
def test_every_first_and_second_byte_as_cdb10cas(masked: bool, open_message: bool) -> None:
    """All 65 536 (b0, b1) pairs, each frame followed by a usual one; with a fragmented message
    open before it or not; cut one byte short of the header's end and of the payload's (a
    bytearray, the scratch buffer's container; views are in the tests below)."""
    lead = _usual(masked, b"before")
    if open_message:
        lead += _frame(0x02, 0x80 if masked else 0, b"open")  # no FIN: a message stays open
    tail = _usual(masked, b"after")
    for b0 in range(256):
        for b1 in range(256):
            n = _payload_len(b1)
            frame = _head(b0, b1, n, {126: "16", 127: "64"}.get(b1 & 0x7F, "minimal"))
            head = len(frame)
            frame += bytes((i * 7 + b0) % 256 for i in range(n))
            data = lead + frame + tail
            at = len(lead)
            _parse_both(masked, data, [at + head - 1, at + head + n - 1], hows=(bytearray,))


_EDGES = [0, 1, 125, 126, 127, 255, 256, 65535, 65536, 65537]


@pytest.mark.parametrize("masked", [True, False], ids=["server", "agent"])
def test_extended_lengths_at_their_edges_and_non_minimal(masked: bool) -> None:
    """16- and 64-bit lengths, minimal and not (a 7-bit-sized length in 16 or 64 bits, a 16-bit
    one in 64), at the limit, one under and one over, for BINARY and the control opcodes, from
    a usual frame's first byte and from a fragment's."""
    bit = 0x80 if masked else 0
    for limit in (125, 126, 65535, 65536):
        for n in sorted({*_EDGES, limit - 1, limit, limit + 1}):
            if n < 0 or n > 70000:
                continue
            body = bytes(i % 253 for i in range(n))
            for ext in ("minimal", "16", "64"):
                if ext == "16" and n >= 1 << 16:
                    continue
                for b0 in (0x82, 0x02, 0x89, 0x8A, 0x88, 0x80, 0x81, 0xC2):
                    wire = _frame(b0, bit, body, ext) + _usual(masked, b"next")
                    if b0 == 0x80:  # a continuation: after a first fragment
                        wire = _frame(0x02, bit, b"first") + wire
                    _parse_both(masked, wire, [1, 2, 4, 10], max_size=limit)


@pytest.mark.parametrize("masked", [True, False], ids=["server", "agent"])
def test_huge_64_bit_lengths_are_refused_as_cdb10cas(masked: bool) -> None:
    """A 64-bit length with its top bit set (RFC 6455: must be 0), 2**64 - 1, 2**63, 2**32, the
    limit + 1: only the header is sent (the payload would never come); both parsers stop at it,
    the same way, for BINARY, a continuation, a control frame and on a message open."""
    bit = 0x80 if masked else 0
    for n in (1 << 63, (1 << 64) - 1, (1 << 63) + 5, 1 << 32, LIMIT + 1, (1 << 62)):
        for b0 in (0x82, 0x02, 0x80, 0x89, 0x88, 0x81):
            for lead in (b"", _frame(0x02, bit, b"open")):
                wire = lead + struct.pack("!BBQ", b0, bit | 127, n) + (KEY if masked else b"")
                _parse_both(masked, wire, [len(lead) + 1, len(lead) + 9, len(wire)])
                new = FrameParser(masked=masked, max_size=LIMIT)
                events, _ = new.parse(bytearray(wire + b"\x00" * 64))
                assert new.stopped, (b0, n)
                assert isinstance(events[-1], Handover | Failure), events


@pytest.mark.parametrize("masked", [True, False], ids=["server", "agent"])
def test_the_mask_bit_the_wrong_way_is_handed_over_on_each_side(masked: bool) -> None:
    """Server (masked) gets an unmasked frame, agent (unmasked) a masked one: for every 7-bit
    length and the extended ones, a usual frame's first byte and others: Handover, as cdb10ca."""
    wrong = 0 if masked else 0x80
    for field in range(128):
        n = _payload_len(field)
        for b0 in (0x82, 0x02, 0x89, 0x88):
            frame = _frame(b0, wrong, bytes(n), {126: "16", 127: "64"}.get(field, "minimal"))
            wire = _usual(masked, b"ok") + frame + _usual(masked, b"never")
            _parse_both(masked, wire, [len(wire) - 1])
            parser = FrameParser(masked=masked, max_size=LIMIT)
            events, used = parser.parse(bytearray(wire))
            assert events[0] == b"ok" and isinstance(events[1], Handover), (field, b0, events)
            assert used == len(_usual(masked, b"ok"))  # the bad frame's bytes are websockets'


@pytest.mark.parametrize("masked", [True, False], ids=["server", "agent"])
def test_fragments_with_control_frames_between_and_open_message_errors(masked: bool) -> None:
    bit = 0x80 if masked else 0
    ping = _frame(0x89, bit, b"ping")
    pong = _frame(0x8A, bit, b"")
    close = _frame(0x88, bit, struct.pack("!H", 1000) + b"bye")
    first, mid, last = _frame(0x02, bit, b"ab"), _frame(0x00, bit, b"cd"), _frame(0x80, bit, b"e")
    cases: dict[str, tuple[bytes, type[Event] | None, CloseCode | None]] = {
        "controls between": (
            first + ping + mid + pong + ping + last + _usual(masked, b"u"),
            None,
            None,
        ),
        "close between": (first + ping + close + mid + last, None, None),
        "lone continuation": (_frame(0x80, bit, b"x"), Handover, None),
        "lone continuation no fin": (_frame(0x00, bit, b"x"), Handover, None),
        "binary while open": (first + _usual(masked, b"new"), Failure, CloseCode.PROTOCOL_ERROR),
        "binary no fin while open": (
            first + _frame(0x02, bit, b"n"),
            Failure,
            CloseCode.PROTOCOL_ERROR,
        ),
        "text while open": (first + _frame(0x81, bit, b"t"), Failure, CloseCode.PROTOCOL_ERROR),
        "reserved while open": (first + _frame(0x83, bit, b"r"), Handover, None),
        "over the limit later": (
            first + _frame(0x00, bit, bytes(LIMIT - 2)) + _frame(0x80, bit, b"z"),
            Failure,
            CloseCode.MESSAGE_TOO_BIG,
        ),
        "at the limit": (first + _frame(0x80, bit, bytes(LIMIT - 2)), None, None),
        "rsv on a continuation": (first + _frame(0xC0, bit, b"z"), Handover, None),
        "fragmented ping": (first + _frame(0x09, bit, b"p"), Handover, None),
        "long pong": (first + _frame(0x8A, bit, bytes(126)), Handover, None),
    }
    for name, (wire, stop, code) in cases.items():
        wire_then = wire + _usual(masked, b"after")
        _parse_both(masked, wire_then, list(range(1, len(wire_then))))
        for how in ("scratch", "view", "lend"):
            _same(wire_then, masked, [], how, LIMIT)
        parser = FrameParser(masked=masked, max_size=LIMIT)
        events, _ = parser.parse(bytearray(wire_then))
        others = [e for e in events if not isinstance(e, bytes | Control)]
        if stop is None:
            assert not others, (name, events)
            assert b"abcde" in events or name in ("at the limit", "close between"), name
        else:
            assert [type(e) for e in others] == [stop], (name, events)
            if code is not None:
                assert isinstance(others[0], Failure) and others[0].code == code, name
        if name == "close between":
            assert [type(e) for e in events] == [Control, Control], events
            assert parser.stopped and events[1].opcode == OP_CLOSE  # type: ignore[union-attr]


def test_the_usual_frame_is_only_a_fin_binary_with_no_rsv() -> None:
    """The shortcut's own premise: of the 256 first bytes, only 0x82 with the side's MASK bit
    and no message open parses as a message without _check; every other first byte with a
    7-bit length reaches _check (counted), and so does 0x82 while a message is open or with a
    length over the limit."""
    for masked in (True, False):
        bit = 0x80 if masked else 0
        for b0 in range(256):
            parser = FrameParser(masked=masked, max_size=LIMIT)
            calls = []
            real = parser._check

            def counted(*args: object, real: object = real, calls: list = calls) -> object:
                calls.append(args)
                return real(*args)  # type: ignore[operator]

            parser._check = counted  # type: ignore[method-assign]
            parser.parse(bytearray(_frame(b0, bit, b"x" * 5)))
            assert bool(calls) == (b0 != 0x82), hex(b0)
        parser = FrameParser(masked=masked, max_size=LIMIT)
        events, _ = parser.parse(bytearray(_frame(0x82, bit, bytes(LIMIT + 1))))
        assert isinstance(events[0], Handover)
        assert OP_BINARY == 0x2 and OP_CONT == 0 and OP_TEXT == 1 and OP_PING == 9 and OP_PONG == 10
