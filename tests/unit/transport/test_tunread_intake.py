"""tunread: a DATA message's chunks reach their streams in one place, the session's intake
(``Intake._on_messages``), whichever way the wire took the message (one frame, several, or the
general path's ``DataReceived``, also for a message read through ``websockets``:
``Intake._received``); ``TunnelStream._feed`` (offer the chunk, return its credit, else hold it)
became ``TunnelStream._hold`` (hold it), and ``Session._dispatch`` lost its ``DataReceived``
case. A Python call less a chunk (a request on both ends). bd24f07's four methods are kept below
verbatim (but for their names, and ``_dispatch``'s module names as this module imports them) as
the oracle.

Differentially, on real sessions over a loopback WebSocket (plain TCP, and mTLS through the
tunnel's own TLS transport): the same generated traffic goes once through bd24f07's methods and
once through today's: chunks the cloud side writes one a message, several a message (a burst:
``receive_batch``), with its end or a PING in the same message (the general path), and as
messages handed to ``_received`` (the websockets path); bytes the dialled socket delivers; the
cloud side reading or not; the socket's write buffer passing its high mark (chunks refused and
held) and draining; a socket write that fails (the take resets the stream); the socket lost,
its EOF; the cloud's end and reset. After each step the
socket was written the same chunks, the cloud side read the same bytes, and the splice, the
streams and both connections' credit windows are in the same state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.log import kv
from ravenproxy.transport.intake import YIELD_EVERY, Intake, log
from ravenproxy.transport.session import Session, StreamClosedError, TunnelStream
from ravenproxy.transport.splice import Splice
from ravenproxy.transport.tunnel_stream import OpenError, _wake
from ravenproxy.wire import events as ev
from ravenproxy.wire.errors import ProtocolError
from tests.helpers import examples
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import settle
from tests.unit.transport.test_splice3_sink import _Transport
from tests.unit.transport.test_websocket import contexts, pki  # noqa: F401 (a fixture)


# -- bd24f07, verbatim but for the names ------------------------------------------------------
def _bd24f07_on_messages(self: Any, batch: list[bytes | memoryview]) -> None:
    """One read round's messages, from the transport's read callback. Raising ends the
    delivery: the reader raises it (ProtocolError: the tunnel is closed with its code)."""
    conn = self.conn
    if self._held is not None:  # paused: behind what is held back
        self._held += batch
        return
    # conn.should_read, written out (a property: two calls a request).
    outbox, cap, streams = conn.outbox, conn.config.max_control_pending, self.streams
    # What the round queues (several streams' frames, credit) is written at its end, in
    # one write, not by the first flush it makes (Session._flush writes through).
    self._deferred = True
    at = -1  # the message's index, counted by hand: no enumerate made per read round
    try:
        for message in batch:
            at += 1
            if outbox.control_bytes > cap:
                self._pause(batch[at:])
                break
            # The usual message, one DATA frame (several under load), by the wire's fast
            # path: no event to match.
            got = conn.receive_data(message)
            if got is not None:  # its one chunk fed as is: no tuple of it to loop over
                sid, data = got
                stream = streams.get(sid)
                if stream is not None:
                    stream._feed(data)
                else:  # as _dispatch: a stream this side already let go of
                    conn.consumed(sid, len(data))
                continue
            taken = conn.receive_batch(message)
            if taken is None:
                for event in conn.receive_message(message):
                    self._dispatch(event)
                continue
            for sid, data in taken:
                stream = streams.get(sid)
                if stream is not None:
                    stream._feed(data)
                else:  # as _dispatch: a stream this side already let go of
                    conn.consumed(sid, len(data))
    finally:
        self._deferred = False
    # Answers the messages asked for (PING acks above all) go out now, not with whatever
    # flushes next: protocol sections 4.7 and 11. (Mostly nothing is queued: no call.)
    if outbox.pending_bytes:
        self._flush()
    if self._held is None and outbox.control_bytes > cap:
        self._pause([])


async def _bd24f07_received(self: Any, message: str | bytes | memoryview) -> None:
    if isinstance(message, str):
        raise ProtocolError("text message on the tunnel")
    if not self.conn.should_read:  # e.g. a keepalive PING queued while we yielded
        await self._paused()
    for event in self.conn.receive_message(message):
        self._dispatch(event)
    # Answers the message asked for (PING acks above all) go out now, not with
    # whatever flushes next: protocol sections 4.7 and 11.
    self._flush()
    if not self.conn.should_read:
        await self._paused()
    # A peer that sends faster than we process must not starve other tunnels and fronts:
    # yield after YIELD_EVERY of work without one (not per message: small ones would pay).
    if time.monotonic() - self._yielded >= YIELD_EVERY:
        await asyncio.sleep(0)
        self._yielded = time.monotonic()


def _bd24f07_feed(self: Any, data: bytes | memoryview) -> None:
    take = self._on_chunk
    if take is not None and not self._chunks and take(data):
        # Taken as it came (a chunk a request, on the agent): read, as read_nowait counts
        # it, without holding it for a callback to read back.
        n = len(data)
        self.bytes_in += n
        session = self.session
        conn = session.conn
        if not conn.closed and conn.consumed_on(self._wire, n):
            session._flush()
        return
    if self._chunks is None:
        self._chunks = collections.deque()
    self._chunks.append(data)
    # _wake_readers, written out: a chunk a request, on both ends, in the read callback.
    waiters = self._read_waiters
    if waiters is not None:
        self._read_waiters = None
        _wake(waiters)
    callback = self._on_readable
    if callback is not None:
        callback()


def _bd24f07_dispatch(self: Any, event: ev.Event) -> None:
    match event:
        case ev.DataReceived(sid, data):
            stream = self.streams.get(sid)
            if stream is None:
                self.conn.consumed(sid, len(data))
                self._flush()
            else:
                stream._feed(data)
        case ev.WindowUpdated(sid):
            if sid == 0:
                waiters, self._window_waiters = self._window_waiters, set()
                for stream in waiters:
                    stream._wake_writer()
            else:
                stream = self.streams.get(sid)
                if stream is not None:
                    self._window_waiters.discard(stream)
                    stream._wake_writer()
        case ev.StreamEnded(sid):
            stream = self.streams.get(sid)
            if stream is not None:
                stream._feed_eof()
        case ev.StreamOpenRequested(sid, target):
            self._serve(TunnelStream(self, sid, target))
        case ev.StreamAccepted(sid):
            stream = self.streams.get(sid)
            if stream is not None:
                stream._accepted()
        case ev.StreamRejected(sid, code, message):
            stream = self.streams.get(sid)
            if stream is not None:
                stream._fail(OpenError(code, message))
        case ev.StreamReset(sid, code, message):
            stream = self.streams.get(sid)
            if stream is not None:
                stream._fail(StreamClosedError(code, message or "reset by peer"))
                self._forget(sid)
        case ev.SettingsReceived():
            self._ready.set()
        case ev.GoAwayReceived(last, code, reason):
            log.info(
                "peer is draining",
                extra=kv(**self.fields, code=code.name, reason=reason, last_stream=last),
            )
        case ev.PingAcked():
            pass


# -- the traffic --------------------------------------------------------------------------------
Op = tuple[Any, ...]
_DOWN = ["downburst", "downfin", "downping", "ws", "wsburst", "wsfin"]
_OPS = st.one_of(
    st.tuples(st.just("down"), st.binary(min_size=1, max_size=3000)),
    st.tuples(st.just("down"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("up"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("up"), st.binary(min_size=1, max_size=20_000)),
    st.tuples(st.sampled_from(_DOWN), st.binary(min_size=1, max_size=300)),
    st.tuples(st.sampled_from(["read", "drain", "fail", "eof", "reset", "lost", "upeof", "burst"])),
)


def _state(splice: Splice) -> tuple[Any, ...]:
    return (
        splice.result.bytes_down,
        splice.result.bytes_up,
        splice.result.error,
        splice._over,
        splice._down_done,
        splice._write_paused,
        splice._lost,
        splice._up_done,
        splice._eof_sent,
        [bytes(p) for p in splice._pending],
        splice._sender is None,
    )


def _windows(t: Any, cloud: TunnelStream, edge: TunnelStream) -> tuple[Any, ...]:
    out: list[Any] = []
    for session, stream in ((t.cloud, cloud), (t.edge, edge)):
        conn = session.conn
        held = conn.streams.get(stream.id)
        out.append(
            (
                conn._conn_recv.available,
                conn._conn_recv.unacked,
                conn._conn_send.available,
                conn.outbox.pending_bytes,
                None if held is None else (held.state, held.recv.available, held.recv.unacked),
                None if held is None else held.send.available,
                stream.bytes_in,
                stream.bytes_out,
                stream.buffered,
                [bytes(c) for c in stream._chunks or ()],
                stream._eof,
                None if stream._error is None else str(stream._error),
                stream.id in session.streams,
            )
        )
    return tuple(out)


async def _through_websockets(t: Any, queue: Any) -> None:
    """What the cloud queued, taken from its connection and given to the edge's ``_received``,
    as a message read through ``websockets`` (after a handover) is."""
    queue()
    for message in t.cloud.conn.data_to_send():
        await t.edge._received(message)


async def _run(ops: list[Op], high: int, tls: tuple[Any, Any] | None) -> list[Any]:
    seen: list[Any] = []
    ready: asyncio.Future[tuple[Splice, TunnelStream, _Transport]] = (
        asyncio.get_running_loop().create_future()
    )

    async def on_open(stream: TunnelStream) -> None:
        stream.accept()
        splice, sock = Splice(), _Transport(high)
        sock.protocol = splice
        splice.connection_made(cast(Any, sock))  # as the agent's dial makes it: before start
        splice.start(stream)
        ready.set_result((splice, stream, sock))
        await asyncio.sleep(WAIT * 4)

    async with tunnel(on_open, tls=tls) as t:
        cloud = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        splice, edge, sock = await asyncio.wait_for(ready, WAIT)
        waiter = asyncio.create_task(splice.wait())
        ended = False
        got = bytearray()
        conn = t.cloud.conn
        for op in ops:
            kind = op[0]
            if kind == "down" and not ended:
                with contextlib.suppress(StreamClosedError):
                    await asyncio.wait_for(cloud.write(op[1]), 0.5)
            elif kind == "up" and not splice._lost and not splice._up_eof:
                splice.data_received(op[1])
            elif kind == "burst" and not splice._lost and not splice._up_eof:
                for piece in (b"a" * 30, b"b" * 7, b"c" * 900):  # one loop turn's reads
                    splice.data_received(piece)
            elif kind in ("downburst", "downfin", "downping"):
                # Queued in one loop turn (as a poll that said "more input" leaves them): one
                # message of several frames, DATA only (receive_batch on the edge), or with the
                # stream's end or a PING (the general path: DataReceived events).
                t.cloud._probe.seen = True
                with contextlib.suppress(StreamClosedError):
                    for piece in (op[1], b"e" * 30, b"f"):
                        cloud.try_write(piece)
                    if kind == "downfin" and not ended:
                        cloud.write_eof()
                        ended = True
                    elif kind == "downping":
                        conn.ping()
                        t.cloud._flush()  # (the stream may be reset: no write flushes it)
                        cloud.try_write(op[1][:7])
            elif kind in ("ws", "wsburst", "wsfin") and cloud.id in conn.streams:
                stream = conn.streams[cloud.id]
                if stream.can_send and len(op[1]) <= conn.send_window(cloud.id):

                    def queue(data: bytes = op[1], kind: str = kind) -> None:
                        conn.send_data(cloud.id, data)
                        if kind == "wsburst":
                            conn.send_data(cloud.id, data[:1])
                        elif kind == "wsfin":
                            conn.end_stream(cloud.id)

                    await _through_websockets(t, queue)
                    ended = ended or kind == "wsfin"
            elif kind == "read":
                with contextlib.suppress(StreamClosedError):
                    while chunk := cloud.read_nowait():
                        got += chunk
            elif kind == "eof" and not ended:
                cloud.write_eof()
                ended = True
            elif kind == "reset" and not ended:
                cloud.reset()
                ended = True
            elif kind == "drain":
                sock.drain()
            elif kind == "fail":
                sock.fail_next = True
            elif kind == "lost" and not splice._lost:
                splice.connection_lost(None)
            elif kind == "upeof" and not splice._lost:
                splice.eof_received()
            await settle(t.cloud)
            await settle(t.edge)
            await asyncio.sleep(0.003)
            seen.append(
                (
                    kind,
                    list(sock.written),
                    sock.eof,
                    sock.closing,
                    _state(splice),
                    bytes(got),
                    _windows(t, cloud, edge),
                )
            )
        if not ended:
            cloud.reset()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    return seen


@pytest.mark.parametrize("use_tls", [False, True], ids=["tcp", "mtls"])
@settings(max_examples=examples(1200), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_OPS, min_size=1, max_size=10), st.sampled_from([10, 2000, 1 << 20]))
@example([("down", b"a" * 50), ("up", b"x"), ("read",), ("down", b"b"), ("eof",)], 1 << 20)
@example([("down", b"a" * 50), ("down", b"b"), ("drain",), ("down", b"c"), ("eof",)], 10)
@example([("fail",), ("down", b"a"), ("up", b"b")], 1 << 20)
@example([("fail",), ("downburst", b"a"), ("read",)], 1 << 20)
@example([("burst",), ("up", b"q"), ("read",), ("reset",)], 1 << 20)
@example([("lost",), ("down", b"a"), ("up", b"b")], 1 << 20)
@example([("downburst", b"x"), ("drain",), ("downburst", b"y"), ("down", b"g")], 10)
@example([("downfin", b"x" * 200), ("read",)], 10)
@example([("downping", b"p" * 20), ("drain",), ("downping", b"q")], 10)
@example([("ws", b"w" * 100), ("wsburst", b"v" * 50), ("drain",), ("wsfin", b"u")], 10)
@example([("ws", b"w" * 100), ("wsburst", b"v" * 50), ("read",), ("wsfin", b"u")], 1 << 20)
@example([("fail",), ("ws", b"w"), ("ws", b"x")], 1 << 20)
@example([("upeof",), ("down", b"a"), ("read",), ("eof",)], 1 << 20)
def test_chunks_reach_streams_as_bd24f07s(
    pki: Path,  # noqa: F811 (the fixture)
    use_tls: bool,
    ops: list[Op],
    high: int,
) -> None:
    srv, cli = contexts(pki if use_tls else None)
    tls = (srv, cli) if srv and cli else None

    async def old() -> list[Any]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Intake, "_on_messages", _bd24f07_on_messages)
            mp.setattr(Intake, "_received", _bd24f07_received)
            mp.setattr(TunnelStream, "_feed", _bd24f07_feed, raising=False)
            mp.setattr(Session, "_dispatch", _bd24f07_dispatch)
            return await _run(ops, high, tls)

    async def both() -> tuple[list[Any], list[Any]]:
        return await old(), await _run(ops, high, tls)

    before, after = asyncio.run(both())
    assert after == before


def test_the_oracle_is_not_todays() -> None:
    """The patch above replaces today's methods (it would compare nothing otherwise), and the
    offer of a chunk lives in one place: no stream method offers one any more."""
    assert Intake._on_messages is not _bd24f07_on_messages
    assert Intake._received is not _bd24f07_received
    assert Session._dispatch is not _bd24f07_dispatch
    assert not hasattr(TunnelStream, "_feed")


class _Consumer:
    """A stream's consumer that takes or refuses each chunk offered as told (as the server's
    answer parser refuses a chunk it cannot take as it comes, then takes later ones), and
    reads what the stream held when told."""

    def __init__(self, stream: TunnelStream) -> None:
        self.stream = stream
        self.taking = True
        self.log: list[Any] = []
        stream.on_readable(self._readable, self._take)

    def _take(self, chunk: bytes | memoryview) -> bool:
        self.log.append(("offered", bytes(chunk), self.taking))
        return self.taking

    def _readable(self) -> None:
        self.log.append(("readable", self.stream.buffered))

    def read(self) -> None:
        with contextlib.suppress(StreamClosedError):
            while chunk := self.stream.read_nowait():
                self.log.append(("read", bytes(chunk)))


_CONSUMER_OPS = st.one_of(
    st.tuples(st.sampled_from(["down", "downburst", "ws", "wsburst"]), st.binary(max_size=60)),
    st.tuples(st.sampled_from(["take", "refuse", "read", "readcloud", "eof", "reset"])),
)


async def _consume(ops: list[Op]) -> list[Any]:
    seen: list[Any] = []
    ready: asyncio.Future[_Consumer] = asyncio.get_running_loop().create_future()

    async def on_open(stream: TunnelStream) -> None:
        stream.accept()
        ready.set_result(_Consumer(stream))
        await asyncio.sleep(WAIT * 4)

    async with tunnel(on_open) as t:
        cloud = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        consumer = await asyncio.wait_for(ready, WAIT)
        conn, ended = t.cloud.conn, False
        for op in ops:
            kind = op[0]
            data = op[1] or b"-" if len(op) > 1 else b""
            if kind == "down" and not ended:
                with contextlib.suppress(StreamClosedError):
                    await asyncio.wait_for(cloud.write(data), 0.5)
            elif kind == "downburst" and not ended:
                t.cloud._probe.seen = True  # one message of several DATA frames
                with contextlib.suppress(StreamClosedError):
                    for piece in (data, b"e" * 3, data[:2] or b"f"):
                        cloud.try_write(piece)
            elif kind in ("ws", "wsburst") and not ended and cloud.id in conn.streams:
                if conn.streams[cloud.id].can_send and 2 * len(data) <= conn.send_window(cloud.id):

                    def queue(data: bytes = data, kind: str = kind) -> None:
                        conn.send_data(cloud.id, data)
                        if kind == "wsburst":
                            conn.send_data(cloud.id, data[:1])

                    await _through_websockets(t, queue)
            elif kind == "take":
                consumer.taking = True
            elif kind == "refuse":
                consumer.taking = False
            elif kind == "read":
                consumer.read()
            elif kind == "readcloud":
                with contextlib.suppress(StreamClosedError):
                    while cloud.read_nowait():
                        pass
            elif kind == "eof" and not ended:
                cloud.write_eof()
                ended = True
            elif kind == "reset" and not ended:
                cloud.reset()
                ended = True
            await settle(t.cloud)
            await settle(t.edge)
            await asyncio.sleep(0.002)
            seen.append((kind, list(consumer.log), _windows(t, cloud, consumer.stream)))
        if not ended:
            cloud.reset()
    return seen


@settings(max_examples=examples(1200), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_CONSUMER_OPS, min_size=1, max_size=12))
@example([("refuse",), ("down", b"a"), ("take",), ("down", b"b"), ("read",)])
@example([("refuse",), ("downburst", b"a"), ("take",), ("ws", b"b"), ("read",), ("ws", b"c")])
@example([("refuse",), ("wsburst", b"ab"), ("take",), ("wsburst", b"c"), ("read",)])
def test_a_refused_chunk_is_held_as_bd24f07_held_it(ops: list[Op]) -> None:
    async def old() -> list[Any]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Intake, "_on_messages", _bd24f07_on_messages)
            mp.setattr(Intake, "_received", _bd24f07_received)
            mp.setattr(TunnelStream, "_feed", _bd24f07_feed, raising=False)
            mp.setattr(Session, "_dispatch", _bd24f07_dispatch)
            return await _consume(ops)

    async def both() -> tuple[list[Any], list[Any]]:
        return await old(), await _consume(ops)

    before, after = asyncio.run(both())
    assert after == before
