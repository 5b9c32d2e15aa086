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
an SNI passthrough (:func:`splice_or_relay`; kube-apiserver's egress: every ``kubectl logs`` and
``exec``): :class:`FrontSplice`. There the front's
:class:`~ravenproxy.transport.socket_stream.SocketStream` stays the socket's protocol (it holds
what was read before, and lends a bulk upload's reads without a copy) and calls back; the splice
takes its bytes from it while nothing waits to go up (the rest waits in the stream's buffer,
which stops reading the socket past its bound, as under :func:`relay`). It keeps the relay's
clocks too: ``--idle-timeout`` (:class:`~ravenproxy.transport.relay.IdleWatch`), and a client
gone while its upload waits for credit, or after its half-close while the target has not
answered, noticed within :data:`~ravenproxy.transport.relay.CREDIT_PROBE` seconds
(:func:`~ravenproxy.transport.relay.client_gone`). Against :func:`relay`, a small request and
its answer wake no task of their own (the relay's direction tasks were two wake-ups and an event
loop turn per request on the server).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, cast

from ravenproxy.log import kv
from ravenproxy.transport.bytestream import READ_LIMIT, ByteStream, TunnelByteStream
from ravenproxy.transport.lender import LEND_FROM, LEND_IDLE
from ravenproxy.transport.readiness import quiet, watch
from ravenproxy.transport.relay import (
    CREDIT_PROBE,
    IDLE_ERROR,
    IdleTimeout,
    IdleWatch,
    RelayResult,
    client_gone,
    relay,
    tune,
)
from ravenproxy.transport.socket_stream import SocketReader, SocketStream, SocketWriter
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
        if self._watch is not None:
            self._watch.touch()
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
            if self._watch is not None:
                self._watch.touch()
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


class FrontSplice(Splice):
    """A server front's client socket (its :class:`SocketStream`, which calls back) spliced
    to a tunnel stream (:meth:`splice`), with the relay's idle timeout and client checks.
    Await :meth:`wait` for the end; it closes both."""

    __slots__ = ("_sock",)

    def __init__(self, sock: SocketStream, idle_timeout: float | None) -> None:
        super().__init__()
        self._sock = sock
        self._watch = IdleWatch(idle_timeout)
        self.transport = sock.transport
        tune(sock.transport)
        self._write_paused = sock.write_paused

    def splice(
        self, stream: TunnelStream, initial_up: bytes = b"", initial_down: bytes = b""
    ) -> None:
        """Start: ``initial_down`` (read from the target already) to the socket, ``initial_up``
        (read from the socket already) and whatever the socket holds up the stream."""
        sock = self._sock
        sock.on_writing(self)  # first: initial_down may fill the socket's buffer past its mark
        if initial_down:
            sock.transport.write(initial_down)
            self.result.bytes_down += len(initial_down)
        sock.lend_reads()
        sock.on_data(self._pull)
        self.start(stream)
        if initial_up:
            self.data_received(initial_up)
        self._pull()

    def _pull(self) -> None:
        """The socket's callback (bytes, its EOF, its loss), and the sender's end: take what it
        holds while nothing waits to go up. Runs in a callback: nothing may escape."""
        sock, stream = self._sock, self.stream
        if stream is None or self._done.done():
            return
        if sock.lost:
            self._lost = True
            error = sock.exception()
            if error is not None:
                if self._sender is not None:  # as the relay says it of an upload that waits
                    error = ConnectionResetError(client_gone(sock, sock))
                self._fail_socket(error)
                return
        try:
            while not self._pending and self._sender is None and not self._up_eof:
                data = sock.read_chunk_nowait(READ_LIMIT)
                if data is None:
                    return
                if not data:
                    self._up_eof = True
                    self._nudge()  # wait() looks at the client from now on
                    self._send_eof()
                    self._check()
                    return
                if len(data) < LEND_FROM:
                    self._give(stream, data)
                else:
                    # Bulk: by the sender, whose write sends each credit in one frame, as the
                    # relay's (try_write would cut it at the session's output room, and the rest
                    # make a second frame, a second write on the agent's side). No look at the
                    # credit per small read: 6 % of the server's instructions per request.
                    self._queue(data)
        except Exception as exc:
            self._fail_socket(exc)

    def _hold(self) -> None:
        # Nothing is taken from the socket meanwhile (see _pull): its stream buffers, and stops
        # reading past its bound. wait() looks at the client while the upload waits.
        self._nudge()

    def _release(self) -> None:
        # Also once the socket is lost: what it read before (a TLS client's close closes the
        # transport), and its EOF, still go up.
        self._pull()

    async def _until_done(self) -> None:
        """Until the end, or no byte either way for the idle timeout (:class:`IdleTimeout`);
        while an upload waits for credit, or the client half-closed and the target has not
        finished, the client's socket is looked at every :data:`CREDIT_PROBE` seconds (the
        relay's :meth:`watching_client`): reset, it ends the splice."""
        done, sock, watch = self._done, self._sock, self._watch
        assert watch is not None
        async with watch:
            while not done.done():
                if not self._watching_client():
                    self._wake = wake = done.get_loop().create_future()
                    try:
                        if sock.read_buffer_size:  # as a relay's reader: let them go if idle
                            up = self.result.bytes_up
                            await asyncio.wait((wake,), timeout=LEND_IDLE)
                            if not wake.done() and self.result.bytes_up == up:
                                sock.let_go_reads()
                        else:
                            await wake
                    finally:
                        self._wake = None
                    continue
                await asyncio.wait((done,), timeout=CREDIT_PROBE)
                if done.done():
                    return
                if self._watching_client():
                    gone = client_gone(sock, sock, eof_sent=self._eof_sent)
                    if gone:
                        self._fail_socket(ConnectionResetError(gone))

    def _watching_client(self) -> bool:
        """An upload waits for credit, or the client half-closed and the target has not
        finished: the client's socket is looked at for a reset (nothing else would notice)."""
        return self._sender is not None or (self._up_eof and not self._down_done)

    async def _close(self) -> None:
        self._sock.on_data(None)
        self._sock.on_writing(None)
        await super()._close()


def splice_or_relay(
    upstream: ByteStream,
    reader: SocketReader,
    writer: SocketWriter,
    *,
    initial_up: bytes = b"",
    initial_down: bytes = b"",
    idle_timeout: float | None = None,
) -> Coroutine[Any, Any, RelayResult]:
    """:func:`relay` a server front's client to ``upstream`` — by callbacks
    (:class:`FrontSplice`) when it is a tunnel stream and the client's socket a
    :class:`SocketStream`. Await it (it closes both ends)."""
    if type(upstream) is TunnelByteStream and type(reader) is SocketStream and reader is writer:
        splice = FrontSplice(reader, idle_timeout)
        splice.splice(upstream.stream, initial_up, initial_down)
        return splice.wait()
    return relay(
        upstream,
        reader,
        writer,
        initial_up=initial_up,
        initial_down=initial_down,
        idle_timeout=idle_timeout,
    )
