""":meth:`Connection.send_small_on` (a tunnel stream's small write, through or queued behind a
burst's output: :meth:`~ravenproxy.transport.outlet.Outlet._write_through`) against what the
outlet did at f667209, over many inputs (hypothesis): ``send_through_on`` (kept verbatim below
as the oracle) with ``send_upto(sid, data, max_message_size - pending)`` when it stepped aside
(``TunnelStream.try_write``'s queued path). Two connections in the same state given the same
writes must count the same windows, give the same errors and put the same frames on the wire
in the same order; ``send_small_on`` writes a frame through only where the oracle did, queues
one only where ``send_upto`` queued all of it, and steps aside changing nothing."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.wire.codes import ErrorCode, FrameType
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.frames import HEADER_SIZE
from ravenproxy.wire.streams import SENDING, Stream
from tests.helpers import examples

from .test_data_path import CONFIG, STREAM_IDS, make
from .test_direct_send import outcome, payload, state

Op = tuple[Any, ...]

# A message of one full frame and a little more: the "our message size less what is queued"
# bound is met by a few queued writes.
TIGHT = dataclasses.replace(CONFIG, max_message_size=CONFIG.max_frame_size + HEADER_SIZE + 600)

_f667209_pack_words = struct.Struct("!III").pack
_F667209_DATA_WORD = int(FrameType.DATA) << 24


def f667209_send_through_on(
    self: Connection, stream: Stream | None, data: bytes | memoryview, limit: int
) -> bytes | None:
    """``DataPath.send_through_on`` at f667209, verbatim (its docstring left out)."""
    if self.outbox.pending_bytes:
        return None
    if stream is None or stream.state not in SENDING:
        return None
    send, conn_send = stream.send, self._conn_send
    n = len(data)
    if (
        0 < n <= send.available
        and n <= conn_send.available
        and n <= limit
        and n <= self.peer_max_frame_size
        and n <= self.config.max_message_size - HEADER_SIZE
        and type(data) is bytes
    ):
        send.available -= n  # as send_upto counts it
        conn_send.available -= n
        return _f667209_pack_words(_F667209_DATA_WORD, stream.id, n)
    return None


def queued_limit(conn: Connection) -> int:
    """``TunnelStream.try_write``'s limit for ``send_upto``."""
    return conn.config.max_message_size - conn.outbox.pending_bytes


def apply(new: Connection, old: Connection, op: Op) -> tuple[list[bytes], list[bytes]]:
    """One op on both; the bytes each put on the wire because of it."""
    wire_new: list[bytes] = []
    wire_old: list[bytes] = []
    match op:
        case ("write", sid, kind, n, limit):
            data = payload(kind, n)
            before = state(new)
            queued_before = new.outbox.pending_bytes
            got = new.send_small_on(new.streams.get(sid), data, limit)
            if got is None:
                assert state(new) == before  # stepped aside, changing nothing
                sent_new = new.send_upto(sid, data, queued_limit(new))
            elif got:
                assert not queued_before  # through: only with nothing queued
                sent_new = len(data)
                wire_new.append(got + bytes(data))
            else:
                assert queued_before  # queued: only behind queued output
                assert new.outbox.pending_bytes == queued_before + HEADER_SIZE + len(data)
                assert new.outbox.pending_bytes <= new.config.max_message_size
                sent_new = len(data)
            head = f667209_send_through_on(old, old.streams.get(sid), data, limit)
            if head is None:
                sent_old = old.send_upto(sid, data, queued_limit(old))
            else:
                sent_old = len(data)
                wire_old.append(head + bytes(data))
            assert sent_new == sent_old
            assert (got is not None and got != b"") == (head is not None)
        case ("control", size):  # control output queued (bytes the outbox passes on as given)
            new.outbox.control(bytes(size))
            old.outbox.control(bytes(size))
        case ("end", sid):
            assert outcome(lambda: new.end_stream(sid)) == outcome(lambda: old.end_stream(sid))
        case ("reset", sid):
            new.reset_stream(sid, ErrorCode.CANCEL)
            old.reset_stream(sid, ErrorCode.CANCEL)
        case ("goaway",):
            new.goaway(ErrorCode.OK, "bye")
            old.goaway(ErrorCode.OK, "bye")
        case ("flush",):
            wire_new += new.data_to_send()
            wire_old += old.data_to_send()
    return wire_new, wire_old


sids = st.sampled_from(STREAM_IDS)
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            sids,
            st.sampled_from(["bytes", "bytes", "bytes", "bytearray", "memoryview"]),
            st.one_of(st.integers(0, 40), st.integers(200, 700), st.sampled_from([2048, 16384])),
            st.sampled_from([0, 10, 1000, 4096, 16 * 1024 - 13, 1 << 30]),
        ),
        st.tuples(st.just("flush")),
        st.tuples(st.just("control"), st.sampled_from([20, 8000, 15000])),
        st.tuples(st.just("end"), sids),
        st.tuples(st.just("reset"), sids),
        st.tuples(st.just("goaway")),
    ),
    max_size=30,
)


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, tight=st.booleans())
@example(ops=[("write", 1, "bytes", 18, 1 << 30), ("write", 1, "bytes", 5, 1 << 30)], tight=False)
@example(ops=[("control", 20), ("write", 1, "bytes", 18, 1 << 30), ("flush",)], tight=False)
@example(
    ops=[
        ("control", 15000),
        ("write", 1, "bytes", 2048, 1 << 30),
        ("write", 2, "bytes", 700, 1 << 30),
    ],
    tight=True,
)
@example(ops=[("write", 1, "bytes", 3000, 1 << 30), ("write", 2, "bytes", 10, 10)], tight=False)
def test_send_small_on_counts_and_sends_what_f667209s_write_did(ops: list[Op], tight: bool) -> None:
    config = TIGHT if tight else CONFIG
    (_, new), (_, old) = make(config, config), make(config, config)
    wire_new: list[bytes] = []
    wire_old: list[bytes] = []
    for op in [*ops, ("flush",)]:
        got_new, got_old = apply(new, old, op)
        wire_new += got_new
        wire_old += got_old
        assert state(new) == state(old)
    assert b"".join(wire_new) == b"".join(wire_old)


def test_a_write_behind_queued_output_is_queued_after_it() -> None:
    _, conn = make()
    assert conn.send_upto(1, b"first", 1 << 30) == 5
    window = conn.streams[1].send.available
    assert conn.send_small_on(conn.streams[1], b"second", 1 << 30) == b""
    assert conn.streams[1].send.available == window - 6
    assert conn.data_to_send() == [
        struct.pack("!BBHII", FrameType.DATA, 0, 0, 1, 5)
        + b"first"
        + struct.pack("!BBHII", FrameType.DATA, 0, 0, 1, 6)
        + b"second"
    ]


def test_it_steps_aside_where_the_queue_would_pass_one_message() -> None:
    (_, conn) = make(TIGHT, TIGHT)
    conn.outbox.control(bytes(TIGHT.max_message_size - 1000))
    stream = conn.streams[1]
    fits = 1000 - HEADER_SIZE
    assert conn.send_small_on(stream, bytes(fits + 1), 1 << 30) is None
    assert conn.send_small_on(stream, bytes(fits), 1 << 30) == b""
    assert conn.outbox.pending_bytes == TIGHT.max_message_size
