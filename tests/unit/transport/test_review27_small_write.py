"""Review of branch through (issue 15): a stream's small write behind queued output (a burst's
earlier writes, control frames) queued by the write-through path itself
(``Outlet._write_through`` with ``DataPath.send_small_on``) where f667209 stepped aside to
``send_upto`` (``try_write``) or ``send_data`` (``write``) and then ``_flush``.

The oracle is f667209's code, kept verbatim below: ``Outlet._write_through``, ``_flush`` and
``_flush_late``, ``DataPath.send_through_on``, ``TunnelStream.try_write`` and ``write``, put on
one tunnel's cloud session (its streams' class patched for the run) while another tunnel runs
the code as it is. Both are given the same generated bursts, each operation in the same loop
turn as the one before it unless a ``turn`` ends it: several streams writing (``try_write`` and
``write``, sizes around the write-through bound, the message size and the windows), control
frames queued (PING), a stream reset or ended mid-burst, the tunnel paused and resumed (its
writer busy), more input said to wait (the readiness probe, scripted here so both runs see the
same answers) or a TLS read due (``soon``). The peer never reads, so no credit comes back and
the windows are the same in both runs at every step. After every operation: the same return,
the same transport writes so far (bytes and how they are grouped), the same windows (each
stream's, the connection's), the same bytes queued, the same flags (writer woken, a late
flush pending, the turn's "more"). After every turn's end: nothing written late — the outbox
empty unless the writer was woken (``_wake``) or the transport is paused (but for a PING
this test queued without a flush, as no code of the session queues one) — and the turn's
``seen`` cleared.

No finding: every run alike. Hand breaks of through's code tried (each fails
``test_bursts_as_f667209``): ``send_small_on`` queueing behind output without the message bound
(``queued + HEADER_SIZE + n``: caught by its explicit examples of two writes and a full one);
``_write_through`` not calling ``_flush`` after queueing (the write left for nobody);
``send_small_on`` not counting the connection window (``conn_send.available -= n`` dropped);
``send_small_on`` putting the frame before what is queued (``outbox._ordered.insert(0, ...)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Generator
from types import MethodType
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.transport.frame_batch import COALESCE, WRITE_THROUGH, one_frame, writes
from ravenproxy.transport.session import Session, SessionConfig, StreamClosedError, TunnelStream
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.frames import HEADER_SIZE, MIN_FRAME_SIZE, Ping, decode_message
from ravenproxy.wire.streams import Stream
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import record, settle
from tests.unit.transport.test_write_through_async import ws_messages
from tests.unit.wire.test_small_send import f667209_send_through_on

Op = tuple[Any, ...]

# -- f667209's code, verbatim (functions named for it) --------------------------------------------

_F66_THROUGH = min(WRITE_THROUGH, COALESCE - 16) - HEADER_SIZE - 1
# f667209's ``DataPath.send_through_on``, verbatim, as through's own test keeps it.
_f66_send_through_on = f667209_send_through_on


def _f66_flush(self: Any, late: bool = False) -> None:
    """Queued output, to be written: through at once (small output, the writer idle), else
    by the writer task. Several times a request: one call, its checks written out."""
    # Deferred: the read round being taken flushes at its end.
    outbox = self.conn.outbox
    if self._wake or self._deferred or not outbox.pending_bytes:
        return
    waiter = self._wake_writer
    # The writer is busy (or gone): None once it took the wake-up, and where the session
    # cancels it (not waiter.done(), a method call a write; a future cancelled with its
    # task by another hand, at the loop's shutdown, is asked below).
    if waiter is None:
        self._wake = True
        return
    # Not while the transport is paused, after a CLOSE, or while the reader holds messages
    # back (taking them re-enters _flush: its write would go before this one): the
    # writer's. (Not asked: is_closing(), a call a request. A closing transport drops what
    # is written, the tunnel's TLS one as uvloop's until connection_lost, after which the
    # gate says no.)
    ws = self.ws
    if outbox.pending_bytes < WRITE_THROUGH and not (
        ws.paused or self._held is not None or self._gate.data_closed
    ):
        # Written now by whoever queued it, unless more input waits in this turn (a burst:
        # its other events queue more; it is all written at the turn's end, in one write).
        # Asked once a burst: after a poll said more, the turn's later writes wait too.
        probe = self._probe
        poll = probe.poll  # a slot holding a bound method: as a method, not specialized
        more: object  # its truth: no bool() (a type call) a write
        try:  # Readiness.more_input, written out
            more = not late and (probe.soon or probe.seen or poll(0, 1))
        except ValueError:  # the probe is closed: the writer's, as without it
            more = True
        if not more:
            # Written in the caller's turn, for the idle writer (not by a method of its own:
            # a call a request): no task step and no loop turn between a request (its
            # answer) and its write.
            one = outbox.take_one()  # the usual output: one frame, no lists made for it
            batch = outbox.take_pieces() if one is None else None
            if self._taken.waiter is not None:
                self._taken.set()
            transport, mask = ws.transport, not self.conn.server_side
            frame = None if one is None else one_frame(one[0], one[1], mask)
            if frame is not None:  # (write: the tunnel's TLS transport sends it at once)
                transport.write(frame)
            else:
                if batch is None:  # one frame, too large for one_frame
                    assert one is not None
                    batch = [[one[0], one[1]] if one[1] else [one[0]]]
                for frames in writes(batch, mask=mask):
                    transport.writelines(frames)
            if self._drain_event.waiter is not None:
                self._drain_event.set()
        else:
            probe.seen = True  # the turn's later writes need not ask (see _flush_late)
            if not self._late:  # written at the turn's end, with what the burst adds
                self._late = True
                self.loop.call_soon(self._flush_late)
        return
    self._wake = True
    self._wake_writer = None
    if not waiter.done():  # else cancelled with its task: gone
        waiter.set_result(None)


def _f66_write_through(self: Any, stream: Stream | None, data: bytes | memoryview) -> bool:
    """A stream's small write (:meth:`TunnelStream.try_write`) as ``send_upto`` then
    :meth:`_flush` would send it when ``_flush`` writes it through at once, without
    queueing it and taking it back (~3 900 instructions a message): only where nothing is
    queued (nothing it could overtake, control frames included), ``_flush``'s conditions
    hold and the wire takes it as one frame (:meth:`Connection.send_through_on`; ``stream``:
    the writer's wire stream, which it holds). Returns whether it took ``data`` (all of
    it); False, having done nothing: the queued path."""
    if self._wake or self._deferred or self._wake_writer is None:
        return False
    ws = self.ws
    if ws.paused or self._held is not None or self._gate.data_closed:
        return False
    conn = self.conn
    head = conn.send_through_on(stream, data, _F66_THROUGH)  # None where anything is queued
    if head is None:
        return False
    probe = self._probe
    poll = probe.poll
    more: object
    try:  # as _flush asks it (its comments)
        more = probe.soon or probe.seen or poll(0, 1)
    except ValueError:
        more = True
    if more:  # queued, as send_upto queues it, for _flush's burst branch (see there)
        conn.outbox.data(head, data)
        probe.seen = True
        if not self._late:
            self._late = True
            self.loop.call_soon(self._flush_late)
        return True
    if self._taken.waiter is not None:
        self._taken.set()
    frame = one_frame(head, data, not conn.server_side)
    assert frame is not None  # (THROUGH)
    ws.transport.write(frame)
    if self._drain_event.waiter is not None:
        self._drain_event.set()
    return True


def _f66_flush_late(self: Any) -> None:
    """What the turn left queued (no later event of its burst wrote it), in the loop's next
    turn, before it polls again. The first of them ends the turn's "more input" (no
    handle of its own: one of these is pending wherever a poll said more)."""
    self._late = False
    self._probe.seen = False
    self._flush(late=True)


def _f66_try_write(self: Any, data: bytes | memoryview) -> int:
    """:meth:`write` without waiting: as much of ``data`` as the credit at hand and the
    room in the session's output allow goes now; returns how much (the rest is for
    :meth:`write`)."""
    if self._error is not None:
        return 0
    session = self.session
    if session._write_through(self._wire, data):  # an idle tunnel's small write: not queued
        n = len(data)
        self.bytes_out += n
        return n
    conn = session.conn
    limit = session.config.wire.max_message_size
    n = conn.send_upto(self.id, data, limit - conn.outbox.pending_bytes)
    if n:
        self.bytes_out += n
        session._flush()
    return n


async def _f66_write(self: Any, data: bytes | memoryview) -> None:
    """Send all of ``data``, waiting for credit as needed."""
    session = self.session
    if self._error is None and session._write_through(self._wire, data):
        # An idle tunnel's small write, as try_write sends it: not queued (the drain below
        # would not wait: what it may queue is one frame within the message size).
        self.bytes_out += len(data)
        return
    if self._error is None and 0 < len(data) <= session.conn.send_window(self.id):
        # The common small write: credit at hand, one frame, no waiting.
        session.conn.send_data(self.id, data)
        self.bytes_out += len(data)
        session._flush()
        if session.conn.outbox.pending_bytes > session.config.wire.max_message_size:
            await session._drained()
        return
    view = memoryview(data)
    while view:
        room = await self.writable()
        chunk = view[:room]
        session.conn.send_data(self.id, chunk)
        self.bytes_out += len(chunk)
        view = view[room:]
        session._flush()
    if session.conn.outbox.pending_bytes > session.config.wire.max_message_size:
        await session._drained()


def _as_f667209(session: Session, m: pytest.MonkeyPatch) -> None:
    """``session`` (and every tunnel stream, for the run) with f667209's write path."""
    for name, fn in (
        ("_write_through", _f66_write_through),
        ("_flush", _f66_flush),
        ("_flush_late", _f66_flush_late),
    ):
        m.setattr(session, name, MethodType(fn, session))
    # (Connection has no send_through_on since the session after f667209: the oracle's own.)
    m.setattr(
        session.conn,
        "send_through_on",
        MethodType(_f66_send_through_on, session.conn),
        raising=False,
    )
    m.setattr(TunnelStream, "try_write", _f66_try_write)
    m.setattr(TunnelStream, "write", _f66_write)


