"""What a :class:`~ravenproxy.transport.session.Session` takes from its peer: the messages
of our frame reader, handed over in the transport's read callback
(:meth:`~ravenproxy.transport.websocket.TunnelConnectionMixin.deliver`), one read round at a
time, no task woken per message; those ``websockets`` reads after a handover, by the session's
reader task. Both stop taking while our unsent control output is over
``wire.max_control_pending`` (the peer does not read our answers: protocol section 8), and give
up on a peer that stays so for ``flood_grace`` with :class:`ControlFloodError`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from websockets.protocol import State as WsState

from ravenproxy.log import kv
from ravenproxy.transport.flag import Flag
from ravenproxy.transport.websocket import TunnelConnectionMixin
from ravenproxy.wire import events as ev
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.errors import ControlFloodError, ProtocolError

if TYPE_CHECKING:
    from typing import TypeAlias

    from websockets.asyncio.connection import Connection as WsConnection

    from ravenproxy.transport.tunnel_stream import TunnelStream
    from ravenproxy.transport.ws_client import TunnelClientConnection

    WebSocket: TypeAlias = WsConnection | TunnelClientConnection
    """A session's WebSocket: ``websockets``' (the server side's, with our reader or not) or
    the agent's own (no ``websockets.asyncio`` in an agent: issue 15)."""

log = logging.getLogger("ravenproxy.transport.session")  # the session's lines, as before

YIELD_EVERY = 0.002
"""Seconds of reading a tunnel through ``websockets`` (after a handover) without a break, at
most, before other tasks get a turn. Our frame reader needs none: it hands over one read round
at a time, from the read callback, and the loop runs other work between two."""


class Limits(Protocol):
    """What the intake reads of :class:`~ravenproxy.transport.session.SessionConfig`."""

    @property
    def wire(self) -> WireConfig: ...

    @property
    def flood_grace(self) -> float: ...


class Intake:
    """The taking side of a session (a base of :class:`Session`, which owns what it names)."""

    ws: WebSocket
    conn: Connection
    config: Limits
    fields: dict[str, object]
    streams: dict[int, TunnelStream]
    _writer_task: asyncio.Task[None] | None
    _taken: Flag

    # The class's until a session sets them, which its usual life never does (a pause on a
    # flood of control frames, a handover to websockets' reader). Python 3.11 keeps up to 29
    # attributes of an instance in shared-key values; a session that sets more gets a dict of
    # its own, and every attribute load on it then takes the slower hinted lookup and its
    # method loads are not specialized at all (LOAD_METHOD_ADAPTIVE: ~a dozen loads a
    # message, `session._flush()` among them). tests/unit/transport/test_session_attributes.py
    # holds a session to that count.
    _yielded = 0.0
    """When the websockets read path last yielded (0: it yields at its first message)."""
    _paused_at = 0.0
    _flood_timer: asyncio.TimerHandle | None = None

    def _init_intake(self) -> None:
        self._delivering = False  # our frame reader calls _on_messages
        self._held: list[bytes | memoryview] | None = None  # reading paused: not taken yet
        self._deferred = False  # taking a read round: what it queues is written at its end

    if TYPE_CHECKING:  # the session's

        def _flush(self) -> None: ...

        def _dispatch(self, event: ev.Event) -> None: ...

    # -- the messages of our frame reader, by callback ------------------------------------------
    def _on_messages(self, batch: list[bytes | memoryview]) -> None:
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

    def _pause(self, rest: list[bytes | memoryview]) -> None:
        """Read nothing while our unsent control output is over the bound: the writer cannot
        get it out because the peer does not read. TCP backpressure then holds the peer's
        further frames in its own buffers, not in our memory; ``rest`` (the read round's
        messages not taken yet) waits for the writer. Still paused after ``flood_grace``: the
        peer floods (:meth:`_flooded`)."""
        self._held = rest
        self.ws.transport.pause_reading()
        self._paused_at = time.monotonic()
        self._flood_timer = asyncio.get_running_loop().call_later(
            self.config.flood_grace, self._flooded
        )

    def _unpause(self) -> None:
        """The writer took the output: take what was held back, then read on (unless that
        paused again)."""
        if not self._delivering or not self.conn.should_read:
            return
        held, self._held = self._held, None
        self._stop_flood_timer()
        try:
            self._on_messages(held or [])
        except Exception as exc:
            assert isinstance(self.ws, TunnelConnectionMixin)
            self.ws.stop_delivery(exc)
            return
        if self._held is None:
            self.ws.transport.resume_reading()

    def _stop_flood_timer(self) -> None:
        if self._flood_timer is not None:
            self._flood_timer.cancel()
            self._flood_timer = None

    def _flooded(self) -> None:
        self._flood_timer = None
        if self.ws.protocol.state is not WsState.OPEN:
            return  # the tunnel is ending: its close is bounded
        assert isinstance(self.ws, TunnelConnectionMixin)
        self.ws.stop_delivery(self._flood(self._paused_at))

    def _flood(self, paused_at: float) -> ControlFloodError:
        """The error (and the log line) for a peer that left us paused for ``flood_grace``."""
        log.warning(
            "peer floods control frames, closing",
            extra=kv(
                **self.fields,
                pending=self.conn.control_pending,
                limit=self.config.wire.max_control_pending,
                paused=f"{time.monotonic() - paused_at:.1f}s",
            ),
        )
        return ControlFloodError(
            f"over {self.config.wire.max_control_pending} bytes of answers unread for "
            f"{self.config.flood_grace:g}s"
        )

    # -- messages read through websockets (after a handover) ----------------------------------
    async def _received(self, message: str | bytes | memoryview) -> None:
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

    async def _paused(self) -> None:
        """Read nothing while our unsent control output is over the bound: the writer cannot
        get it out because the peer does not read. TCP backpressure then holds the peer's
        further frames in its own buffers, not in our memory. Still paused after
        ``flood_grace``: the peer floods; raise :class:`ControlFloodError`."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.config.flood_grace):
                while not self.conn.should_read:
                    writer = self._writer_task
                    if (
                        writer is None
                        or writer.done()
                        or self.ws.protocol.state is not WsState.OPEN
                    ):
                        return  # the tunnel is ending: let the read loop see how
                    self._taken.clear()
                    await self._taken.wait()
        except TimeoutError:
            if self.ws.protocol.state is not WsState.OPEN:
                return
            raise self._flood(started) from None
