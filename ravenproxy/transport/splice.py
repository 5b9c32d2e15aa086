"""A tunnel stream spliced to a dialled socket by callbacks: the agent's relay of one stream
without a task per direction.

:func:`~ravenproxy.transport.relay.relay` gives each direction a coroutine, so every small
request and its answer cost two task wake-ups on the agent (the stream's reader, the socket's
reader) besides the session's own. Here the socket is served by :class:`Splice` (its
:class:`asyncio.Protocol`) and the stream calls back when a chunk arrives
(:meth:`TunnelStream.on_readable`): a chunk from the tunnel is written to the socket from the
session's reader, bytes from the socket go into the tunnel from ``data_received``. The same
rules as the relay's hold:

- stream → socket: the next chunk is taken (and its credit returned) only while the socket's
  write buffer is under its high mark (``pause_writing`` stops, ``resume_writing`` goes on);
- socket → stream: as much as has credit at hand (and room in the session's output) goes at
  once; the rest pauses reading the socket (TCP pushes back) while one task sends it with
  :meth:`TunnelStream.write` (waiting for credit), then reading resumes;
- half-close is carried both ways; the splice ends once both sides finished, or either failed
  (a failed socket resets the stream, a failed stream aborts the socket).

The server splices its front's client to a tunnel stream the same way after a CONNECT, a 101 or
an SNI passthrough: :class:`~ravenproxy.transport.front_splice.FrontSplice`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import cast

from ravenproxy.log import kv
from ravenproxy.transport.readiness import quiet, watch
from ravenproxy.transport.relay import IDLE_ERROR, IdleTimeout, IdleWatch, RelayResult, tune
from ravenproxy.transport.tunnel_stream import StreamClosedError, TunnelStream
from ravenproxy.wire.codes import ErrorCode

log = logging.getLogger(__name__)


class Splice(asyncio.Protocol):
    """One dialled socket (this is its protocol) spliced to one tunnel stream
    (:meth:`start`). Await :meth:`wait` for the end; it closes both."""

    __slots__ = (
        "_done",
        "_down_done",
        "_eof_sent",
        "_lost",
        "_over",
        "_pending",
        "_sender",
        "_up_done",
        "_up_eof",
        "_wake",
        "_watch",
        "_write_paused",
        "result",
        "stream",
        "transport",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.stream: TunnelStream | None = None
        self.result = RelayResult()
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._over = False
        """``_done.done()`` as an attribute, for :meth:`_readable` (a chunk a request): set
        where ``_done`` is set (:meth:`_finish`) or cancelled (:meth:`wait` cancelled). A
        Future's ``done()`` is a method call its load is not specialized for (~350
        instructions)."""
        self._pending: list[bytes | memoryview] = []
        """Socket bytes the stream did not take at once: :attr:`_sender` sends them."""
        self._sender: asyncio.Task[None] | None = None
        self._write_paused = False
        self._up_eof = False
        """The socket sent its EOF (or went away)."""
        self._up_done = False
        """The stream got our EOF: nothing more goes up."""
        self._down_done = False
        """The stream ended and the socket got its EOF."""
        self._lost = False
        self._eof_sent = False
        """The socket got our EOF."""
        self._watch: IdleWatch | None = None
        """The idle clock (the front's; the agent has none): each byte moved touches it."""
        self._wake: asyncio.Future[None] | None = None
        """What the front's :meth:`wait` waits on while it need not look at the client."""

    # -- the socket (asyncio.Protocol) ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        tune(self.transport)
        watch(self.transport)  # a target's answer queues tunnel output: readiness.py

    def data_received(self, data: bytes) -> None:
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

    def _give(self, stream: TunnelStream, data: bytes | memoryview) -> None:
        """Up with ``data``: what has credit at hand goes now, the rest to the sender."""
        sent = stream.try_write(data)
        self.result.bytes_up += sent
        watch = self._watch
        if watch is not None:
            watch.last = watch.clock()  # touch(), written out: a read a request (front)
        if sent < len(data):
            self._queue(memoryview(data)[sent:])

    def eof_received(self) -> bool:
        self._up_eof = True
        if self.transport is not None:  # half-closed: readable for ever (readiness.py)
            quiet(self.transport)
        self._send_eof()
        return True  # keep the transport open for our half (plain TCP can half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is not None:
            self._fail_socket(exc)
            return
        self._up_eof = True
        self._send_eof()
        self._check()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._readable(drain=True)

    # -- the stream ----------------------------------------------------------------------------
    def start(self, stream: TunnelStream) -> None:
        """Splice ``stream`` (accepted) to the socket: what the socket sent meanwhile goes up."""
        self.stream = stream
        stream.on_readable(self._readable, self._take)
        if self._pending and self._sender is None and not self._done.done():
            self._send_pending()
        self._send_eof()
        self._readable(drain=True)

    def _take(self, chunk: bytes | memoryview) -> bool:
        """A chunk as it arrives, to the socket as :meth:`_readable` would (False: it would not)."""
        transport = self.transport
        if self._write_paused or self._down_done or self._lost or self._over or transport is None:
            return False
        try:  # as in _readable: in the session's reader, nothing may escape
            transport.write(chunk)
            self.result.bytes_down += len(chunk)
            watch = self._watch
            if watch is not None:
                watch.last = watch.clock()  # touch(), written out: a chunk a request (front)
        except Exception as exc:
            log.exception("splice failed", extra=kv(stream=self.stream and self.stream.id))
            self._fail_socket(exc)
        return True  # (read, as _readable had read it)

    def _readable(self, drain: bool = False) -> None:
        """A chunk, the end or an error arrived on the stream (called by it, for each one):
        pass it on. ``drain``: pass on everything the stream holds while the socket takes it
        (what arrived while the socket took nothing or before :meth:`start`). Called by the
        stream, the stream holds nothing else: whatever arrived before it was passed on when
        it arrived, or is held back and drained when the socket takes bytes again; so it reads
        once, not a second time to find nothing (a call a request on the agent). Runs in the
        session's reader: nothing may escape."""
        stream, transport = self.stream, self.transport
        if stream is None or transport is None or self._over:
            return
        try:
            # A reset (or the tunnel gone) ends the splice even while the socket takes nothing
            # or after the stream's end (a target that reads nothing, or sends nothing back,
            # would otherwise hold both ends): read_nowait raises. Whether it was reset is asked
            # only then (a property: twice a request on the agent, where the socket takes all).
            while True:
                if (self._write_paused or self._down_done) and not stream.closed:
                    return
                chunk = stream.read_nowait()
                if chunk is None:
                    return
                if not chunk:
                    self._down_done = True
                    if not self._lost and transport.can_write_eof() and not transport.is_closing():
                        transport.write_eof()
                        self._eof_sent = True
                    self._check()
                    return
                if self._lost:
                    self._fail_socket(ConnectionResetError("Connection lost"))
                    return
                transport.write(chunk)
                self.result.bytes_down += len(chunk)
                if self._watch is not None:
                    self._watch.touch()
                if not drain:
                    return
        except StreamClosedError as exc:
            self._finish(str(exc))
        except Exception as exc:
            log.exception("splice failed", extra=kv(stream=stream.id))
            self._fail_socket(exc)

    # -- socket → stream -----------------------------------------------------------------------
    def _queue(self, data: bytes | memoryview) -> None:
        self._pending.append(data)
        if self.stream is None or self._sender is not None or self._done.done():
            return
        self._send_pending()

    def _send_pending(self) -> None:
        assert self.transport is not None and self.stream is not None
        self._hold()
        self._sender = asyncio.create_task(self._send(), name=f"splice-up:{self.stream.id}")

    async def _send(self) -> None:
        stream, transport = self.stream, self.transport
        assert stream is not None and transport is not None
        try:
            while self._pending:
                data = self._pending.pop(0)
                sent = stream.bytes_out
                try:
                    await stream.write(data)
                finally:  # what went, also of a write cut short
                    self.result.bytes_up += stream.bytes_out - sent
                if self._watch is not None:
                    self._watch.touch()
        except StreamClosedError as exc:
            self._finish(str(exc))
            return
        finally:
            self._sender = None
        if not self._done.done():
            self._release()
        self._send_eof()

    def _hold(self) -> None:
        """Bytes wait to go up (for credit): take no more from the socket meanwhile."""
        assert self.transport is not None
        self.transport.pause_reading()

    def _release(self) -> None:
        """They went: take the socket's bytes again."""
        assert self.transport is not None
        if not self._lost:
            self.transport.resume_reading()

    def _send_eof(self) -> None:
        stream = self.stream
        if (
            stream is None
            or not self._up_eof
            or self._up_done
            or self._pending
            or self._sender is not None
            or self._done.done()
        ):
            return
        self._up_done = True
        stream.write_eof()
        self._check()

    # -- the end -------------------------------------------------------------------------------
    def _check(self) -> None:
        transport = self.transport
        if self._down_done and (
            self._up_done or transport is None or not transport.can_write_eof()
        ):
            self._finish("")

    def _fail_socket(self, exc: BaseException) -> None:
        if self._done.done():
            return
        self._finish(f"socket: {exc!r}")
        if self.stream is not None:
            self.stream.reset(ErrorCode.CANCEL, "socket error")

    def _finish(self, error: str) -> None:
        if self._done.done():
            return
        self.result.error = error
        self._over = True
        self._done.set_result(None)
        self._nudge()

    def _nudge(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def wait(self) -> RelayResult:
        """Until the splice ends (the caller cancelled: it is aborted); closes both ends."""
        try:
            await self._until_done()
        except IdleTimeout:
            self._finish(IDLE_ERROR)  # first: the reset below calls back
            self.result.idle = True
            if self.stream is not None:
                self.stream.reset(ErrorCode.CANCEL, IDLE_ERROR)
        except asyncio.CancelledError:
            self._over = self._done.done()  # cancelled with the wait (Splice's)
            if self.stream is not None:
                self.stream.reset(ErrorCode.CANCEL, "relay cancelled")
            self.result.error = self.result.error or "cancelled"
            raise
        finally:
            await self._close()
        return self.result

    async def _until_done(self) -> None:
        await self._done

    async def _close(self) -> None:
        sender = self._sender
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        if self.stream is not None:
            self.stream.on_readable(None)
            self.stream.close()
        if self.transport is not None:
            if self.result.error:
                self.transport.abort()
            else:
                self.transport.close()
