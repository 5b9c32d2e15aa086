"""Random traffic between two connections, with messages in flight both ways at once."""

from __future__ import annotations

from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ravenproxy.wire import events as ev
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.config import KIB, WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.streams import State

from .harness import TARGET, Pair

# Small windows so that credit runs out and comes back often.
CONFIG = WireConfig(
    max_frame_size=16 * KIB,
    max_concurrent_streams=6,
    initial_stream_window=2 * KIB,
    max_stream_window=8 * KIB,
    connection_window=64 * KIB,
)
SIDES = ("server", "agent")
COMPLEMENT = {
    State.OPENING_LOCAL: State.OPENING_REMOTE,
    State.OPENING_REMOTE: State.OPENING_LOCAL,
    State.OPEN: State.OPEN,
    State.HALF_CLOSED_LOCAL: State.HALF_CLOSED_REMOTE,
    State.HALF_CLOSED_REMOTE: State.HALF_CLOSED_LOCAL,
}
sides = st.sampled_from(SIDES)
fractions = st.one_of(st.just(1.0), st.floats(0, 1))


def pattern(sid: int, start: int, n: int) -> bytes:
    """Deterministic bytes for offset ``start`` of stream ``sid``, so reordering shows."""
    return bytes((sid * 31 + i) % 251 for i in range(start, start + n))


