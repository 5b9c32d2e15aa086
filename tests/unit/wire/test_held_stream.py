"""``Connection.consumed_on`` and ``send_small_on`` where nothing is queued (a chunk read's
credit, a small write's frame, given the wire stream a tunnel stream holds, not its id)
against ``consumed`` and ``send_through`` as they were at c0d4bc7, kept verbatim below as the
oracles: two connections in the same state, given the same messages (DATA, FIN, RESET: the
streams held leave ``streams`` on the way), ends, resets and calls, one through the ``_on``
method of the stream taken when it opened, the other through the oracle of its id, must return
the same, queue the same frames and end in the same state."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.data_path import _DATA_WORD, _pack_words
from ravenproxy.wire.errors import WireError
from ravenproxy.wire.frames import HEADER_SIZE, Data, Reset, WindowUpdate, encode
from ravenproxy.wire.streams import RECEIVING, SENDING, State, Stream
from tests.helpers import examples
from tests.unit.wire.test_direct_send import send_through_on

from .harness import Pair
from .test_data_path import (
    AGENT_OPENED,
    CONFIG,
    HALF_LOCAL,
    HALF_REMOTE,
    OPEN,
    RESET,
    STREAM_IDS,
    consumed_sizes,
    fast,
    messages,
    plain,
    state,
)


def c0d4bc7_consumed(self: Connection, stream_id: int, n: int) -> bool:
    """``DataPath.consumed`` at c0d4bc7, verbatim."""
    if n <= 0:
        return False
    conn = self._conn_recv
    stream = self.streams.get(stream_id)
    if stream is not None and stream.state in RECEIVING:
        # RecvWindow.consume_shared and consume, written out for the usual chunk, after
        # which neither window is due an update: only the count of unreturned credit grows.
        recv = stream.recv
        conn_unacked = conn.unacked + n
        unacked = recv.unacked + n
        half = conn.half
        if (
            conn_unacked < half
            and conn.available >= half
            and unacked < recv.half
            and conn_unacked + conn.available <= conn.size
            and unacked + recv.available <= recv.size
        ):
            conn.unacked = conn_unacked
            recv.unacked = unacked
            return False
    now = self._clock()
    inc = conn.consume_shared(n)
    queued = bool(inc)
    if inc:
        self._emit(WindowUpdate(0, inc))
    if stream is None or stream.state not in RECEIVING:
        return queued  # the peer sends no more on it: stream credit would be wasted
    # A window only grows while the connection budget is mostly free, so a few fast
    # streams cannot claim the budget that stalled ones are holding.
    may_grow = conn.buffered < self.config.connection_window // 2
    inc = stream.recv.consume(n, now, self.rtt, may_grow=may_grow)
    if inc:
        self._emit(WindowUpdate(stream_id, inc))
        return True
    return queued


def outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except (WireError, ValueError) as exc:
        return ("error", type(exc), str(exc))


def make() -> tuple[Pair, Connection, dict[int, Stream | None]]:
    """test_data_path's pair (streams in every state), with the agent's wire streams as a
    tunnel stream takes them when it is made: before they end (the reset one, 7, too)."""
    pair = Pair(server_config=CONFIG, agent_config=CONFIG)
    for _ in range(4):
        pair.open()  # 1, 3, 5, 7
    pair.open(pair.agent)  # 2
    held = {sid: pair.agent.streams.get(sid) for sid in STREAM_IDS}
    pair.agent.end_stream(HALF_LOCAL)
    pair.server.end_stream(HALF_REMOTE)
    pair.server.reset_stream(RESET, ErrorCode.CANCEL)
    pair.pump()
    return pair, pair.agent, held


ending = st.one_of(  # what makes a held stream leave ``streams``
    st.builds(
        lambda sid: encode(Data(sid, b"end", fin=True)),
        st.sampled_from([OPEN, HALF_LOCAL, AGENT_OPENED]),
    ),
    st.builds(
        lambda sid: encode(Reset(sid, ErrorCode.CANCEL, "")),
        st.sampled_from([OPEN, HALF_LOCAL, HALF_REMOTE, AGENT_OPENED]),
    ),
)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("message"), messages()),
        st.tuples(st.just("message"), ending),
        st.tuples(st.just("consume"), st.sampled_from(STREAM_IDS), consumed_sizes),
        st.tuples(st.just("consume"), st.sampled_from([OPEN, AGENT_OPENED]), consumed_sizes),
        st.tuples(st.just("clock"), st.sampled_from([0.001, 0.05, 1.0])),
    ),
    max_size=40,
)


@settings(
    max_examples=examples(400),
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(ops)
def test_consumed_on_a_held_stream_agrees_with_c0d4bc7s_consumed(
    steps: list[tuple[Any, ...]],
) -> None:
    pair_a, a, held = make()
    pair_b, b, _ = make()
    assert state(a) == state(b)
    for step in steps:
        if step[0] == "message":
            message = step[1]
            got_a = outcome(lambda: plain(fast(a, message)))  # noqa: B023
            got_b = outcome(lambda: plain(fast(b, message)))  # noqa: B023
        elif step[0] == "consume":
            sid, n = step[1], step[2]
            if isinstance(n, float):
                stream = a.streams.get(sid)
                n = max(1, int(n * (stream.recv.buffered if stream else a._conn_recv.buffered)))
            got_a = outcome(lambda: a.consumed_on(held[sid], n))  # noqa: B023
            got_b = outcome(lambda: c0d4bc7_consumed(b, sid, n))  # noqa: B023
        else:
            pair_a.clock.advance(step[1])
            pair_b.clock.advance(step[1])
            continue
        assert got_a == got_b, step
        assert state(a) == state(b), step


def test_a_held_stream_that_ended_gets_no_credit() -> None:
    """The edge the oracle's lookup covered: a stream that left ``streams`` (here by the
    peer's RESET) is not found by id; held, it is closed, so its chunk returns the
    connection's credit only, as the id's did."""
    _, a, held = make()
    _, b, _ = make()
    stream = held[OPEN]
    assert stream is not None
    for conn in (a, b):  # the stream buffered a chunk, then the peer reset it
        fast(conn, encode(Data(OPEN, b"x" * 2000, fin=False)))
        fast(conn, encode(Reset(OPEN, ErrorCode.CANCEL, "")))
    assert OPEN not in a.streams and stream.state is State.CLOSED
    assert a.consumed_on(stream, 2000) == c0d4bc7_consumed(b, OPEN, 2000)
    assert state(a) == state(b)
    assert a._conn_recv.unacked == b._conn_recv.unacked


def c0d4bc7_send_through(
    self: Connection, stream_id: int, data: bytes | memoryview, limit: int
) -> bytes | None:
    """``DataPath.send_through`` at c0d4bc7, verbatim (its docstring left out)."""
    if self.outbox.pending_bytes:
        return None
    stream = self.streams.get(stream_id)
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
        return _pack_words(_DATA_WORD, stream_id, n)
    return None


write_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.sampled_from(STREAM_IDS),
            st.sampled_from(["bytes", "bytes", "bytes", "memoryview"]),
            st.one_of(st.integers(0, 40), st.integers(500, 3000), st.sampled_from([2048, 16384])),
            st.sampled_from([0, 10, 1000, 4096, 1 << 30]),
        ),
        st.tuples(st.just("flush")),
        st.tuples(st.just("end"), st.sampled_from(STREAM_IDS)),
        st.tuples(st.just("reset"), st.sampled_from(STREAM_IDS)),
        st.tuples(st.just("message"), ending),
        st.tuples(st.just("goaway")),
    ),
    max_size=30,
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(write_ops)
def test_send_through_on_a_held_stream_agrees_with_c0d4bc7s_send_through(
    steps: list[tuple[Any, ...]],
) -> None:
    _, a, held = make()
    _, b, _ = make()
    for step in steps:
        match step:
            case ("write", sid, kind, n, limit):
                raw = bytes(range(256)) * (n // 256 + 1)
                data = raw[:n] if kind == "bytes" else memoryview(raw)[:n]
                got_a = send_through_on(a, held[sid], data, limit)
                got_b = c0d4bc7_send_through(b, sid, data, limit)
                assert got_a == got_b, step
                if got_a is None:  # both take the queued path, so that the states move on
                    assert outcome(lambda: a.send_upto(sid, data, limit)) == outcome(  # noqa: B023
                        lambda: b.send_upto(sid, data, limit)  # noqa: B023
                    )
            case ("flush",):
                assert a.data_to_send() == b.data_to_send()
            case ("end", sid):
                assert outcome(lambda: a.end_stream(sid)) == outcome(lambda: b.end_stream(sid))
            case ("reset", sid):
                assert outcome(lambda: a.reset_stream(sid, ErrorCode.CANCEL)) == outcome(
                    lambda: b.reset_stream(sid, ErrorCode.CANCEL)
                )
            case ("message", message):
                assert outcome(lambda: plain(fast(a, message))) == outcome(
                    lambda: plain(fast(b, message))
                )
            case ("goaway",):
                a.goaway(ErrorCode.OK, "bye")
                b.goaway(ErrorCode.OK, "bye")
        assert state(a) == state(b), step
