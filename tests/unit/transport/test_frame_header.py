"""The session writes tunnel messages as raw WebSocket frames (both sides: the agent's masked):
what websockets' parser reads back as the same messages, small ones gathered into one write."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from ravenproxy.transport.frame_batch import (
    COALESCE,
    WRITE_CHUNK,
    FrameBatch,
    batched,
    binary_frame_header,
    one_frame,
    one_small,
)


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 1 << 20, (1 << 20) + 1036])
def test_header_matches_websockets_serialisation(size: int) -> None:
    data = bytes(size)
    expected = Frame(Opcode.BINARY, data).serialize(mask=False, extensions=[])
    assert binary_frame_header(size) + data == expected


def parse(wire: bytes, *, masked: bool) -> list[bytes]:
    """The binary messages websockets' own frame parser reads from ``wire``."""
    reader = StreamReader()
    reader.feed_data(wire)
    reader.feed_eof()
    messages = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=masked, max_size=None, extensions=[])
        try:
            while True:
                next(parser)
        except StopIteration as done:
            frame = done.value
        assert frame.opcode is Opcode.BINARY and frame.fin
        messages.append(bytes(frame.data))
    return messages


@pytest.mark.parametrize("masked", [False, True])
def test_a_batch_is_few_writes_that_parse_back_to_its_messages(masked: bool) -> None:
    big = os.urandom(3 * COALESCE)
    batch: list[list[bytes | memoryview]] = [
        [b"\x00\x01head", b"ok"],  # a small DATA frame: header and payload
        [b"ping"],
        [b"\x00\x02head", memoryview(big)],  # bulk: the payload goes on uncopied (unmasked)
        [b"pong"],
    ]
    frames = FrameBatch(mask=masked, messages=len(batch))
    for pieces in batch:
        frames.add(pieces)
    out = frames.take()
    # The small messages and the bulk one's header in one run, topped up to a full record
    # from its payload; the rest of the payload; the last one.
    assert len(out) == 3
    assert len(out[0]) == COALESCE
    if not masked:  # the payload's rest goes on uncopied
        assert isinstance(out[1], memoryview) and out[1].obj is big
    wire = b"".join(bytes(p) for p in out)
    assert parse(wire, masked=masked) == [b"".join(bytes(p) for p in m) for m in batch]
    assert frames.take() == [] and frames.size == 0


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("head", [1, COALESCE - 100])
@pytest.mark.parametrize("extra", [0, 1, 5 * COALESCE + 7])
def test_a_bulk_payload_fills_the_run_before_it_to_a_full_record(
    masked: bool, head: int, extra: int
) -> None:
    # Over TLS each piece written ends in a record of its own: a bulk message must not start
    # with a short one (its frame header alone), which ends the receiver's read round early.
    payload = os.urandom(COALESCE + extra)
    batch: list[list[bytes | memoryview]] = [[os.urandom(head)], [b"\x00\x04head", payload]]
    frames = FrameBatch(mask=masked, messages=len(batch))
    for pieces in batch:
        frames.add(pieces)
    out = frames.take()
    assert len(out[0]) == COALESCE  # the small message, the bulk header, the payload's head
    assert all(len(p) for p in out)
    assert len(out) == (1 if sum(len(p) for p in out) == COALESCE else 2)
    wire = b"".join(bytes(p) for p in out)
    assert parse(wire, masked=masked) == [b"".join(m) for m in batch]