class TwoPeers(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.pair = Pair(CONFIG, CONFIG)
        self.conns = {"server": self.pair.server, "agent": self.pair.agent}
        self.wire: dict[str, deque[bytes]] = {side: deque() for side in SIDES}
        self.sent: dict[tuple[str, int], bytearray] = {}
        self.received: dict[tuple[str, int], bytearray] = {}
        self.unconsumed: dict[tuple[str, int], int] = {}
        self.requested: dict[str, list[int]] = {side: [] for side in SIDES}
        self.reset: set[int] = set()
        self.largest_window = 0
        self.steps = 0
        # Start with a few accepted streams each way so that data flows from the first step.
        for side in SIDES:
            for _ in range(2):
                self.open(side)
        self.quiesce()
        for side in SIDES:
            for sid in self.requested[side]:
                self.conns[side].accept_stream(sid)
                self.sent[(side, sid)] = bytearray()
        self.quiesce()

    # -- helpers -----------------------------------------------------------------------------

    def side_of(self, conn: Connection) -> str:
        return "server" if conn is self.pair.server else "agent"

    def other(self, side: str) -> str:
        return "agent" if side == "server" else "server"

    def handle(self, side: str, event: ev.Event) -> None:
        match event:
            case ev.StreamOpenRequested(sid, target):
                assert target == TARGET
                self.requested[side].append(sid)
            case ev.DataReceived(sid, data):
                got = self.received.setdefault((side, sid), bytearray())
                got += data
                sent = self.sent[(self.other(side), sid)]
                assert got == sent[: len(got)], f"stream {sid}: bytes out of order or corrupt"
                key = (side, sid)
                self.unconsumed[key] = self.unconsumed.get(key, 0) + len(data)
            case ev.StreamReset(sid, _, _):
                self.reset.add(sid)
            case ev.StreamRejected(sid, code, _):
                assert code is not ErrorCode.OK
            case ev.StreamAccepted() | ev.StreamEnded() | ev.WindowUpdated() | ev.PingAcked():
                pass
            case ev.GoAwayReceived():
                pass
            case _:
                raise AssertionError(f"unexpected event {event!r}")

    def flush_side(self, side: str) -> None:
        self.wire[side].extend(self.conns[side].data_to_send())

    def deliver_one(self, side: str) -> None:
        """Hand the oldest message ``side`` sent to its peer."""
        message = self.wire[side].popleft()
        dst = self.other(side)
        for event in self.conns[dst].receive_message(message):
            self.handle(dst, event)

    def quiesce(self) -> None:
        for _ in range(10_000):
            for side in SIDES:
                self.flush_side(side)
            if not (self.wire["server"] or self.wire["agent"]):
                return
            for side in SIDES:
                while self.wire[side]:
                    self.deliver_one(side)
        raise AssertionError("did not quiesce")

    def live(self, side: str) -> list[int]:
        return sorted(self.conns[side].streams)

    # -- rules -------------------------------------------------------------------------------

    @rule(side=sides)
    def open(self, side: str) -> None:
        conn = self.conns[side]
        if conn.goaway_sent or conn.goaway_received or conn._local_open >= conn.peer_max_streams:
            return
        sid = conn.open_stream(TARGET)
        self.sent[(side, sid)] = bytearray()

    @rule(side=sides, data=st.data())
    def answer(self, side: str, data: st.DataObject) -> None:
        conn = self.conns[side]
        pending = [
            s
            for s in self.requested[side]
            if s in conn.streams and conn.streams[s].state is State.OPENING_REMOTE
        ]
        if not pending:
            return
        sid = data.draw(st.sampled_from(pending))
        code = data.draw(st.sampled_from([ErrorCode.OK, ErrorCode.OK, ErrorCode.REFUSED]))
        if code is ErrorCode.OK:
            conn.accept_stream(sid)
            self.sent[(side, sid)] = bytearray()
        else:
            conn.reject_stream(sid, code, "no")

    @rule(side=sides, data=st.data(), fraction=fractions, fin=st.sampled_from([False] * 5 + [True]))
    def send(self, side: str, data: st.DataObject, fraction: float, fin: bool) -> None:
        conn = self.conns[side]
        ready = [sid for sid, s in conn.streams.items() if s.can_send]
        if not ready:
            return
        sid = data.draw(st.sampled_from(sorted(ready)))
        n = int(conn.send_window(sid) * fraction)
        payload = pattern(sid, len(self.sent[(side, sid)]), n)
        conn.send_data(sid, payload, fin=fin)
        self.sent[(side, sid)] += payload

    @rule(data=st.data(), fraction=fractions)
    def consume(self, data: st.DataObject, fraction: float) -> None:
        waiting = sorted(key for key, n in self.unconsumed.items() if n)
        if not waiting:
            return
        side, sid = key = data.draw(st.sampled_from(waiting))
        n = max(1, int(self.unconsumed[key] * fraction))
        self.conns[side].consumed(sid, n)
        self.unconsumed[key] -= n

    @rule(side=sides)
    def consume_everything(self, side: str) -> None:
        """A fast application: every buffered byte of this side is written out."""
        for (s, sid), n in sorted(self.unconsumed.items()):
            if s == side and n:
                self.conns[side].consumed(sid, n)
                self.unconsumed[(s, sid)] = 0

    @rule(side=sides, data=st.data(), code=st.sampled_from(ErrorCode))
    def reset_stream(self, side: str, data: st.DataObject, code: ErrorCode) -> None:
        live = self.live(side)
        if not live or data.draw(st.integers(1, 4)) != 3:  # rarer than the other rules
            return
        sid = data.draw(st.sampled_from(live))
        self.reset.add(sid)
        self.conns[side].reset_stream(sid, code)

    @rule(side=sides)
    def flush(self, side: str) -> None:
        self.flush_side(side)

    @rule(side=sides, count=st.integers(1, 3), flush_first=st.booleans())
    def deliver(self, side: str, count: int, flush_first: bool) -> None:
        if flush_first:
            self.flush_side(side)
        for _ in range(min(count, len(self.wire[side]))):
            self.deliver_one(side)

    @rule(dt=st.sampled_from([0.0, 0.001, 0.03, 1.0]))
    def tick(self, dt: float) -> None:
        self.pair.clock.advance(dt)

    @rule(side=sides)
    def ping(self, side: str) -> None:
        self.conns[side].ping()

    @precondition(lambda self: self.steps > 50 and not self.pair.server.goaway_sent)
    @rule()
    def goaway(self) -> None:
        # Late in a run only: once one side drains, no new streams are opened.
        self.pair.server.goaway(ErrorCode.OK, "drain")

    @rule()
    def settle(self) -> None:
        self.quiesce()
        self.check_quiescent()

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def windows_hold(self) -> None:
        if not hasattr(self, "pair"):
            return
        self.steps += 1
        for side in SIDES:
            conn = self.conns[side]
            for sid, stream in conn.streams.items():
                recv = stream.recv
                assert 0 <= recv.buffered <= recv.size <= CONFIG.max_stream_window
                self.largest_window = max(self.largest_window, recv.size)
                if stream.state in (State.OPEN, State.HALF_CLOSED_LOCAL):
                    assert recv.buffered == self.unconsumed.get((side, sid), 0)
            assert conn._conn_recv.buffered == sum(
                n for (s, _), n in self.unconsumed.items() if s == side
            )
            assert conn._conn_recv.buffered <= CONFIG.connection_window

    def check_quiescent(self) -> None:
        server, agent = self.pair.server, self.pair.agent
        assert server.streams.keys() == agent.streams.keys()
        for sid, stream in server.streams.items():
            assert COMPLEMENT[stream.state] is agent.streams[sid].state
        for (side, sid), sent in self.sent.items():
            got = self.received.get((self.other(side), sid), bytearray())
            if sid in self.reset:
                assert got == sent[: len(got)]
            else:
                assert got == sent, f"stream {sid} from {side}: {len(got)} of {len(sent)} bytes"

    def teardown(self) -> None:
        if hasattr(self, "pair"):
            self.quiesce()
            self.check_quiescent()


TwoPeers.TestCase.settings = settings(max_examples=100, stateful_step_count=100, deadline=None)
test_two_peers = TwoPeers.TestCase
