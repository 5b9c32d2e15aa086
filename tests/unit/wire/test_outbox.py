"""The outbox's ordering and batching rules, as data."""

from __future__ import annotations

from ravenproxy.wire.outbox import OWN_MESSAGE, Outbox


def test_control_goes_first_and_ordered_keeps_its_order() -> None:
    box = Outbox(max_message_size=100)
    box.ordered(b"OPEN1")
    box.data(b"H1", b"payload")
    box.control(b"ACK")
    box.ordered(b"RESET1")
    box.control(b"WU")
    assert box.pending_bytes == 5 + 2 + 7 + 3 + 6 + 2
    assert box.control_bytes == 5 + 3 + 6 + 2  # everything but DATA
    [message] = box.take_pieces()
    # Control frames packed together, ahead of OPEN, DATA and RESET in queue order.
    assert message == [b"ACKWU", b"OPEN1", b"H1", b"payload", b"RESET1"]
    assert (box.pending_bytes, box.control_bytes, box.take_pieces()) == (0, 0, [])


def test_messages_never_exceed_the_limit_and_a_frame_never_spans_two() -> None:
    box = Outbox(max_message_size=10)
    for _ in range(7):
        box.control(b"abc")  # packed: three per chunk of at most 10 bytes
    box.data(b"HH", b"12345678")  # 10 bytes: a message of its own
    box.data(b"HH", b"1")
    messages = box.take_pieces()
    assert [b"".join(m) for m in messages] == [
        b"abcabcabc",
        b"abcabcabc",
        b"abc",
        b"HH12345678",
        b"HH1",
    ]
    assert all(sum(len(p) for p in m) <= 10 for m in messages)


def test_payloads_are_referenced_not_copied() -> None:
    box = Outbox(max_message_size=1 << 20)
    payload = memoryview(b"x" * 1000)
    box.data(b"H", payload)
    [message] = box.take_pieces()
    assert message[1] is payload


def test_clear_drops_everything() -> None:
    box = Outbox(max_message_size=100)
    box.control(b"a")
    box.data(b"H", b"b")
    box.clear()
    assert (box.pending_bytes, box.control_bytes, box.take_pieces()) == (0, 0, [])


def test_a_bulk_data_frame_is_a_message_of_its_own() -> None:
    """A DATA payload of OWN_MESSAGE bytes or more goes alone in its message: nothing batched
    before it or after it, though the limit would allow (the receiver keeps such a payload in
    place only when it is a large share of its message); smaller frames still batch."""
    box = Outbox(max_message_size=1 << 20)
    bulk = memoryview(b"B" * OWN_MESSAGE)
    box.control(b"WU")
    box.data(b"H1", b"small")
    box.data(b"H2", bulk)
    box.data(b"H3", b"after")
    box.data(b"H4", bulk)
    box.data(b"H5", bulk[:-1])  # just under the threshold: batched
    box.data(b"H6", b"tail")
    messages = box.take_pieces()
    assert [[bytes(p)[:2] for p in m] for m in messages] == [
        [b"WU", b"H1", b"sm"],
        [b"H2", b"BB"],
        [b"H3", b"af"],
        [b"H4", b"BB"],
        [b"H5", b"BB", b"H6", b"ta"],
    ]
    assert messages[1][1] is bulk  # still referenced, not copied


def test_take_one_takes_a_lone_frame_as_take_pieces_would() -> None:
    """The usual output at request rates: one frame, nothing else. take_one gives its header
    and payload (the payload as queued, uncopied) and empties the outbox; anything else is
    left, untouched, to take_pieces."""
    box = Outbox(max_message_size=100)
    payload = memoryview(b"payload")
    box.data(b"H1", payload)
    head, got = box.take_one()  # type: ignore[misc]
    assert head == b"H1" and got is payload
    assert (box.pending_bytes, box.control_bytes, box.take_pieces()) == (0, 0, [])
    box.ordered(b"RESET1")
    assert box.take_one() == (b"RESET1", b"")
    assert (box.pending_bytes, box.control_bytes) == (0, 0)
    assert box.take_one() is None  # nothing queued


def test_take_one_leaves_any_other_output_to_take_pieces() -> None:
    box = Outbox(max_message_size=100)
    box.data(b"H1", b"a")
    box.control(b"WU")  # credit goes with it, first: not the lone frame
    assert box.take_one() is None
    assert (box.pending_bytes, box.control_bytes) == (2 + 1 + 2, 2)
    assert box.take_pieces() == [[b"WU", b"H1", b"a"]]
    box.data(b"H1", b"a")
    box.data(b"H2", b"b")  # two frames
    assert box.take_one() is None
    assert box.take_pieces() == [[b"H1", b"a", b"H2", b"b"]]