# -- the runs ----------------------------------------------------------------------------------


class _Probe:
    """The readiness probe scripted: ``poll(0, 1)`` says more input waits while :attr:`more`,
    raises ValueError once :attr:`closed` (as a closed epoll does)."""

    __slots__ = ("closed", "more", "polls", "seen", "soon")

    def __init__(self) -> None:
        self.more = False
        self.closed = False
        self.polls = 0
        self.seen = False
        self.soon: set[object] = set()

    def poll(self, timeout: float, n: int) -> list[tuple[int, int]]:
        if self.closed:
            raise ValueError("closed")
        self.polls += 1
        return [(3, 1)] if self.more else []


def _payload(n: int, salt: int) -> bytes | memoryview:
    data = bytes((i * 7 + salt) % 251 for i in range(min(n, 251))) * (n // 251 + 1)
    return data[:n] if salt % 5 else memoryview(data)[:n]


_TIGHT = MIN_FRAME_SIZE + HEADER_SIZE + 600
"""A message of one full frame and a little more: what is queued meets the message bound."""


class _Driven:
    """A ``write`` coroutine run in the caller's turn as far as it goes without waiting, then
    by a task (as an awaiting caller's task would go on)."""

    def __init__(self, coro: Any) -> None:
        self.coro = coro
        self.task: asyncio.Task[None] | None = None
        self.outcome: object = "pending"
        try:
            fut = coro.send(None)
        except StopIteration:
            self.outcome = "done"
        except StreamClosedError as exc:
            self.outcome = ("closed", exc.code)
        else:
            self.task = asyncio.get_running_loop().create_task(self._go_on(fut))

    async def _go_on(self, fut: Any) -> None:
        while True:
            try:
                await fut
            except BaseException as exc:
                step: Generator[Any, None, None] = self.coro
                try:
                    fut = step.throw(exc)
                except (StopIteration, StreamClosedError, asyncio.CancelledError):
                    return
                continue
            try:
                fut = self.coro.send(None)
            except StopIteration:
                self.outcome = "done later"
                return
            except StreamClosedError as exc:
                self.outcome = ("closed later", exc.code)
                return


async def _run(ops: list[Op], configs: tuple[WireConfig, WireConfig], oracle: bool) -> Any:
    async def sink(stream: TunnelStream) -> None:  # accepts, never reads: no credit back
        stream.accept()
        with contextlib.suppress(StreamClosedError):
            await asyncio.sleep(3600)

    cloud_config = SessionConfig(wire=configs[0])
    edge_config = SessionConfig(wire=configs[1])
    trace: list[Any] = []
    driven: list[_Driven] = []
    with pytest.MonkeyPatch.context() as m:
        async with tunnel(on_open=sink, cloud_config=cloud_config, edge_config=edge_config) as t:
            cloud: Session = t.cloud
            streams = [await asyncio.wait_for(cloud.open_stream(TARGET), WAIT) for _ in range(3)]
            await settle(cloud)
            if oracle:
                _as_f667209(cloud, m)
            probe = _Probe()
            cloud._probe = probe  # type: ignore[assignment]
            writes = record(cloud)
            conn = cloud.conn
            paused = False
            pinged = False  # a PING queued by no flushing call, still queued: it may stay
            token = object()
            for op in ops:
                result: object = None
                match op:
                    case ("try", s, n, salt):
                        try:
                            result = streams[s].try_write(_payload(n, salt))
                        except StreamClosedError as exc:
                            result = ("closed", exc.code)
                    case ("write", s, n, salt):
                        d = _Driven(streams[s].write(_payload(n, salt)))
                        driven.append(d)
                        result = d.outcome
                    case ("ping",):
                        conn._emit(Ping(b"review27"))  # queued, not flushed
                        pinged = True
                    case ("reset", s):
                        streams[s].reset()
                    case ("eof", s):
                        streams[s].write_eof()
                    case ("more", flag):
                        probe.more = flag
                    case ("soon", flag):
                        if flag:
                            probe.soon.add(token)
                        else:
                            probe.soon.discard(token)
                    case ("pause",):
                        if not paused:
                            t.cloud_ws.pause_writing()
                            paused = True
                    case ("resume",):
                        if paused:
                            t.cloud_ws.resume_writing()
                            paused = False
                    case ("turn",):
                        await asyncio.sleep(0)
                        # Nothing left late: what waited for the turn's end is written (or the
                        # writer's, woken), and the turn's "more" ended with it.
                        if not paused and not cloud._wake:
                            left = conn.outbox.pending_bytes
                            if pinged:  # (the PING and what may not overtake it may stay)
                                left -= conn.outbox.control_bytes
                            assert left == 0, ("late", op)
                        assert not probe.seen or cloud._late
                if not conn.outbox.pending_bytes:
                    pinged = False
                trace.append(
                    (
                        op,
                        result,
                        list(writes.writes),
                        conn.outbox.pending_bytes,
                        conn._conn_send.available,
                        [conn.send_window(s.id) for s in streams],
                        [s.bytes_out for s in streams],
                        cloud._wake,
                        cloud._late,
                        probe.seen,
                        cloud._wake_writer is None,
                    )
                )
            # The end: the tunnel resumed, no more input, two turns.
            probe.more = False
            probe.soon.clear()
            if paused:
                t.cloud_ws.resume_writing()
            for _ in range(3):
                await asyncio.sleep(0)
            trace.append(("end", list(writes.writes), [d.outcome for d in driven]))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):  # the writer's, if it was woken
                    while conn.outbox.pending_bytes and not cloud.closed:
                        await asyncio.sleep(0.005)
            trace.append(
                (
                    "drained",
                    list(writes.writes),
                    conn.outbox.pending_bytes,
                    [d.outcome for d in driven],
                )
            )
            # What went out is tunnel frames the peer took: none made it fail.
            for message in ws_messages(b"".join(writes.writes)):
                decode_message(message, 1 << 24)
            trace.append(("edge", t.edge.closed, cloud.closed))
            for d in driven:
                if d.task is not None:
                    d.task.cancel()
            for s in streams:
                s.close()
    return trace