@pytest.mark.parametrize("masked", [False, True])
def test_batched_writes_parse_back_and_stop_at_the_write_chunk(masked: bool) -> None:
    bulk = [[b"\x00\x03head", os.urandom(WRITE_CHUNK // 2 + 1)] for _ in range(3)]
    batch: list[list[bytes | memoryview]] = [[b"small"], *bulk, [b"last"]]
    writes = list(batched(batch, mask=masked))
    # A write ends once it holds WRITE_CHUNK bytes: after the second bulk message, then the rest.
    assert len(writes) == 2
    wire = b"".join(bytes(p) for w in writes for p in w)
    assert parse(wire, masked=masked) == [b"".join(m) for m in batch]
    assert list(batched([], mask=masked)) == []


def test_masking_keys_are_drawn_fresh_for_every_batch() -> None:
    # Keys come from a pool of os.urandom: no batch may get bytes another one got (a reused
    # key would be a predictable one), also across refills of the pool (600 x 12 bytes).
    drawn = [FrameBatch(mask=True, messages=3).keys for _ in range(600)]
    assert all(len(keys) == 12 for keys in drawn)
    assert len(set(drawn)) == len(drawn)
    assert len(FrameBatch(mask=True, messages=5000).keys) == 20000  # beyond the pool
    assert FrameBatch(mask=False, messages=3).keys == b""


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(
    "pieces",
    [
        [b"\x00\x01head", b"ok"],
        [b"p" * 125],
        [b"\x00\x02head", memoryview(b"x" * 200)],
        [b"\x00\x03head", b"y" * (COALESCE - 40), b"z"],
    ],
)
def test_one_small_message_is_the_frame_batched_makes(
    masked: bool, pieces: list[bytes | memoryview]
) -> None:
    # The writer's usual batch at request rates, made without a FrameBatch: one write of the
    # same frame (masked with a fresh key, so compared after unmasking).
    batch: list[list[bytes | memoryview]] = [pieces]
    small = one_small(batch, mask=masked)
    assert small is not None and len(small) == 1
    if not masked:
        assert list(batched(batch, mask=False)) == [small]
    [reference] = batched(batch, mask=masked)
    assert len(small[0]) == sum(len(p) for p in reference)
    assert parse(bytes(small[0]), masked=masked) == [b"".join(bytes(p) for p in pieces)]


@pytest.mark.parametrize("masked", [False, True])
def test_one_small_leaves_every_other_batch_to_batched(masked: bool) -> None:
    assert one_small([], mask=masked) is None
    assert one_small([[b"a"], [b"b"]], mask=masked) is None
    assert one_small([[b"\x00\x04head", os.urandom(COALESCE)]], mask=masked) is None
    assert one_small([[bytes(COALESCE - 16)]], mask=masked) is None


def test_one_small_draws_a_fresh_masking_key_each_time() -> None:
    frames = {bytes(one_small([[b"same"]], mask=True)[0]) for _ in range(200)}  # type: ignore[index]
    assert len(frames) == 200


def _frame_of(head: bytes, payload: bytes | memoryview, masked: bool) -> None:
    """one_frame's frame is what batched makes of the message (but for the masking key)."""
    frame = one_frame(head, payload, masked)
    message = head + bytes(payload)
    if len(message) >= COALESCE - 16:
        assert frame is None
        return
    assert frame is not None
    [reference] = batched([[head, payload] if payload else [head]], mask=masked)
    if not masked:
        assert frame == b"".join(bytes(p) for p in reference)
    assert len(frame) == sum(len(p) for p in reference)
    assert parse(frame, masked=masked) == [message]
    header = binary_frame_header(len(message), masked=masked)  # tabled or packed: the same
    assert frame[: len(header)] == header


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(
    "size", [0, 1, 12, 113, 125, 126, 127, 1000, 1023, 1024, 1025, COALESCE - 17, COALESCE - 16]
)
def test_one_frame_at_every_header_size(masked: bool, size: int) -> None:
    # Under 1 024 bytes the header comes from a table (both MASK bits; the 7-bit length, then
    # the 16-bit one), then it is packed.
    _frame_of(b"\x00\x01\x00\x00head"[: min(size, 8)], os.urandom(max(0, size - 8)), masked)


@settings(max_examples=300, deadline=None)
@given(
    st.binary(max_size=16),
    st.one_of(st.binary(max_size=400), st.binary(max_size=400).map(memoryview)),
    st.booleans(),
)
def test_one_frame_frames_a_header_and_payload_as_batched_does(
    head: bytes, payload: bytes | memoryview, masked: bool
) -> None:
    _frame_of(head, payload, masked)


def test_one_frame_draws_a_fresh_masking_key_each_time() -> None:
    frames = {one_frame(b"head", b"same", True) for _ in range(200)}
    assert len(frames) == 200
