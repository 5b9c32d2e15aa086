""":func:`send_through` (``Connection.send_small_on`` where nothing is queued: the write
through of an idle tunnel's small message, :meth:`~ravenproxy.transport.outlet.Outlet.
_write_through`) against :meth:`Connection.send_upto`
then the outbox taken, over many inputs (hypothesis): two connections in the same state given
the same writes, one through ``send_through`` first (``send_upto`` when it steps aside), the
other through ``send_upto`` alone, must count the same windows, give the same errors and put
the same frames on the wire in the same order; ``send_through`` takes a frame only where the
other's outbox then holds that frame and nothing else, and steps aside changing nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.errors import WireError
from tests.helpers import examples

from .test_data_path import CONFIG, STREAM_IDS, make

Op = tuple[Any, ...]


def send_through(conn: Connection, stream_id: int, data: Any, limit: int) -> bytes | None:
    """What the outlet's write-through asks of the wire when nothing is queued (this was
    ``Connection.send_through``): ``send_small_on`` of the stream, None while anything is
    queued (the frame may go before nothing)."""
    if conn.outbox.pending_bytes:
        return None
    return conn.send_small_on(conn.streams.get(stream_id), data, limit)


def send_through_on(conn: Connection, stream: Any, data: Any, limit: int) -> bytes | None:
    """:func:`send_through` of a held stream (this was ``Connection.send_through_on``)."""
    if conn.outbox.pending_bytes:
        return None
    return conn.send_small_on(stream, data, limit)


def state(conn: Connection) -> Any:
    """What a write may change, nothing flushed."""
    return (
        conn._conn_send.available,
        sorted((s.id, s.state, s.send.available) for s in conn.streams.values()),
        conn.outbox.pending_bytes,
        conn.outbox.control_bytes,
    )


def payload(kind: str, n: int) -> bytes | bytearray | memoryview:
    data = bytes(range(256)) * (n // 256 + 1)
    if kind == "bytes":
        return data[:n]
    if kind == "bytearray":
        return bytearray(data[:n])
    return memoryview(data)[:n]


def outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except (WireError, ValueError) as exc:
        return ("error", type(exc), str(exc))


def apply(direct: Connection, queued: Connection, op: Op) -> tuple[list[bytes], list[bytes]]:
    """One op on both; the bytes each put on the wire because of it."""
    wire_direct: list[bytes] = []
    wire_queued: list[bytes] = []
    match op:
        case ("write", sid, kind, n, limit):
            data = payload(kind, n)
            before = state(direct)
            head = send_through(direct, sid, data, limit)
            if head is None:
                assert state(direct) == before  # stepped aside, changing nothing
                sent = direct.send_upto(sid, data, limit)
            else:
                sent = len(data)
                wire_direct.append(head + bytes(data))
            assert queued.send_upto(sid, data, limit) == sent
            if head is not None:
                # Where the queued path would have held this one frame and nothing else.
                assert queued.outbox.take_one() == (head, data)
                assert not queued.outbox.pending_bytes
                wire_queued.append(head + bytes(data))
        case ("end", sid):
            assert outcome(lambda: direct.end_stream(sid)) == outcome(
                lambda: queued.end_stream(sid)
            )
        case ("reset", sid):
            direct.reset_stream(sid, ErrorCode.CANCEL)
            queued.reset_stream(sid, ErrorCode.CANCEL)
        case ("goaway",):
            direct.goaway(ErrorCode.OK, "bye")
            queued.goaway(ErrorCode.OK, "bye")
        case ("flush",):
            wire_direct += direct.data_to_send()
            wire_queued += queued.data_to_send()
    return wire_direct, wire_queued


sids = st.sampled_from(STREAM_IDS)
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            sids,
            st.sampled_from(["bytes", "bytes", "bytearray", "memoryview"]),
            st.one_of(st.integers(0, 40), st.integers(500, 3000), st.sampled_from([2048, 16384])),
            st.sampled_from([0, 10, 1000, 4096, 16 * 1024 - 13, 1 << 30]),
        ),
        st.tuples(st.just("flush")),
        st.tuples(st.just("end"), sids),
        st.tuples(st.just("reset"), sids),
        st.tuples(st.just("goaway")),
    ),
    max_size=30,
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
@example(ops=[("write", 1, "bytes", 18, 1 << 30), ("write", 1, "bytes", 5, 1 << 30)])
@example(ops=[("goaway",), ("write", 1, "bytes", 18, 1 << 30), ("flush",)])
@example(ops=[("write", 1, "bytes", 3000, 1 << 30), ("write", 2, "bytes", 10, 1 << 30)])
def test_send_through_counts_and_sends_what_send_upto_queues(ops: list[Op]) -> None:
    (_, direct), (_, queued) = make(), make()
    wire_direct: list[bytes] = []
    wire_queued: list[bytes] = []
    for op in [*ops, ("flush",)]:
        got_direct, got_queued = apply(direct, queued, op)
        wire_direct += got_direct
        wire_queued += got_queued
        assert state(direct) == state(queued)
    assert b"".join(wire_direct) == b"".join(wire_queued)


def test_the_idle_small_write_is_taken_and_counted() -> None:
    _, conn = make()
    before = conn._conn_send.available, conn.streams[1].send.available
    head = send_through(conn, 1, b"GET / HTTP/1.1\r\n\r\n", 1 << 30)
    assert head is not None
    assert not conn.outbox.pending_bytes  # not queued: the caller writes it
    assert (conn._conn_send.available, conn.streams[1].send.available) == (
        before[0] - 18,
        before[1] - 18,
    )


def test_it_never_goes_before_queued_output() -> None:
    _, conn = make()
    conn.goaway(ErrorCode.OK, "")  # a control frame queued
    assert send_through(conn, 1, b"ping", 1 << 30) is None
    _, conn = make()
    assert conn.send_upto(1, b"first", 1 << 30) == 5
    assert send_through(conn, 1, b"second", 1 << 30) is None


def test_it_steps_aside_for_what_it_cannot_send_whole() -> None:
    _, conn = make()
    window = conn.streams[1].send.available
    assert send_through(conn, 1, bytes(window + 1), 1 << 30) is None  # past the window
    assert send_through(conn, 1, b"x" * 11, 10) is None  # past the limit
    assert send_through(conn, 1, b"", 1 << 30) is None  # nothing
    assert send_through(conn, 1, bytearray(b"reused"), 1 << 30) is None  # copied by send_data
    assert send_through(conn, 9, b"x", 1 << 30) is None  # never opened
    assert send_through(conn, 3, b"x", 1 << 30) is None  # we ended it
    assert CONFIG.max_frame_size < 1 << 30