_stream = st.integers(0, 2)
_size = st.one_of(
    st.integers(1, 64),
    st.sampled_from(
        [_F66_THROUGH - 1, _F66_THROUGH, _F66_THROUGH + 1, 300, 590, 600, 601, 700, 1000, 5000]
    ),
)
_write = st.tuples(st.sampled_from(["try", "try", "write"]), _stream, _size, st.integers(0, 9))
_op = st.one_of(
    _write,
    _write,
    _write,
    _write,
    st.tuples(st.just("more"), st.sampled_from([True, True, False])),
    st.tuples(st.just("ping")),
    st.tuples(st.just("turn")),
    st.tuples(st.just("reset"), _stream),
    st.tuples(st.just("eof"), _stream),
    st.tuples(st.just("soon"), st.booleans()),
    st.tuples(st.just("pause")),
    st.tuples(st.just("resume")),
)
_window = st.sampled_from([(700, 700, 2100), (700, 700, 1000), (4000, 4000, 9000), (None,) * 3])
_message = st.sampled_from(["tight", "default"])


def _configs(window: tuple[int | None, ...], message: str) -> tuple[WireConfig, WireConfig]:
    cloud = WireConfig(max_frame_size=MIN_FRAME_SIZE, max_message_size=_TIGHT)
    if message == "default":
        cloud = WireConfig()
    edge = WireConfig()
    if window[0] is not None:
        edge = dataclasses.replace(
            edge,
            initial_stream_window=window[0],
            max_stream_window=window[1],
            connection_window=window[2],
        )
    return cloud, edge


