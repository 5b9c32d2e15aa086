"""The tunnel's WebSocket frame parser against websockets' own encoder (and, for what it hands
over, websockets' own parser)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.client import ClientProtocol
from websockets.frames import Close, CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from ravenproxy.transport.wsframes import (
    LEND_MIN,
    MAX_HEADER,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    Control,
    Event,
    Failure,
    FrameParser,
    Handover,
)

MAX = 4096


def encode(frame: Frame, masked: bool) -> bytes:
    return frame.serialize(mask=masked, extensions=[])


def parse_in_chunks(parser: FrameParser, data: bytes, cuts: list[int]) -> tuple[list[Event], int]:
    """Feed ``data`` cut at ``cuts``, keeping the unparsed rest as a reader would; the events,
    and how many bytes were consumed in all."""
    events: list[Event] = []
    pending = bytearray()
    consumed = 0
    edges = sorted({c % (len(data) + 1) for c in cuts} | {len(data)})
    start = 0
    for edge in edges:
        pending += data[start:edge]
        start = edge
        got, used = parser.parse(memoryview(pending))
        events += got
        consumed += used
        del pending[:used]
        if parser.stopped:
            break
    return events, consumed


# A message is its payload and where it is cut into fragments; a control frame goes before it.
payloads = st.binary(max_size=MAX)
controls = st.one_of(
    st.none(),
    st.tuples(st.sampled_from([Opcode.PING, Opcode.PONG]), st.binary(max_size=125)),
)
messages = st.lists(
    st.tuples(payloads, st.lists(st.integers(0, MAX), max_size=4), controls), max_size=8
)


@settings(max_examples=300, deadline=None)
@given(messages, st.booleans(), st.lists(st.integers(0, 1 << 16), max_size=12))
def test_messages_fragments_and_controls_come_out_as_sent(
    sent: list[tuple[bytes, list[int], tuple[Opcode, bytes] | None]],
    masked: bool,
    cuts: list[int],
) -> None:
    wire = bytearray()
    expected: list[Event] = []
    for payload, splits, control in sent:
        edges = sorted({s % (len(payload) + 1) for s in splits} - {0, len(payload)})
        pieces = [payload[a:b] for a, b in zip([0, *edges], [*edges, len(payload)], strict=True)]
        for i, piece in enumerate(pieces):
            opcode = Opcode.BINARY if i == 0 else Opcode.CONT
            wire += encode(Frame(opcode, piece, fin=i == len(pieces) - 1), masked)
            if i == 0 and control is not None:  # between two fragments, or after the message
                if len(pieces) == 1:
                    expected.append(payload)
                raw = encode(Frame(control[0], control[1]), masked)
                wire += raw
                expected.append(Control(raw, int(control[0])))
        if len(pieces) > 1 or control is None:
            expected.append(payload)
    parser = FrameParser(masked=masked, max_size=MAX)
    events, consumed = parse_in_chunks(parser, bytes(wire), cuts)
    assert events == expected
    assert consumed == len(wire)
    assert not parser.stopped


@given(st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=4), st.booleans())
def test_close_stops_the_parser(tail: bytes, cuts: list[int], masked: bool) -> None:
    close = encode(Frame(Opcode.CLOSE, Close(CloseCode.GOING_AWAY, "bye").serialize()), masked)
    data = encode(Frame(Opcode.BINARY, b"last"), masked) + close + tail
    parser = FrameParser(masked=masked, max_size=MAX)
    events, consumed = parse_in_chunks(parser, data, cuts)
    assert events == [b"last", Control(close, OP_CLOSE)]
    assert consumed == len(data) - len(tail)
    assert parser.stopped


def handed_over_to_websockets(data: bytes) -> ServerProtocol:
    """websockets' server protocol, OPEN, after receiving ``data``."""
    client = ClientProtocol(parse_uri("ws://tunnel/"))
    protocol = ServerProtocol(max_size=MAX)
    protocol.receive_data(client.connect().serialize())
    (request,) = protocol.events_received()
    assert isinstance(request, Request)
    protocol.send_response(protocol.accept(request))
    assert protocol.state is State.OPEN
    protocol.receive_data(data)
    return protocol


