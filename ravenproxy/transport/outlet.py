"""How a :class:`~ravenproxy.transport.session.Session`'s output reaches its transport (a base
of the session, as :mod:`~ravenproxy.transport.intake` is for what it takes in).

Small output on an idle tunnel (a request, its answer) is written by whoever queued it, in the
callback that queued it: no writer task step, no loop turn between it and its write (a stream's
small write so written, nothing queued before it, is not even queued: :meth:`_write_through`,
the wire counting it as it would queue it). Unless more
input waits in this loop turn (:mod:`~ravenproxy.transport.readiness`): then several clients'
requests (the server) or several targets' answers (the agent) are in the event loop's batch, and
what all queued is written in one write at the turn's end, as the writer's batch did (a write
each would split the burst: more reads and writes per request on both ends); the probe is asked
once a burst, not by each of its events. What a read round of the
tunnel queues is one write at the round's end (the intake defers the flushes it makes). Bulk
(:data:`~ravenproxy.transport.frame_batch.WRITE_THROUGH` or more queued), a paused transport, a
WebSocket past its CLOSE (or lost) and messages held back go to the writer task, which writes
what every stream queued since it last ran in few large writes and waits for the transport to
drain (docs/protocol.md's flow control).
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.protocol import State as WsState

from ravenproxy.transport.flag import Flag
from ravenproxy.transport.frame_batch import COALESCE, WRITE_THROUGH, one_frame, writes
from ravenproxy.transport.intake import Intake
from ravenproxy.transport.readiness import of as readiness_of
from ravenproxy.transport.tls_socket import TLSSocketTransport
from ravenproxy.transport.websocket import TunnelConnectionMixin
from ravenproxy.wire.frames import HEADER_SIZE
from ravenproxy.wire.streams import Stream

# WsState.OPEN read once: a member read on its class goes through EnumType.__getattr__ on
# Python 3.11 (slot_tp_getattr_hook, ~850 instructions), and _flush reads it once a request.
_OPEN = WsState.OPEN

THROUGH = min(WRITE_THROUGH, COALESCE - 16) - HEADER_SIZE - 1
"""The largest payload :meth:`Outlet._write_through` writes: its frame is one that ``_flush``
writes through (under :data:`WRITE_THROUGH` queued) as :func:`one_frame` (never None)."""


class Outlet(Intake):
    """The writing side of a session (a base of :class:`Session`, which owns what it names)."""

    loop: asyncio.AbstractEventLoop
    closed: bool  # the session's

    def _init_outlet(self) -> None:
        self._wake = False  # queued since the writer took the queue
        self._wake_writer: asyncio.Future[None] | None = None  # its wait (no Flag's shield)
        self._probe = readiness_of(self.loop)
        self._late = False  # a _flush_late is scheduled: it writes what the turn leaves queued
        self._drain_event = Flag()
        # Set whenever the writer has taken the connection's queue (or stopped for good): what
        # a reader paused on unsent control output waits for.
        self._taken = Flag()
        # Whether no DATA frame may go out any more, as an attribute: our reader's (kept where
        # websockets' output leaves) on the tunnel's TLS transport, which drops what is written
        # once closing without a word; else websockets' state and is_closing() asked each time
        # (asyncio's TCP transport logs each write after an abort from the fifth on).
        ws = self.ws
        self._gate: TunnelConnectionMixin | _StateGate = _StateGate(ws)
        if isinstance(ws, TunnelConnectionMixin) and isinstance(ws.transport, TLSSocketTransport):
            self._gate = ws

    def _flush(self, late: bool = False) -> None:
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

    def _write_through(self, stream: Stream | None, data: bytes | memoryview) -> bool:
        """A stream's small write (:meth:`TunnelStream.try_write`) as ``send_upto`` then
        :meth:`_flush` would send it, where ``_flush``'s conditions hold and the wire takes it
        as one frame (:meth:`Connection.send_small_on`; ``stream``: the writer's wire stream,
        which it holds). Where nothing is queued (nothing it could overtake, control frames
        included) and ``_flush`` would write it through at once, it is written without
        queueing it and taking it back (~3 900 instructions a message); behind queued output
        (a burst's earlier writes, left for the turn's end) the wire queues it and one
        ``_flush`` follows, as after ``send_upto``, with one set of checks. Returns whether it
        took ``data`` (all of it); False, having done nothing: the queued path."""
        if self._wake or self._deferred or self._wake_writer is None:
            return False
        ws = self.ws
        if ws.paused or self._held is not None or self._gate.data_closed:
            return False
        conn = self.conn
        head = conn.send_small_on(stream, data, THROUGH)
        if not head:  # b"": queued behind what is queued, for _flush to send as it decides
            if head is None:
                return False
            self._flush()
            return True
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

    def _flush_late(self) -> None:
        """What the turn left queued (no later event of its burst wrote it), in the loop's next
        turn, before it polls again. The first of them ends the turn's "more input" (no
        handle of its own: one of these is pending wherever a poll said more)."""
        self._late = False
        self._probe.seen = False
        self._flush(late=True)

    async def _drained(self) -> None:
        """Wait until the writer caught up, so producers cannot queue without bound."""
        while self.conn.pending_bytes > self.config.wire.max_message_size and not self.closed:
            self._drain_event.clear()
            await self._drain_event.wait()

    async def _writer(self) -> None:
        # A batch: what every stream queued since the writer last ran, in few large writes.
        mask, ws, loop = not self.conn.server_side, self.ws, self.loop
        taken, drained, outbox = self._taken, self._drain_event, self.conn.outbox
        try:
            while True:
                if not self._wake:
                    self._wake_writer = waiter = loop.create_future()
                    await waiter
                self._wake = False
                batch = outbox.take_pieces()  # conn.pieces_to_send(), one call less
                # Both flags are waited for only right after a clear(): set while waited for.
                if taken.waiter is not None:
                    taken.set()
                if self._held is not None:
                    self._unpause()
                for frames in writes(batch, mask=mask):
                    if ws.protocol.state is not _OPEN:
                        return
                    ws.transport.writelines(frames)
                    # drain() waits only while paused (or yields once while closing).
                    if ws.paused or ws.transport.is_closing():
                        await ws.drain()
                if drained.waiter is not None:
                    drained.set()
        except ConnectionClosed:
            pass
        finally:
            self._wake_writer = None  # stopped: nothing writes through any more
            self._drain_event.set()
            self._taken.set()


class _StateGate:
    """:attr:`TunnelConnectionMixin.data_closed` of a WebSocket without our reader (its
    transport closing too: that one's may not drop what is written)."""

    __slots__ = ("ws",)

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    @property
    def data_closed(self) -> bool:
        return self.ws.protocol.state is not _OPEN or self.ws.transport.is_closing()
