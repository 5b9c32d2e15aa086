"""One tunnel: a WebSocket carrying a :class:`ravenproxy.wire.Connection`, and its streams
(:class:`~ravenproxy.transport.tunnel_stream.TunnelStream`, driven from here).

This and :mod:`ravenproxy.transport.intake` (what the peer sends, taken in the read callback)
are the only places that turn the sans-I/O protocol into asyncio calls. A session owns two tasks
(reader, writer) and a keepalive timer, plus one task per stream the peer opens; :meth:`run`
returns when the WebSocket is gone, after every stream has been failed and every task collected.
The reader task mostly waits: it reads only what ``websockets`` keeps after a handover.

A server holds one session per connected agent, mostly idle: what a session keeps is kept a
thousand times. Hence :class:`~ravenproxy.transport.flag.Flag`, not :class:`asyncio.Event`, a
timer instead of a keepalive task, and the handshake request and response let go once it runs.
How its output is written: :mod:`ravenproxy.transport.outlet`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from ravenproxy.log import kv
from ravenproxy.transport.flag import Flag
from ravenproxy.transport.outlet import Outlet
from ravenproxy.transport.tunnel_stream import OpenError, StreamClosedError, TunnelStream
from ravenproxy.transport.websocket import TunnelConnectionMixin
from ravenproxy.wire import events as ev
from ravenproxy.wire.codes import SUBPROTOCOL, ErrorCode
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.errors import ControlFloodError, ProtocolError, WireError
from ravenproxy.wire.frames import Target
from ravenproxy.wire.streams import Stream

if TYPE_CHECKING:
    from ravenproxy.transport.intake import WebSocket

log = logging.getLogger(__name__)

__all__ = [
    "OpenError",
    "Session",
    "SessionConfig",
    "StreamClosedError",
    "StreamHandler",
    "TunnelStream",
    "websocket_options",
]


def _flag(flag: str, help: str) -> dict[str, str]:
    return {"flag": flag, "metavar": "S", "help": help}


@dataclass(frozen=True)
class SessionConfig:
    """A tunnel session's settings, the same on both ends."""

    # The metadata declares the flags (ravenproxy.flags) of the commands that lend these.
    wire: WireConfig = field(default_factory=WireConfig)
    ping_interval: float = field(
        default=10.0, metadata=_flag("--ping-interval", "keepalive interval")
    )
    """Seconds between keepalive PINGs."""
    dead_after: float = field(
        default=30.0,
        metadata=_flag("--dead-after", "a silent peer is dead after this; above --ping-interval"),
    )
    """A peer silent this long is dead: the session closes."""
    open_timeout: float = field(
        default=15.0, metadata=_flag("--open-timeout", "seconds a stream open waits for the agent")
    )
    """How long an OPEN may wait for its OPEN_RESULT (the agent's dial timeout is shorter)."""
    flood_grace: float = 10.0
    """How long reading from the peer may stay paused because our unsent control output is over
    ``wire.max_control_pending`` (the peer does not read our answers) before the tunnel is
    closed with ENHANCE_YOUR_CALM. Also bounds the closing handshake with a peer that does not
    read."""

    def __post_init__(self) -> None:
        if self.ping_interval <= 0 or self.dead_after <= self.ping_interval:
            raise ValueError("keepalive: need 0 < ping_interval < dead_after")
        if self.open_timeout <= 0:
            raise ValueError("open_timeout must be > 0")
        if self.flood_grace <= 0:
            raise ValueError("flood_grace must be > 0")


def websocket_options(wire: WireConfig) -> dict[str, Any]:
    """The tunnel's WebSocket settings, the same on both ends (our ``serve`` and ``connect``,
    whose connection classes carry our frame reader)."""
    return {
        "subprotocols": [SUBPROTOCOL],
        # Tunnel payloads are mostly TLS or already compressed: deflate would only cost CPU.
        "compression": None,
        "max_size": wire.max_message_size + 1024,
        "max_queue": 16,
        "write_limit": wire.max_message_size,
        # The tunnel protocol has its own keepalive (PING frames, SessionConfig).
        "ping_interval": None,
    }


StreamHandler = Callable[[TunnelStream], Awaitable[None]]