def _both(ops: list[Op], window: tuple[int | None, ...], message: str) -> None:
    configs = _configs(window, message)
    new = asyncio.run(_run(ops, configs, oracle=False))
    old = asyncio.run(_run(ops, configs, oracle=True))
    for i, (a, b) in enumerate(zip(new, old, strict=True)):
        assert a == b, (i, a[0] if a else a)


_BURST = [("more", True), ("try", 0, 9, 1), ("try", 1, 9, 2), ("try", 2, 9, 3), ("turn",)]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_op, min_size=1, max_size=16), _window, _message)
# A burst of three streams' small writes: the later two queued behind the first.
@example(_BURST, (None, None, None), "default")
# Behind a PING; a stream reset mid-burst; the tunnel paused then resumed mid-burst.
@example([("ping",), *_BURST[1:]], (None, None, None), "tight")
@example([*_BURST[:2], ("reset", 1), *_BURST[2:]], (700, 700, 1000), "tight")
@example([*_BURST[:2], ("pause",), *_BURST[2:3], ("resume",), *_BURST[3:]], (None,) * 3, "tight")
# The message bound: what is queued and the write meet it, one byte over, exactly at it.
@example(
    [("more", True), ("try", 0, 600, 1), ("try", 1, _F66_THROUGH - 24, 2), ("turn",)],
    (None,) * 3,
    "tight",
)
@example(
    [
        ("more", True),
        ("try", 0, 600, 1),
        ("try", 1, 600, 2),
        ("try", 2, _F66_THROUGH, 3),
        ("turn",),
    ],
    (None,) * 3,
    "tight",
)
@example(
    [
        ("more", True),
        ("try", 0, 600, 1),
        ("try", 1, 600, 2),
        ("write", 2, _F66_THROUGH, 3),
        ("turn",),
    ],
    (None,) * 3,
    "tight",
)
@example(
    [("more", True), ("try", 0, 600, 1), ("try", 1, 5000, 2), ("write", 2, 5000, 3), ("turn",)],
    (4000, 4000, 9000),
    "tight",
)
# The windows: a write that fits the stream's but not the connection's.
@example(
    [("more", True), ("try", 0, 600, 1), ("write", 1, 600, 2), ("try", 2, 600, 3), ("turn",)],
    (700, 700, 1000),
    "default",
)
# A TLS read due (soon) instead of a poll, then the probe closed.
@example([("soon", True), ("try", 0, 9, 1), ("write", 1, 9, 2), ("turn",)], (None,) * 3, "tight")
def test_bursts_as_f667209(ops: list[Op], window: tuple[int | None, ...], message: str) -> None:
    _both(ops, window, message)


