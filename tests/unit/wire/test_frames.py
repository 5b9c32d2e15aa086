"""Frame codec on bytes: round trips, malformed input, and fuzzing."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.wire.codes import ErrorCode, Flag, FrameType
from ravenproxy.wire.errors import FrameSizeError, ProtocolError
from ravenproxy.wire.frames import (
    HEADER_SIZE,
    MAX_FRAME_SIZE_LIMIT,
    MAX_TEXT,
    MAX_WINDOW,
    MIN_FRAME_SIZE,
    Data,
    Frame,
    GoAway,
    Open,
    OpenResult,
    Ping,
    Reset,
    Settings,
    Target,
    WindowUpdate,
    decode_message,
    encode,
    encode_data_header,
)
from tests.helpers import examples

LIMIT = MAX_FRAME_SIZE_LIMIT
U32 = 2**32 - 1

stream_ids = st.integers(1, U32)
windows = st.integers(0, MAX_WINDOW)
codes = st.sampled_from(ErrorCode)
# Up to 256 code points is at most 1024 UTF-8 bytes; the second branch reaches the exact limit.
texts = st.one_of(
    st.text(max_size=MAX_TEXT // 4),
    st.text(alphabet="abcé", min_size=MAX_TEXT // 2, max_size=MAX_TEXT).filter(
        lambda s: len(s.encode()) <= MAX_TEXT
    ),
)
targets = st.builds(Target, node=texts, host=texts, port=st.integers(1, 65535))

settings_frames = st.builds(
    Settings,
    st.lists(st.tuples(st.integers(0, 0xFFFF), st.integers(0, U32)), max_size=20).map(tuple),
)
open_frames = st.builds(Open, stream_ids, windows, targets)
open_results = st.builds(OpenResult, stream_ids, codes, windows, texts)
data_frames = st.builds(Data, stream_ids, st.binary(max_size=4096), st.booleans())
window_updates = st.builds(WindowUpdate, st.integers(0, U32), st.integers(1, MAX_WINDOW))
resets = st.builds(Reset, stream_ids, codes, texts)
pings = st.builds(Ping, st.binary(min_size=8, max_size=8), st.booleans())
goaways = st.builds(GoAway, st.integers(0, U32), codes, texts)
any_frame: st.SearchStrategy[Frame] = st.one_of(
    settings_frames,
    open_frames,
    open_results,
    data_frames,
    window_updates,
    resets,
    pings,
    goaways,
)


def header(type_: int, flags: int, stream_id: int, length: int, reserved: int = 0) -> bytes:
    return struct.pack("!BBHII", type_, flags, reserved, stream_id, length)


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        settings_frames,
        open_frames,
        open_results,
        data_frames,
        window_updates,
        resets,
        pings,
        goaways,
    ],
    ids=["settings", "open", "open_result", "data", "window_update", "reset", "ping", "goaway"],
)
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_round_trip_each_type(strategy: st.SearchStrategy[Frame], data: st.DataObject) -> None:
    frame = data.draw(strategy)
    raw = encode(frame)
    assert decode_message(raw, LIMIT) == [frame]
    # The header says how long the payload is.
    assert struct.unpack_from("!I", raw, 8)[0] == len(raw) - HEADER_SIZE


@settings(max_examples=100, deadline=None)
@given(st.lists(any_frame, max_size=10))
def test_several_frames_per_message(frames: list[Frame]) -> None:
    message = b"".join(encode(f) for f in frames)
    assert decode_message(message, LIMIT) == frames
    assert decode_message(bytearray(message), LIMIT) == frames
    assert decode_message(memoryview(message), LIMIT) == frames


def test_empty_message_has_no_frames() -> None:
    assert decode_message(b"", LIMIT) == []


def test_data_header_helper_matches_encode() -> None:
    assert encode_data_header(9, 3, True) + b"abc" == encode(Data(9, b"abc", True))
    assert encode_data_header(9, 3, False) + b"abc" == encode(Data(9, b"abc", False))


def test_fin_and_ack_flags() -> None:
    assert encode(Data(1, b"", True))[1] == Flag.FIN
    assert encode(Data(1, b"", False))[1] == 0
    assert encode(Ping(b"12345678", ack=True))[1] == Flag.ACK
    assert encode(Ping(b"12345678"))[1] == 0


def test_unknown_flag_bits_are_ignored() -> None:
    raw = bytearray(encode(Data(1, b"x")))
    raw[1] = 0xFE  # every bit but FIN
    assert decode_message(bytes(raw), LIMIT) == [Data(1, b"x", False)]
    raw = bytearray(encode(WindowUpdate(1, 5)))
    raw[1] = 0xFF
    assert decode_message(bytes(raw), LIMIT) == [WindowUpdate(1, 5)]


def test_unknown_error_code_reads_as_internal_error() -> None:
    raw = header(FrameType.RESET, 0, 3, 2) + struct.pack("!H", 999)
    assert decode_message(raw, LIMIT) == [Reset(3, ErrorCode.INTERNAL_ERROR, "")]
    raw = header(FrameType.GOAWAY, 0, 0, 6) + struct.pack("!IH", 7, 0xFFFF)
    assert decode_message(raw, LIMIT) == [GoAway(7, ErrorCode.INTERNAL_ERROR, "")]
    raw = header(FrameType.OPEN_RESULT, 0, 3, 6) + struct.pack("!HI", 500, 0)
    assert decode_message(raw, LIMIT) == [OpenResult(3, ErrorCode.INTERNAL_ERROR, 0, "")]


# -- malformed input --------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(any_frame, st.data())
def test_truncated_frame_is_a_frame_size_error(frame: Frame, data: st.DataObject) -> None:
    raw = encode(frame)
    cut = data.draw(st.integers(1, len(raw) - 1))
    with pytest.raises(FrameSizeError):
        decode_message(raw[:cut], LIMIT)
    # A whole frame followed by a cut one fails too: a frame never spans messages.
    with pytest.raises(FrameSizeError):
        decode_message(raw + raw[:cut], LIMIT)


@pytest.mark.parametrize("reserved", [1, 0x8000, 0xFFFF])
def test_reserved_bits_are_a_protocol_error(reserved: int) -> None:
    raw = header(FrameType.DATA, 0, 1, 1, reserved=reserved) + b"x"
    with pytest.raises(ProtocolError) as info:
        decode_message(raw, LIMIT)
    assert info.value.code is ErrorCode.PROTOCOL_ERROR


def test_data_larger_than_max_frame_size() -> None:
    ok = encode(Data(1, b"x" * MIN_FRAME_SIZE))
    assert decode_message(ok, MIN_FRAME_SIZE) == [Data(1, b"x" * MIN_FRAME_SIZE)]
    big = encode(Data(1, b"x" * (MIN_FRAME_SIZE + 1)))
    with pytest.raises(FrameSizeError) as info:
        decode_message(big, MIN_FRAME_SIZE)
    assert info.value.code is ErrorCode.FRAME_SIZE_ERROR


def test_any_frame_type_larger_than_max_frame_size() -> None:
    # The limit applies to every frame, including types this version does not know.
    raw = header(0x42, 0, 0, MIN_FRAME_SIZE + 1) + bytes(MIN_FRAME_SIZE + 1)
    with pytest.raises(FrameSizeError):
        decode_message(raw, MIN_FRAME_SIZE)


@pytest.mark.parametrize("type_byte", [0x08, 0x42, 0xFF])
def test_unknown_frame_type_is_skipped(type_byte: int) -> None:
    unknown = header(type_byte, 0xFF, 12345, 5) + b"12345"
    message = encode(Ping(b"aaaaaaaa")) + unknown + encode(Data(1, b"z"))
    assert decode_message(message, LIMIT) == [Ping(b"aaaaaaaa"), Data(1, b"z")]


def _open_payload(node: bytes, host: bytes, window: int = 0, port: int = 80) -> bytes:
    return (
        struct.pack("!IH", window, port)
        + struct.pack("!H", len(node))
        + node
        + struct.pack("!H", len(host))
        + host
    )


def _with_header(type_: int, stream_id: int, payload: bytes) -> bytes:
    return header(type_, 0, stream_id, len(payload)) + payload


@pytest.mark.parametrize(
    "raw",
    [
        _with_header(FrameType.OPEN, 1, _open_payload(b"\xff", b"host")),
        _with_header(FrameType.OPEN, 1, _open_payload(b"node", b"\xc3")),
        _with_header(FrameType.OPEN, 1, _open_payload(b"node", b"\xed\xa0\x80")),  # surrogate
        _with_header(FrameType.OPEN_RESULT, 1, struct.pack("!HI", 7, 0) + b"\x80"),
        _with_header(FrameType.RESET, 1, struct.pack("!H", 9) + b"ok\xfe"),
        _with_header(FrameType.GOAWAY, 0, struct.pack("!IH", 0, 0) + b"\xc0\xaf"),
    ],
    ids=["open-node", "open-host", "open-surrogate", "open-result", "reset", "goaway"],
)
def test_bad_utf8_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_message(raw, LIMIT)


def test_text_length_limit() -> None:
    at_limit = "n" * MAX_TEXT
    frame = Open(1, 0, Target(at_limit, at_limit, 1))
    assert decode_message(encode(frame), LIMIT) == [frame]
    with pytest.raises(ValueError):
        encode(Open(1, 0, Target(at_limit + "n", "h", 1)))
    with pytest.raises(ValueError):
        encode(Reset(1, ErrorCode.CANCEL, "é" * (MAX_TEXT // 2 + 1)))
    too_long = _with_header(FrameType.OPEN, 1, _open_payload(b"n" * (MAX_TEXT + 1), b"h"))
    with pytest.raises(ProtocolError):
        decode_message(too_long, LIMIT)
    too_long = _with_header(FrameType.RESET, 1, struct.pack("!H", 9) + b"m" * (MAX_TEXT + 1))
    with pytest.raises(ProtocolError):
        decode_message(too_long, LIMIT)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        # OPEN: trailing bytes, a length field past the end, a payload shorter than its head.
        (_with_header(FrameType.OPEN, 1, _open_payload(b"n", b"h") + b"x"), FrameSizeError),
        (_with_header(FrameType.OPEN, 1, _open_payload(b"n", b"h")[:-1]), FrameSizeError),
        (_with_header(FrameType.OPEN, 1, struct.pack("!IHH", 0, 80, 50) + b"n"), FrameSizeError),
        (_with_header(FrameType.OPEN, 1, b"\x00\x00"), FrameSizeError),
        (_with_header(FrameType.OPEN, 1, _open_payload(b"n", b"h", window=2**31)), ProtocolError),
        (_with_header(FrameType.OPEN, 0, _open_payload(b"n", b"h")), ProtocolError),
        (_with_header(FrameType.OPEN_RESULT, 1, b"\x00" * 5), FrameSizeError),
        (_with_header(FrameType.OPEN_RESULT, 1, struct.pack("!HI", 0, 2**31)), ProtocolError),
        (_with_header(FrameType.OPEN_RESULT, 0, struct.pack("!HI", 0, 0)), ProtocolError),
        (_with_header(FrameType.DATA, 0, b"x"), ProtocolError),
        (_with_header(FrameType.WINDOW_UPDATE, 1, b"\x00\x00\x01"), FrameSizeError),
        (_with_header(FrameType.WINDOW_UPDATE, 1, b"\x00\x00\x00\x01\x00"), FrameSizeError),
        (_with_header(FrameType.WINDOW_UPDATE, 1, struct.pack("!I", 0)), ProtocolError),
        (_with_header(FrameType.WINDOW_UPDATE, 0, struct.pack("!I", 2**31)), ProtocolError),
        (_with_header(FrameType.RESET, 1, b"\x00"), FrameSizeError),
        (_with_header(FrameType.RESET, 0, b"\x00\x09"), ProtocolError),
        (_with_header(FrameType.PING, 0, b"1234567"), FrameSizeError),
        (_with_header(FrameType.PING, 0, b"123456789"), FrameSizeError),
        (_with_header(FrameType.PING, 3, b"12345678"), ProtocolError),
        (_with_header(FrameType.GOAWAY, 0, b"\x00" * 5), FrameSizeError),
        (_with_header(FrameType.GOAWAY, 1, b"\x00" * 6), ProtocolError),
        (_with_header(FrameType.SETTINGS, 0, b"\x00" * 7), FrameSizeError),
        (_with_header(FrameType.SETTINGS, 1, b""), ProtocolError),
    ],
)
def test_malformed_payloads(raw: bytes, error: type[ProtocolError]) -> None:
    with pytest.raises(error):
        decode_message(raw, LIMIT)


def test_window_bounds_are_inclusive() -> None:
    frames: list[Frame] = [
        WindowUpdate(0, MAX_WINDOW),
        Open(2, MAX_WINDOW, Target("n", "h", 65535)),
        OpenResult(2, ErrorCode.OK, MAX_WINDOW),
    ]
    assert decode_message(b"".join(map(encode, frames)), LIMIT) == frames


def test_ping_payload_must_be_eight_bytes_to_encode() -> None:
    with pytest.raises(ValueError):
        encode(Ping(b"short"))


# -- fuzzing ----------------------------------------------------------------------------------


@settings(max_examples=examples(500), deadline=None)
@given(st.binary(max_size=200), st.sampled_from([MIN_FRAME_SIZE, LIMIT]))
def test_random_bytes_only_raise_protocol_errors(raw: bytes, max_frame_size: int) -> None:
    try:
        decode_message(raw, max_frame_size)
    except ProtocolError:
        pass


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(any_frame, min_size=1, max_size=4), st.data())
def test_mutated_frames_only_raise_protocol_errors(
    frames: list[Frame], data: st.DataObject
) -> None:
    raw = bytearray(b"".join(encode(f) for f in frames))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    try:
        decode_message(bytes(raw), LIMIT)
    except ProtocolError:
        pass


def test_a_read_only_view_is_decoded_in_place_against_its_whole_buffer() -> None:
    """A read-only view (the tunnel reader's lent message) counts as immutable: a DATA payload
    stays a view of it when it is at least a quarter of the buffer the view keeps alive, not of
    the message; a writable view (a buffer its owner may reuse) is always copied."""
    payload = b"d" * 1000
    message = encode(Data(1, payload))
    small = bytearray(message)  # the buffer is the message
    large = bytearray(message + bytes(4 * len(message)))  # the message, then more of a buffer
    [kept] = decode_message(memoryview(small).toreadonly(), LIMIT)
    [copied] = decode_message(memoryview(large)[: len(message)].toreadonly(), LIMIT)
    [writable] = decode_message(memoryview(small), LIMIT)
    assert isinstance(kept, Data) and isinstance(kept.data, memoryview)
    assert kept.data.obj is small and bytes(kept.data) == payload
    for frame in (copied, writable):
        assert isinstance(frame, Data) and isinstance(frame.data, bytes)
        assert frame.data == payload