@pytest.mark.parametrize(
    ("raw", "websockets_closes_with"),
    [
        # Too big in one frame: websockets reads the header and fails with 1009.
        (encode(Frame(Opcode.BINARY, bytes(MAX + 1)), True), CloseCode.MESSAGE_TOO_BIG),
        # A client's frame must be masked.
        (encode(Frame(Opcode.BINARY, b"x"), False), CloseCode.PROTOCOL_ERROR),
        # Reserved bits (no extension negotiated): each of RSV1, RSV2, RSV3 on its own.
        (bytes([0xC2]) + encode(Frame(Opcode.BINARY, b"x"), True)[1:], CloseCode.PROTOCOL_ERROR),
        (bytes([0xA2]) + encode(Frame(Opcode.BINARY, b"x"), True)[1:], CloseCode.PROTOCOL_ERROR),
        (bytes([0x92]) + encode(Frame(Opcode.BINARY, b"x"), True)[1:], CloseCode.PROTOCOL_ERROR),
        # A continuation with no message to continue.
        (encode(Frame(Opcode.CONT, b"x"), True), CloseCode.PROTOCOL_ERROR),
        # A fragmented control frame.
        (bytes([0x09]) + encode(Frame(Opcode.PING, b"x"), True)[1:], CloseCode.PROTOCOL_ERROR),
        # Text is websockets' to deliver (the session refuses it); it closes nothing.
        (encode(Frame(Opcode.TEXT, b"hello"), True), None),
    ],
    # Named, not by their bytes: a masked frame's mask is random, and pytest-xdist's workers must
    # collect the same test ids.
    ids=[
        "too-big",
        "unmasked",
        "rsv1",
        "rsv2",
        "rsv3",
        "lone-continuation",
        "fragmented-ping",
        "text",
    ],
)
def test_what_it_does_not_handle_is_handed_over_where_it_starts(
    raw: bytes, websockets_closes_with: CloseCode | None
) -> None:
    before = encode(Frame(Opcode.BINARY, b"ok"), True)
    parser = FrameParser(masked=True, max_size=MAX)
    events, consumed = parser.parse(memoryview(before + raw + b"more"))
    assert events == [b"ok", Handover()]
    assert consumed == len(before)
    assert parser.stopped
    protocol = handed_over_to_websockets(raw)
    if websockets_closes_with is None:
        assert protocol.state is State.OPEN
    else:
        assert protocol.close_sent is not None
        assert protocol.close_sent.code == websockets_closes_with


def test_a_masked_frame_to_the_client_side_is_handed_over() -> None:
    # The other direction of the test above's unmasked-client case (the checks the parser makes
    # inline for a usual binary frame include the mask bit, both ways).
    before = encode(Frame(Opcode.BINARY, b"ok"), False)
    parser = FrameParser(masked=False, max_size=MAX)
    events, consumed = parser.parse(memoryview(before + encode(Frame(Opcode.BINARY, b"x"), True)))
    assert events == [b"ok", Handover()]
    assert consumed == len(before)
    assert parser.stopped


def test_a_fragmented_message_over_the_limit_fails_with_1009() -> None:
    data = encode(Frame(Opcode.BINARY, bytes(MAX), fin=False), False) + encode(
        Frame(Opcode.CONT, b"x"), False
    )
    parser = FrameParser(masked=False, max_size=MAX)
    events, _ = parser.parse(memoryview(data))
    assert events == [Failure(CloseCode.MESSAGE_TOO_BIG, f"message over {MAX} bytes")]
    assert parser.stopped


def test_a_new_message_inside_a_fragmented_one_fails_with_1002() -> None:
    data = encode(Frame(Opcode.BINARY, b"a", fin=False), False) + encode(
        Frame(Opcode.BINARY, b"b"), False
    )
    parser = FrameParser(masked=False, max_size=MAX)
    events, _ = parser.parse(memoryview(data))
    assert events == [Failure(CloseCode.PROTOCOL_ERROR, "expected a continuation frame")]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, MAX])
