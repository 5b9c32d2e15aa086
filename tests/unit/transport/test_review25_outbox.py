"""Review of splice3's one-message batch in :meth:`Outbox.take_pieces`, on whole connections.

Two :class:`Connection` pairs take the same generated traffic (streams opened, small, large,
memoryview and window-cut DATA, FINs, resets, pings, both directions, the receiver returning
credit as it consumes): one as the branch queues it, one whose two outboxes are ebcf73b's
(``_Ebcf73bOutbox``, verbatim but for its name, kept in test_splice3_outbox.py). Every message
is the same bytes, every event on the other side the same. And of the branch's: no message over
``max_message_size``, no DATA frame over the peer's frame size, a bulk DATA frame
(``OWN_MESSAGE``) alone in its message, frames of a stream in the order sent (after control
frames), each byte's credit counted once: a window is what it was granted, less what was sent,
plus the WINDOW_UPDATEs received.

Breaks this catches (each tried by hand on splice3's fast path): without
``pending_bytes <= limit`` (a 48 048-byte message where the limit is 40 000), without
``not self._control`` (control frames lost), ``<= 2 * OWN_MESSAGE`` (a bulk frame joined),
``pending_bytes`` not zeroed after it, the frames joined in reverse order.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ravenproxy.wire.connection as connection_module
from ravenproxy.wire import events as ev
from ravenproxy.wire import outbox as branch_outbox
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.frames import Data, WindowUpdate, decode_message
from tests.unit.wire.harness import TARGET, Pair
from tests.unit.wire.test_splice3_outbox import _Ebcf73bOutbox  # ebcf73b's, verbatim

OWN_MESSAGE = 64 * 1024
"""ebcf73b's outbox's bound."""


def _old_pair(config: WireConfig) -> Pair:
    """A pair whose two connections queue into ebcf73b's outbox (their SETTINGS moved over)."""
    pair = Pair(config, config, settle=False)
    for conn in (pair.server, pair.agent):
        new, old = conn.outbox, _Ebcf73bOutbox(config.max_message_size)
        old._control = [bytearray(c) for c in new._control]
        old._ordered = list(new._ordered)
        old.pending_bytes, old.control_bytes = new.pending_bytes, new.control_bytes
        conn.outbox = old  # type: ignore[assignment]
    pair.pump()
    return pair


def _can_send(conn: Connection, sid: int) -> bool:
    stream = conn.streams.get(sid)
    return stream is not None and stream.can_send


def _payload(sid: int, n: int, seq: int) -> bytes:
    return bytes((sid * 31 + seq * 7 + i) & 0xFF for i in range(min(n, 251))) * (n // 251) + bytes(
        (sid * 31 + seq * 7 + i) & 0xFF for i in range(n % 251)
    )


Op = tuple[Any, ...]
_SIZES = st.one_of(
    st.integers(0, 300),
    st.integers(300, 20_000),
    st.sampled_from([16_384, 16_396, 65_535, 65_536, 65_537, 70_000, 200_000]),
)
_SEND = st.tuples(
    st.just("send"),
    st.booleans(),  # from the agent
    st.integers(0, 4),
    _SIZES,
    st.sampled_from(["upto", "data", "view", "fin", "limit"]),
)
_SMALL_SEND = st.tuples(
    st.just("send"), st.booleans(), st.integers(0, 4), st.integers(1, 9_000), st.just("upto")
)
_OPS = st.one_of(
    st.tuples(st.just("open")),
    _SEND,
    _SMALL_SEND,
    # a burst: the side's queue flushed, then a few small frames, then flushed (no control
    # queued between: splice3's one message, or past a small limit the general loop's)
    st.tuples(st.just("burst"), st.booleans(), st.integers(2, 6), st.integers(1, 12_000)),
    st.tuples(st.just("reset"), st.booleans(), st.integers(0, 4)),
    st.tuples(st.just("ping"), st.booleans()),
    st.tuples(st.just("flush"), st.booleans()),
)
_CONFIGS = st.sampled_from(
    [
        WireConfig(),
        # a message limit under OWN_MESSAGE: the batch's own bound is the limit
        WireConfig(max_frame_size=16_384, max_message_size=16_396),
        WireConfig(max_frame_size=16_384, max_message_size=40_000),
        WireConfig(max_frame_size=65_536, max_message_size=65_548, initial_stream_window=65_536),
        WireConfig(max_frame_size=200_000, max_message_size=300_000),
    ]
)


