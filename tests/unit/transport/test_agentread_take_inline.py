"""agentread: the session's take of a read round's one DATA frame (``Intake._on_messages``) and
the splice's small write (``Splice.data_received``) write out what ``TunnelStream._feed`` and
``TunnelStream.try_write`` did for the usual chunk (a Python call less each, per request, on
both ends). 8a65720's two methods are kept below verbatim (but for their names) as the oracle.

Differentially, on real sessions over a loopback WebSocket (plain TCP, and mTLS through the
tunnel's own TLS transport): the same generated traffic (chunks the cloud side writes, bytes
the dialled socket delivers, the cloud side reading or not, the socket's write buffer passing
its high mark and draining, a socket write that fails, the socket lost, its EOF, the cloud's
end and reset) goes once through 8a65720's methods and once through today's. After each step
the socket was written the same chunks, the cloud side read the same bytes, the splice, the
streams and both connections' credit windows are in the same state.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.transport.intake import Intake
from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.transport.splice import Splice
from tests.unit.transport.test_review22_take import _Socket
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import settle
from tests.unit.transport.test_websocket import contexts, pki  # noqa: F401 (a fixture)


def _8a65720_on_messages(self: Any, batch: list[bytes | memoryview]) -> None:
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


def _8a65720_data_received(self: Any, data: bytes) -> None:
    stream = self.stream
    if stream is None or self._pending or self._sender is not None:
        self._queue(data)
        return
    # _give, written out: a read a request on the agent.
    sent = stream.try_write(data)
    self.result.bytes_up += sent
    if self._watch is not None:
        self._watch.touch()
    if sent < len(data):
        self._queue(memoryview(data)[sent:])


class _Transport(_Socket):
    """test_review22_take's socket, with what ``connection_made`` and the upload ask of it."""

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


Op = tuple[Any, ...]
_OPS = st.one_of(
    st.tuples(st.just("down"), st.binary(min_size=1, max_size=3000)),
    st.tuples(st.just("down"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("up"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("up"), st.binary(min_size=1, max_size=20_000)),
    st.tuples(
        st.sampled_from(
            ["read", "drain", "fail", "eof", "reset", "lost", "upeof", "burst", "downburst"]
        )
    ),
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
                None if held is None else (held.state, held.recv.available, held.recv.unacked),
                None if held is None else held.send.available,
                stream.bytes_in,
                stream.bytes_out,
                stream.buffered,
            )
        )
    return tuple(out)


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
            elif kind == "downburst" and not ended:
                # Queued in one loop turn (as a poll that said "more input" leaves them): one
                # message of several DATA frames (the wire's receive_batch on the edge).
                t.cloud._probe.seen = True
                with contextlib.suppress(StreamClosedError):
                    for piece in (b"d" * 20, b"e" * 300, b"f"):
                        cloud.try_write(piece)
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
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_OPS, min_size=1, max_size=10), st.sampled_from([10, 2000, 1 << 20]))
@example([("down", b"a" * 50), ("up", b"x"), ("read",), ("down", b"b"), ("eof",)], 1 << 20)
@example([("down", b"a" * 50), ("down", b"b"), ("drain",), ("down", b"c"), ("eof",)], 10)
@example([("fail",), ("down", b"a"), ("up", b"b")], 1 << 20)
@example([("burst",), ("up", b"q"), ("read",), ("reset",)], 1 << 20)
@example([("up", b"z" * 20_000), ("read",), ("up", b"y"), ("read",)], 1 << 20)
@example([("lost",), ("down", b"a"), ("up", b"b")], 1 << 20)
@example([("downburst",), ("drain",), ("downburst",), ("down", b"g")], 10)
@example([("downburst",), ("read",), ("downburst",)], 1 << 20)
@example([("upeof",), ("down", b"a"), ("read",), ("eof",)], 1 << 20)
def test_take_and_small_write_as_8a65720s(
    pki: Path,  # noqa: F811 (the fixture)
    use_tls: bool,
    ops: list[Op],
    high: int,
) -> None:
    srv, cli = contexts(pki if use_tls else None)
    tls = (srv, cli) if srv and cli else None

    async def old() -> list[Any]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Intake, "_on_messages", _8a65720_on_messages)
            mp.setattr(Splice, "data_received", _8a65720_data_received)
            return await _run(ops, high, tls)

    async def both() -> tuple[list[Any], list[Any]]:
        return await old(), await _run(ops, high, tls)

    before, after = asyncio.run(both())
    assert after == before


def test_the_oracle_is_not_todays() -> None:
    """The patch above replaces today's methods (it would compare nothing otherwise)."""
    assert Intake._on_messages is not _8a65720_on_messages
    assert Splice.data_received is not _8a65720_data_received