def test_wanted_says_how_much_the_next_frame_needs(size: int) -> None:
    raw = encode(Frame(Opcode.BINARY, bytes(size)), True)
    parser = FrameParser(masked=True, max_size=1 << 20)
    for n in range(0, len(raw), max(1, len(raw) // 7)):
        events, consumed = parser.parse(memoryview(raw[:n]))
        assert (events, consumed) == ([], 0)
        assert n < parser.wanted <= len(raw)
    assert parser.parse(memoryview(raw)) == ([bytes(size)], len(raw))


def test_control_opcodes_are_websockets_names() -> None:
    assert (OP_CLOSE, OP_PING, OP_PONG) == (Opcode.CLOSE, Opcode.PING, Opcode.PONG)


@pytest.mark.parametrize("masked", [False, True])
def test_a_large_unmasked_message_is_lent_as_a_read_only_view_and_nothing_else_is(
    masked: bool,
) -> None:
    """With ``lend``, an unfragmented unmasked message of LEND_MIN bytes or more comes out as a
    read-only view of the input (no copy), and ``lent`` says so; a smaller one, a fragmented
    one or a masked one is copied."""
    big, small = bytes(range(256)) * (LEND_MIN // 256), b"s" * 100
    fragments = [
        Frame(Opcode.BINARY, big, fin=False),
        Frame(Opcode.CONT, big, fin=True),
    ]
    frames = [Frame(Opcode.BINARY, big), Frame(Opcode.BINARY, small), *fragments]
    data = bytearray(b"".join(encode(f, masked) for f in frames))
    parser = FrameParser(masked=masked, max_size=1 << 20)
    events, used = parser.parse(memoryview(data), lend=True)
    assert used == len(data)
    assert events == [big, small, big + big]
    lent = [e for e in events if isinstance(e, memoryview)]
    assert parser.lent is (not masked)
    if masked:
        assert not lent
    else:
        assert len(lent) == 1 and lent[0].readonly and lent[0].obj is data
    copied = FrameParser(masked=masked, max_size=1 << 20)
    events, _ = copied.parse(memoryview(data))
    assert all(isinstance(e, bytes) for e in events) and not copied.lent


@pytest.mark.parametrize("masked", [True, False])
def test_bounds_parse_as_the_slice_they_name(masked: bool) -> None:
    # The reader passes its buffer's unparsed part by offset and stop (no slice made per read):
    # the bytes before offset (a frame already taken) and past stop (a frame still coming,
    # or stale bytes of the buffer) are not parsed, and what was taken counts from offset.
    taken = encode(Frame(Opcode.BINARY, b"taken"), masked)
    first = encode(Frame(Opcode.BINARY, b"first"), masked)
    ping = encode(Frame(Opcode.PING, b"p"), masked)
    big = encode(Frame(Opcode.BINARY, bytes(range(256)) * 4), masked)
    coming = encode(Frame(Opcode.BINARY, b"coming"), masked)
    data = memoryview(taken + first + ping + big + coming[:3] + b"stale bytes")
    offset, stop = len(taken), len(taken) + len(first) + len(ping) + len(big) + 3
    events, used = FrameParser(masked=masked, max_size=MAX).parse(
        data, lend=True, offset=offset, stop=stop
    )
    expected = FrameParser(masked=masked, max_size=MAX).parse(data[offset:stop], lend=True)
    assert (events, used) == expected
    # The reader's scratch buffer is parsed as the bytearray itself (nothing lent from it):
    # the same events, as bytes.
    scratch = FrameParser(masked=masked, max_size=MAX).parse(
        bytearray(data), offset=offset, stop=stop
    )
    assert scratch == expected
    assert all(type(event) is bytes for event in scratch[0] if not isinstance(event, Control))
    assert events == [b"first", Control(ping, OP_PING), bytes(range(256)) * 4]
    assert used == len(first) + len(ping) + len(big)


# A frame stream as a reader receives it: binary messages (some fragmented, some large enough to
# be lent), control frames between or inside them, maybe an end (a CLOSE, or a frame the parser
# stops at) and bytes after it.
_big = st.builds(
    lambda n, b: bytes([b]) * n, st.integers(LEND_MIN - 2, LEND_MIN + 70_000), st.integers(0, 255)
)
_stream_messages = st.lists(
    st.tuples(
        st.one_of(st.binary(max_size=300), _big),
        st.lists(st.integers(0, LEND_MIN + 70_000), max_size=3),
        controls,
    ),
    max_size=6,
)
_ends = st.sampled_from(
    [
        None,
        "close",
        "text",
        "rsv",
        "wrong mask",
        "cont alone",
        "binary inside a message",
        "too big",
    ]
)


def _stream(
    sent: list[tuple[bytes, list[int], tuple[Opcode, bytes] | None]],
    end: str | None,
    masked: bool,
    limit: int,
) -> tuple[bytes, list[int]]:
    """The stream's bytes, and where each of its frames starts."""
    wire = bytearray()
    starts: list[int] = []
    for payload, splits, control in sent:
        edges = sorted({s % (len(payload) + 1) for s in splits} - {0, len(payload)})
        pieces = [payload[a:b] for a, b in zip([0, *edges], [*edges, len(payload)], strict=True)]
        for i, piece in enumerate(pieces):
            opcode = Opcode.BINARY if i == 0 else Opcode.CONT
            starts.append(len(wire))
            wire += encode(Frame(opcode, piece, fin=i == len(pieces) - 1), masked)
            if i == 0 and control is not None:
                starts.append(len(wire))
                wire += encode(Frame(control[0], control[1]), masked)
    if end is not None:
        starts.append(len(wire))
    if end == "close":
        wire += encode(Frame(Opcode.CLOSE, Close(CloseCode.GOING_AWAY, "bye").serialize()), masked)
    elif end == "text":
        wire += encode(Frame(Opcode.TEXT, b"hello"), masked)
    elif end == "rsv":
        wire += bytes([0xC2]) + encode(Frame(Opcode.BINARY, b"x"), masked)[1:]
    elif end == "wrong mask":
        wire += encode(Frame(Opcode.BINARY, b"x"), not masked)
    elif end == "cont alone":
        wire += encode(Frame(Opcode.CONT, b"x"), masked)
    elif end == "binary inside a message":
        wire += encode(Frame(Opcode.BINARY, b"a", fin=False), masked)
        starts.append(len(wire))
        wire += encode(Frame(Opcode.BINARY, b"b"), masked)
    elif end == "too big":
        wire += encode(Frame(Opcode.BINARY, b"a", fin=False), masked)
        starts.append(len(wire))
        wire += encode(Frame(Opcode.CONT, bytes(limit)), masked)
    starts.append(len(wire))
    return bytes(wire), starts


@settings(max_examples=300, deadline=None)
@given(
    _stream_messages,
    _ends,
    st.binary(max_size=40),
    st.booleans(),
    st.lists(st.integers(0, 1 << 18), max_size=12),
    st.binary(max_size=20),
    st.binary(min_size=1, max_size=40),
    st.booleans(),
)
def test_bounds_parse_as_the_slice_on_any_stream_cut_anywhere(
    sent: list[tuple[bytes, list[int], tuple[Opcode, bytes] | None]],
    end: str | None,
    tail: bytes,
    masked: bool,
    cuts: list[int],
    before: bytes,
    after: bytes,
    lend: bool,
) -> None:
    """The reader's call (its buffer whole, the unparsed part by offset and stop, bytes of
    earlier reads before it and stale ones past it; the scratch as a bytearray, which the next
    read overwrites) gives what the slice of that part gives, call for call, on any frame
    stream cut at any points: events, bytes taken, wanted, stopped, last_frame, lent. And
    nothing it returns refers to a bytearray it parsed: overwritten, the events stay as they
    were."""
    limit = 1 << 18
    stream, starts = _stream(sent, end, masked, limit)
    data = stream + tail
    taken = 0
    by_slice = FrameParser(masked=masked, max_size=limit)
    by_bounds = FrameParser(masked=masked, max_size=limit)
    pending = bytearray()
    edges = sorted({c % (len(data) + 1) for c in cuts} | {len(data)})
    start = 0
    for edge in edges:
        pending += data[start:edge]
        start = edge
        expected, expected_used = by_slice.parse(memoryview(pending), lend=lend)
        expected = [bytes(e) if isinstance(e, memoryview) else e for e in expected]
        # As the reader calls it: its own buffer as a view (lending), the scratch as itself.
        buf = bytearray(before + pending + after)
        offset, stop = len(before), len(before) + len(pending)
        whole = memoryview(buf) if lend else buf
        events, used = by_bounds.parse(whole, lend=lend, offset=offset, stop=stop)
        assert used == expected_used
        assert [bytes(e) if isinstance(e, memoryview) else e for e in events] == expected
        assert (by_bounds.wanted, by_bounds.stopped, by_bounds.last_frame, by_bounds.lent) == (
            by_slice.wanted,
            by_slice.stopped,
            by_slice.last_frame,
            by_slice.lent,
        )
        by_slice.lent = by_bounds.lent = False
        # The next read overwrites the buffer (the scratch at once, ours once no view is held):
        # only a lent message (a view, never of the scratch) may change with it.
        lent = [type(e) is memoryview for e in events]
        assert lend or not any(lent)
        buf[:] = bytes(len(buf))
        assert [e for e, v in zip(events, lent, strict=True) if not v] == [
            e for e, v in zip(expected, lent, strict=True) if not v
        ]
        events = []
        del pending[:used]
        taken += used
        if by_bounds.stopped:
            break
        # Whole frames taken, and what the next one needs (the slice's own rule, which the
        # parse above by the same code would not catch: its first frame at pos 0 or after one).
        assert taken in starts or taken > len(stream)
        if taken < len(stream):
            frame = starts[starts.index(taken) + 1] - taken
            assert len(pending) < by_bounds.wanted <= frame
            if len(pending) >= MAX_HEADER:
                assert by_bounds.wanted == frame


@settings(max_examples=200, deadline=None)
@given(
    _stream_messages,
    _ends,
    st.lists(st.integers(0, 1 << 18), max_size=8),
    st.lists(st.binary(max_size=8), max_size=3),
    st.booleans(),
)
def test_parse_into_appends_what_parse_returns_and_marks_the_first_other_event(
    sent: list[tuple[bytes, list[int], tuple[Opcode, bytes] | None]],
    end: str | None,
    cuts: list[int],
    queued: list[bytes],
    masked: bool,
) -> None:
    """The reader's call appends to its list of messages (which may hold some already) what
    ``parse`` returns, in order, and ``special`` says where the first event that is not a
    binary message went (-1: none), until the caller resets it: the reader then hands the
    list on without looking at each event."""
    limit = 1 << 18
    data, _ = _stream(sent, end, masked, limit)
    by_parse = FrameParser(masked=masked, max_size=limit)
    by_into = FrameParser(masked=masked, max_size=limit)
    pending = bytearray()
    start = 0
    for edge in sorted({c % (len(data) + 1) for c in cuts} | {len(data)}):
        pending += data[start:edge]
        start = edge
        expected, expected_used = by_parse.parse(bytearray(pending))
        out: list[object] = list(queued)
        used = by_into.parse_into(out, bytearray(pending), False, 0, len(pending))  # type: ignore[arg-type]
        assert used == expected_used
        assert out == [*queued, *expected]
        others = [i for i, e in enumerate(out) if not isinstance(e, bytes | memoryview)]
        assert by_into.special == (others[0] if others else -1)
        assert by_parse.special == -1  # parse leaves it as it found it
        by_into.special = -1
        del pending[:used]
        if by_into.stopped:
            break