class _Run:
    """One pair driven through the ops; ``record``: every message sent and event it caused."""

    def __init__(self, pair: Pair, check: bool) -> None:
        self.pair, self.check = pair, check
        self.sids: list[int] = []
        self.record: list[Any] = []
        self.seq = 0
        self.sent: dict[tuple[bool, int], bytearray] = {}
        self.got: dict[tuple[bool, int], bytearray] = {}
        self.updates: dict[tuple[bool, int], int] = {}
        """WINDOW_UPDATE increments each side received, by stream (0: the connection)."""
        self.data_sent: dict[tuple[bool, int], int] = {}
        self.resets: set[int] = set()

    def side(self, agent: bool) -> Connection:
        return self.pair.agent if agent else self.pair.server

    def apply(self, op: Op) -> None:
        kind = op[0]
        if kind == "open":
            if len(self.sids) < 5:
                self.sids.append(self.pair.server.open_stream(TARGET))
                self.flush(False)  # the agent accepts it (flush)
                self.flush(True)
                self.record.append(("opened", self.sids[-1]))
            return
        if kind == "ping":
            self.side(op[1]).ping()
            return
        if kind == "flush":
            self.flush(op[1])
            return
        if not self.sids:
            return
        if kind == "burst":
            agent, count, size = op[1], op[2], op[3]
            self.flush(agent)
            for i in range(count):
                self.apply(("send", agent, i, size - i, "upto"))
            self.flush(agent)
            return
        agent, sid = op[1], self.sids[op[2] % len(self.sids)]
        conn = self.side(agent)
        if kind == "reset":
            conn.reset_stream(sid, ErrorCode.CANCEL, "review25")
            self.resets.add(sid)
            return
        size, how = op[3], op[4]
        self.seq += 1
        data = _payload(sid, size, self.seq)
        room = conn.send_window(sid)
        if how == "upto":
            n = conn.send_upto(sid, data, 1 << 30)
        elif how == "limit":
            n = conn.send_upto(sid, data, size // 3)
        elif room >= size and (size or how == "fin") and _can_send(conn, sid):
            body: bytes | memoryview = memoryview(bytearray(data)) if how == "view" else data
            conn.send_data(sid, body, fin=how == "fin")
            n = size
        else:
            n = 0
        self.sent.setdefault((agent, sid), bytearray()).extend(data[:n])
        self.data_sent[(agent, sid)] = self.data_sent.get((agent, sid), 0) + n
        self.record.append(("sent", agent, sid, n))

    def flush(self, agent: bool) -> None:
        src = self.side(agent)
        dst = self.pair.peer(src)
        for message in src.data_to_send():
            self.record.append(("message", agent, bytes(message)))
            frames = decode_message(message, 1 << 24)
            if self.check:
                self._check_message(src, message, frames)
            for frame in frames:
                if type(frame) is WindowUpdate:
                    key = (not agent, frame.stream_id)
                    self.updates[key] = self.updates.get(key, 0) + frame.increment
            for event in dst.receive_message(message):
                if type(event) is ev.DataReceived:
                    data = bytes(event.data)
                    self.got.setdefault((agent, event.stream_id), bytearray()).extend(data)
                    self.record.append(("data", agent, event.stream_id, data))
                    dst.consumed(event.stream_id, len(data))
                elif type(event) is ev.StreamOpenRequested:
                    dst.accept_stream(event.stream_id)
                    self.record.append(("event", agent, event))
                elif type(event) is ev.PingAcked:
                    self.record.append(("pong", agent))
                else:
                    self.record.append(("event", agent, event))
        assert not src.pending_bytes and not src.control_pending

    def _check_message(self, src: Connection, message: bytes, frames: list[Any]) -> None:
        assert len(message) <= src.config.max_message_size
        datas = [f for f in frames if type(f) is Data]
        for frame in datas:
            assert len(frame.data) <= src.peer_max_frame_size
            if len(frame.data) >= branch_outbox.OWN_MESSAGE:
                assert len(frames) == 1, "a bulk DATA frame shares its message"

    def settle(self) -> None:
        for _ in range(200):
            if not (self.pair.server.pending_bytes or self.pair.agent.pending_bytes):
                return
            self.flush(False)
            self.flush(True)
        raise AssertionError("did not settle")


def _drive(pair: Pair, ops: list[Op], check: bool) -> _Run:
    run = _Run(pair, check)
    pings = iter(range(1, 10_000))
    real = connection_module.os.urandom
    connection_module.os.urandom = lambda n: next(pings).to_bytes(n, "big")  # type: ignore[assignment]
    try:
        for op in ops:
            run.apply(op)
        run.settle()
    finally:
        connection_module.os.urandom = real  # type: ignore[assignment]
    return run


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(_CONFIGS, st.lists(_OPS, max_size=30))
@example(
    WireConfig(max_frame_size=16_384, max_message_size=40_000),
    [("open",), ("open",)]
    + [("send", False, i, 12_000, "data") for i in range(4)]
    + [("flush", False), ("ping", False)]
    + [("send", False, i, 9_000, "upto") for i in range(2)]
    + [("flush", False)],
)
@example(
    WireConfig(),
    [
        ("open",),
        ("open",),
        ("send", False, 0, 100, "data"),
        ("send", False, 1, 65_536, "data"),
        ("send", True, 0, 3, "fin"),
        ("reset", False, 1),
        ("flush", True),
        ("flush", False),
    ],
)
def test_connections_send_what_ebcf73bs_outbox_sent(config: WireConfig, ops: list[Op]) -> None:
    new = _drive(Pair(config, config), ops, check=True)
    old = _drive(_old_pair(config), ops, check=False)
    assert new.record == old.record
    for side in (False, True):
        conn, old_conn = new.side(side), old.side(side)
        assert conn._conn_send.available == old_conn._conn_send.available
        for sid in new.sids:
            stream, old_stream = conn.streams.get(sid), old_conn.streams.get(sid)
            assert (stream is None) == (old_stream is None)
            if stream is not None and old_stream is not None:
                assert stream.send.available == old_stream.send.available
    # Each byte arrived once, in order (a reset stream: a first part); its credit counted once.
    for key, data in new.sent.items():
        got = new.got.get(key, bytearray())
        assert got == data if key[1] not in new.resets else data.startswith(got)
    for agent in (False, True):
        conn, peer = new.side(agent), new.side(not agent)
        sent_total = sum(n for (a, _), n in new.data_sent.items() if a == agent)
        granted = peer.config.connection_window
        assert conn._conn_send.available == granted - sent_total + new.updates.get((agent, 0), 0)
        for sid in new.sids:
            stream = conn.streams.get(sid)
            if stream is None:
                continue
            window = peer.config.initial_stream_window
            expect = window - new.data_sent.get((agent, sid), 0) + new.updates.get((agent, sid), 0)
            assert stream.send.available == expect


def test_the_old_outbox_is_used() -> None:
    pair = _old_pair(WireConfig())
    assert type(pair.server.outbox) is _Ebcf73bOutbox
    assert type(pair.agent.outbox) is _Ebcf73bOutbox