class Session(Outlet):
    """Runs the protocol over one WebSocket. ``on_open`` serves streams the peer opens."""

    config: SessionConfig

    def __init__(
        self,
        ws: WebSocket,
        *,
        server_side: bool,
        config: SessionConfig | None = None,
        on_open: StreamHandler | None = None,
        name: str = "",
        fields: dict[str, object] | None = None,
        server_id: str = "",
    ) -> None:
        self.ws = ws
        self.loop = asyncio.get_running_loop()
        """The loop it runs in, kept: on 3.11 each ``get_running_loop()`` is a ``getpid()``
        syscall, and a stream's reads and writes make futures."""
        self.config = config or SessionConfig()
        # server_id: announced in SETTINGS (SERVER_ID) when given (the server side's identity).
        self.conn = Connection(
            server_side=server_side, config=self.config.wire, server_id=server_id
        )
        self.on_open = on_open
        self.name = name
        self.fields = fields or {}
        self.streams: dict[int, TunnelStream] = {}
        self._window_waiters: set[TunnelStream] = set()
        self._writer_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._ready = Flag()
        self._closed = Flag()
        self.closed = False
        """The session ended (:meth:`run` returned or is returning). An attribute, not a
        property: the server's router asks it per request."""
        self.close_reason = ""
        self.error: ErrorCode | None = None
        """The connection error this side closed the tunnel with; None for any other end."""
        self.started = time.monotonic()
        """When the tunnel came up (monotonic clock)."""
        self.on_stream_closed: Callable[[TunnelStream], None] | None = None
        self._init_intake()
        self._init_outlet()

    # -- lifecycle --------------------------------------------------------------------------
    async def run(self) -> None:
        if isinstance(self.ws, TunnelConnectionMixin):
            self.ws.forget_handshake()
        self._flush()
        writer = asyncio.create_task(self._writer(), name=f"tunnel-writer:{self.name}")
        self._writer_task = writer
        self._schedule_keepalive()
        try:
            await self._reader()
        finally:
            self.closed = True
            self.conn.ended()  # whoever keeps routes through it hears now, not at unregistering
            self._closed.set()
            self._drain_event.set()
            writer.cancel()
            self._wake_writer = None  # gone: nothing writes through (outlet's _flush)
            self._stop_flood_timer()
            if self._keepalive_timer is not None:
                self._keepalive_timer.cancel()
                self._keepalive_timer = None
            lost = StreamClosedError(ErrorCode.CONNECTION_LOST, self.close_reason or "tunnel lost")
            for sid, stream in list(self.streams.items()):
                stream._fail(lost)
                self._forget(sid)
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(writer, *tasks, return_exceptions=True)
            await self._close_ws()

    async def wait_ready(self) -> None:
        """Until the peer's SETTINGS arrived (or the session ended)."""
        ready = asyncio.ensure_future(self._ready.wait())
        closed = asyncio.ensure_future(self._closed.wait())
        try:
            await asyncio.wait({ready, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            closed.cancel()
        if not self._ready.is_set():
            raise StreamClosedError(ErrorCode.CONNECTION_LOST, self.close_reason or "closed")

    @property
    def peer_server_id(self) -> str | None:
        """The server id the peer announced in its SETTINGS (after :meth:`wait_ready`); None
        before, or from a peer that announces none (an older server)."""
        return self.conn.peer_server_id

    def goaway(self, reason: str) -> None:
        """Drain: the peer opens no new streams; open ones finish."""
        self.conn.goaway(ErrorCode.OK, reason)
        self._flush()

    async def close(self, reason: str = "closing", code: int = 1001) -> None:
        """Close the WebSocket with ``code`` (default 1001, going away) and ``reason``."""
        self.close_reason = self.close_reason or reason
        await self._close_ws(code, reason[:120])

    # -- streams ----------------------------------------------------------------------------
    async def open_stream(self, target: Target, timeout: float | None = None) -> TunnelStream:
        if self.closed:
            raise OpenError(ErrorCode.CONNECTION_LOST, self.close_reason or "tunnel closed")
        try:
            sid = self.conn.open_stream(target)
        except WireError as exc:
            raise OpenError(exc.code, exc.message) from None
        stream = TunnelStream(self, sid, target)
        self.streams[sid] = stream
        self._flush()
        try:
            await asyncio.wait_for(
                asyncio.shield(stream._opening()), timeout or self.config.open_timeout
            )
        except TimeoutError:
            self.conn.reset_stream(sid, ErrorCode.OPEN_TIMEOUT, "no answer to OPEN")
            self._flush()
            stream._fail(OpenError(ErrorCode.OPEN_TIMEOUT, "the agent did not answer in time"))
            self._forget(sid)
            raise OpenError(ErrorCode.OPEN_TIMEOUT, "the agent did not answer in time") from None
        except asyncio.CancelledError:
            stream.reset(ErrorCode.CANCEL, "open cancelled")
            raise
        except StreamClosedError as exc:
            self._forget(sid)
            raise OpenError(exc.code, exc.message) from None
        return stream

    def _forget(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is not None:
            self._window_waiters.discard(stream)
            if self.on_stream_closed is not None:
                self.on_stream_closed(stream)

    def _consumed(self, stream: Stream | None, n: int) -> None:
        # Flushed only when credit went back: whatever else is queued was flushed by who
        # queued it (a chunk a request read, on both ends). ``stream``: the reader's wire
        # stream, which it holds (TunnelStream._wire): not looked up by id again.
        if not self.conn.closed and self.conn.consumed_on(stream, n):
            self._flush()

    def _wait_window(self, stream: TunnelStream) -> None:
        self._window_waiters.add(stream)

    def _schedule_keepalive(self) -> None:
        # A timer, not a task: an idle tunnel holds a timer handle, not a task, its coroutine
        # and the future of its sleep. Cancelled by run() when the session ends.
        self._keepalive_timer = self.loop.call_later(self.config.ping_interval, self._keepalive)

    def _keepalive(self) -> None:
        self._keepalive_timer = None
        if self.closed:
            return
        silent = time.monotonic() - self.conn.last_received
        if silent > self.config.dead_after:
            self.close_reason = f"peer silent for {silent:.0f}s"
            log.warning("tunnel peer is dead, closing", extra=kv(**self.fields, silent=silent))
            self.ws.transport.abort()
            return
        self._schedule_keepalive()
        self.conn.ping()
        self._flush()

    async def _reader(self) -> None:
        try:
            ws = self.ws
            if isinstance(ws, TunnelConnectionMixin):
                # Our frame reader hands each read round's messages to _on_messages, in its
                # read callback: no task wakes per message.
                self._delivering = True
                try:
                    await ws.deliver(self._on_messages)
                finally:
                    self._delivering = False
                    self._stop_flood_timer()
                # Handed over to websockets (or lost) while paused: what was held back first,
                # then websockets reads on.
                held, self._held = self._held, None
                if held is not None:
                    for data in held:
                        await self._received(data)
                    ws.transport.resume_reading()
            async for message in ws:
                await self._received(message)
        except ProtocolError as exc:
            if not self.conn.closed:  # found here, not by the wire layer: no GOAWAY queued yet
                self.conn.fail(exc.code, exc.message)
            self.error = exc.code
            self.close_reason = f"protocol error {exc.code.name}: {exc.message}"
            if not isinstance(exc, ControlFloodError):
                log.warning(
                    "peer broke the protocol", extra=kv(**self.fields, error=self.close_reason)
                )
            await self._close_with_error(exc.code)
        except ConnectionClosed as exc:
            self.close_reason = self.close_reason or close_text(
                exc.rcvd, exc.sent, exc.rcvd_then_sent
            )
        if not self.close_reason:
            # A normal close ends the iteration without ConnectionClosed; its frames say why.
            protocol = self.ws.protocol
            self.close_reason = close_text(
                protocol.close_rcvd, protocol.close_sent, protocol.close_rcvd_then_sent
            )

    async def _close_with_error(self, code: ErrorCode) -> None:
        """Send the GOAWAY the connection queued for a connection error, then close. The writer
        stops first, so nothing it still holds follows the GOAWAY."""
        if self._writer_task is not None:
            self._writer_task.cancel()
            self._wake_writer = None  # nothing written through after it either
        status = 1008 if code is ErrorCode.ENHANCE_YOUR_CALM else 1002  # policy / protocol
        try:
            async with asyncio.timeout(self.config.flood_grace):
                for message in self.conn.data_to_send():
                    await self.ws.send(message)
        except (ConnectionClosed, TimeoutError):
            pass
        await self._close_ws(status, code.name)

    async def _close_ws(self, code: int = 1000, reason: str = "") -> None:
        """The closing handshake, bounded: a peer that does not read would otherwise hold it
        (and this task) forever."""
        try:
            async with asyncio.timeout(self.config.flood_grace):
                await self.ws.close(code, reason)
        except TimeoutError:
            self.ws.transport.abort()

    def _dispatch(self, event: ev.Event) -> None:
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

    def _serve(self, stream: TunnelStream) -> None:
        if self.on_open is None:
            self.conn.reject_stream(stream.id, ErrorCode.REFUSED, "this side serves no streams")
            self._flush()
            return
        self.streams[stream.id] = stream
        task = asyncio.create_task(
            self._run_handler(stream), name=f"stream:{self.name}:{stream.id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_handler(self, stream: TunnelStream) -> None:
        assert self.on_open is not None
        try:
            await self.on_open(stream)
        except StreamClosedError:
            pass
        except Exception:
            log.exception("stream handler failed", extra=kv(**self.fields, stream=stream.id))
            stream.reset(ErrorCode.INTERNAL_ERROR, "handler failed")
        finally:
            stream.close()


def close_text(rcvd: Close | None, sent: Close | None, rcvd_then_sent: bool | None) -> str:
    """Why a tunnel's WebSocket ended, for the log: the side whose close frame came first, with
    its code and reason ("closed by us: 1002 incorrect masking" when this end refused a frame),
    or "connection lost" when neither side sent one."""
    if sent is not None and not rcvd_then_sent:  # ours first (or the peer never answered)
        return f"closed by us: {sent.code} {sent.reason}".strip()
    if rcvd is not None:
        return f"closed by peer: {rcvd.code} {rcvd.reason}".strip()
    return "connection lost"