_small = st.one_of(st.integers(1, 64), st.sampled_from([300, 590, 600, 601, _F66_THROUGH]))
_in_burst = st.one_of(
    st.tuples(st.sampled_from(["try", "try", "write"]), _stream, _small, st.integers(1, 4)),
    st.tuples(st.sampled_from(["try", "try", "write"]), _stream, _small, st.integers(1, 4)),
    st.tuples(st.sampled_from(["try", "try", "write"]), _stream, _small, st.integers(1, 4)),
    st.tuples(st.just("ping")),
    st.tuples(st.sampled_from(["reset", "eof"]), _stream),
    st.tuples(st.sampled_from(["pause", "resume"])),
    st.tuples(st.just("more"), st.booleans()),
)


@st.composite
def _bursts(draw: st.DrawFn) -> list[Op]:
    """Loop turns in which more input waits (or a TLS read is due): several streams' small
    writes (bytes), with control frames, resets, ends, pauses among them, each turn ended."""
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, 4))):
        ops.append(draw(st.sampled_from([("more", True), ("more", True), ("soon", True)])))
        ops += draw(st.lists(_in_burst, min_size=1, max_size=8))
        ops += [("more", False), ("soon", False), ("turn",)]
    return ops


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bursts(), _window, _message)
def test_turns_of_bursts_as_f667209(
    ops: list[Op], window: tuple[int | None, ...], message: str
) -> None:
    _both(ops, window, message)


def test_a_burst_is_one_write_at_the_turns_end_in_order() -> None:
    """Not only alike, what it is for: three streams' small writes in a turn where more input
    waits go out in one write at the turn's end, in the order they were made."""
    trace = asyncio.run(_run(_BURST, _configs((None,) * 3, "default"), oracle=False))
    before, after = trace[3][2], trace[4][2]  # the writes after the last try_write, the turn
    assert before == [] and len(after) == 1
    sent = after[0]
    assert [sent.index(_payload(9, k)) for k in (1, 2, 3)] == sorted(  # type: ignore[arg-type]
        sent.index(_payload(9, k))  # type: ignore[arg-type]
        for k in (1, 2, 3)
    )
