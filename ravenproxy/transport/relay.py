"""The one relay: socket ⇄ any :class:`~ravenproxy.transport.bytestream.ByteStream` (a tunnel
stream, a dialled socket, TLS on either), with backpressure both ways and half-close carried
through. The server's fronts relay their clients (CONNECT, upgrades, SNI passthrough) to a
route's directly dialled target (or re-originated TLS) with it; a tunnel stream is spliced to
the client's socket by callbacks under the same rules (:mod:`ravenproxy.transport.front_splice`),
as the agent splices its streams to their dialled targets (:mod:`ravenproxy.transport.splice`).

Socket → stream: read only as much as the stream accepts now (:meth:`ByteStream.writable`, a
tunnel stream's credit), so a slow tunnel stops reading the socket (TCP pushes back on the
sender) instead of queueing. Stream → socket: the next chunk is taken (and its credit returned)
only after the socket accepted the previous one.

A client that goes away while its upload waits for the tunnel's credit (the target reads
nothing), or after its half-close while the target has not answered, is noticed within
:data:`CREDIT_PROBE` seconds, not at the idle timeout: while it waits,
the relay looks at the client's socket (the error its reader was left with; the kernel's TCP
state, because a socket whose reading is paused hears of no reset; for a Unix socket, which has
no reset, whether the kernel's poll says its peer closed) and ends with that error.

Idleness (no byte either way for a while) is tracked once, by :class:`IdleWatch`, for this relay
and for every other copy loop of a relayed connection: the loops only stamp the time. Bytes
written to the client (or a dialled target) that wait for it are no idleness while it takes
them, however slowly (:class:`~ravenproxy.transport.idle.Taken`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from ravenproxy.transport.bytestream import READ_LIMIT, ByteStream, SocketByteStream, TlsByteStream
from ravenproxy.transport.idle import IdleTimeout, IdleWatch, Taken
from ravenproxy.transport.socket_stream import SocketReader, SocketStream, SocketWriter
from ravenproxy.transport.tunnel_stream import StreamClosedError

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["IDLE_ERROR", "READ_LIMIT", "IdleTimeout", "IdleWatch", "RelayResult", "relay"]


@dataclass(slots=True)
class RelayResult:
    """What a relay moved, each way, and how it ended."""

    bytes_up: int = 0
    """Socket → upstream."""
    bytes_down: int = 0
    """Upstream → socket."""
    error: str = ""
    idle: bool = False
    """Closed because no byte moved either way for the idle timeout."""


IDLE_ERROR = "idle timeout"
"""The error a relay closed for idleness reports."""

CREDIT_PROBE = 2.0
"""Seconds between looks at the client's socket while its upload waits for credit."""

_TCP_CLOSE = 7
"""``tcpi_state`` of a connection the peer reset (or that timed out): gone both ways. A FIN
alone leaves it in CLOSE_WAIT, a half-close the relay carries on."""


def relay(
    upstream: ByteStream,
    reader: SocketReader,
    writer: SocketWriter,
    *,
    initial_up: bytes = b"",
    initial_down: bytes = b"",
    idle_timeout: float | None = None,
    label: str = "",
) -> Coroutine[Any, Any, RelayResult]:
    """Copy socket ⇄ ``upstream`` until both sides finished (half-close carried) or either
    failed, or no byte moved either way for ``idle_timeout`` seconds (``idle`` set in the
    result). Always closes the socket and the upstream. ``initial_up`` was already read from the
    socket and belongs upstream; ``initial_down`` was already read from upstream.

    A socket that cannot half-close (TLS) ends the relay once upstream is done: there is no
    other way to tell its peer.

    Await it (a plain function returning the coroutine, so an idle relay holds no extra frame)."""
    return _Relay(upstream, reader, writer, initial_up, initial_down, idle_timeout).run(label)


class _Relay:
    """One relay's state. A slotted object rather than closures: an idle relay is the common
    case at scale, and four nested functions with a dozen closure cells cost ~1 KB each.

    Socket → upstream runs in the calling task; only upstream → socket gets a task of its own
    (one task per relay, not two). When down ends first and up has nothing left to do (down
    failed, or the socket cannot half-close), down's end cancels the calling task, the way a
    TaskGroup stops its parent: cancel(), then uncancel() where the cancellation is caught."""

    __slots__ = (
        "eof_sent",
        "half_close",
        "in_up",
        "initial_down",
        "initial_up",
        "reader",
        "result",
        "stop_up",
        "taken",
        "task",
        "upstream",
        "watch",
        "writer",
    )

    def __init__(
        self,
        upstream: ByteStream,
        reader: SocketReader,
        writer: SocketWriter,
        initial_up: bytes,
        initial_down: bytes,
        idle_timeout: float | None,
    ) -> None:
        self.upstream = upstream
        self.reader = reader
        self.writer = writer
        self.initial_up = initial_up
        self.initial_down = initial_down
        self.result = RelayResult()
        self.watch = IdleWatch(idle_timeout)
        self.taken = Taken(writer.transport, self.watch)
        dialled = upstream.inner if type(upstream) is TlsByteStream else upstream
        if type(dialled) is SocketByteStream:  # the other way too: a slow but steady target
            dialled.taken = Taken(dialled.writer.transport, self.watch)
        self.half_close = writer.can_write_eof()
        self.eof_sent = False
        self.in_up = True
        self.stop_up = False
        self.task: asyncio.Task[Any] | None = None
        """The task running :meth:`run` (the caller's)."""

    async def down(self) -> None:
        upstream, writer, result, watch = self.upstream, self.writer, self.result, self.watch
        taken = self.taken
        if self.initial_down:
            initial, self.initial_down = self.initial_down, b""
            writer.write(initial)
            result.bytes_down += len(initial)
            await taken.drain(writer)
        while True:
            chunk = await upstream.read()
            if not chunk:
                if writer.can_write_eof() and not writer.is_closing():
                    writer.write_eof()
                    self.eof_sent = True
                return
            writer.write(chunk)
            result.bytes_down += len(chunk)
            watch.touch()
            await taken.drain(writer)  # a client that takes them, however slowly, is not idle

    def down_ended(self, task: asyncio.Task[None]) -> None:
        if not self.in_up or self.stop_up or task.cancelled():
            return
        if task.exception() is not None or not self.half_close:
            self.stop_up = True
            assert self.task is not None
            self.task.cancel()

    async def credit(self, label: str) -> int:
        """:meth:`ByteStream.writable` for an upload that waits, watching the client meanwhile:
        raises :class:`ConnectionResetError` once it is gone."""
        waiter = asyncio.create_task(
            self.upstream.writable(), name=f"relay-credit:{label}" if label else "relay-credit"
        )
        try:
            return await self.watching_client(waiter)
        finally:
            if not waiter.done():
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)

    async def watching_client(self, task: asyncio.Task[T]) -> T:
        """``task``'s result, looking at the client's socket every :data:`CREDIT_PROBE` seconds
        meanwhile: for an upload waiting for credit (reading the socket may be paused), and for
        down after the client's half-close (its reading ended at its EOF): either way a reset is
        heard only by the kernel, or at the next write of an answer the target may never send.
        Raises :class:`ConnectionResetError` once the client is gone."""
        while True:
            await asyncio.wait((task,), timeout=CREDIT_PROBE)
            if task.done():
                return task.result()
            gone = client_gone(self.reader, self.writer, eof_sent=self.eof_sent)
            if gone:
                raise ConnectionResetError(gone)

    def failed(self, exc: BaseException) -> None:
        # One direction failed: the other has nothing sensible left to do.
        if isinstance(exc, StreamClosedError):
            self.result.error = str(exc)
        else:
            self.result.error = f"socket: {exc!r}"
            self.upstream.abort("socket error")

    async def run(self, label: str) -> RelayResult:
        self.task = task = asyncio.current_task()
        assert task is not None
        result, upstream, writer = self.result, self.upstream, self.writer
        tune(writer.transport)
        down_task = asyncio.create_task(
            self.down(), name=f"relay-down:{label}" if label else "relay-down"
        )
        down_task.add_done_callback(self.down_ended)
        try:
            async with self.watch:
                try:
                    # Socket → upstream, here rather than in a coroutine of its own: one
                    # frame less held by every idle relay.
                    if self.initial_up:
                        initial, self.initial_up = self.initial_up, b""
                        await upstream.write(initial)
                        result.bytes_up += len(initial)
                    reader, watch = self.reader, self.watch
                    # A bulk upload is read without a copy per read (views of the socket
                    # stream's buffers, which upstream takes by reference).
                    read = (
                        reader.read_chunk
                        if isinstance(reader, SocketStream) and reader.lend_reads()
                        else reader.read
                    )
                    while True:
                        # Read only as much as upstream takes now (a tunnel stream's credit):
                        # a slow tunnel stops reading the socket, and TCP pushes back.
                        room = upstream.room() or await self.credit(label)
                        data = await read(min(room, READ_LIMIT))
                        if not data:
                            await upstream.write_eof()
                            break
                        await upstream.write(data)
                        result.bytes_up += len(data)
                        watch.touch()
                except asyncio.CancelledError:
                    if not self.stop_up or task.uncancel() > 0:
                        raise  # not (only) ours: the idle watch's, or the caller's
                except Exception as exc:
                    self.failed(exc)
                finally:
                    self.in_up = False
                if result.error:
                    down_task.cancel()
                    await asyncio.gather(down_task, return_exceptions=True)
                else:
                    # Up is done (or has nothing left to do): the relay ends with down.
                    try:
                        await self.watching_client(down_task)
                    except Exception as exc:
                        self.failed(exc)
        except IdleTimeout:
            result.error, result.idle = IDLE_ERROR, True
            upstream.abort(IDLE_ERROR)
            down_task.cancel()
            await asyncio.gather(down_task, return_exceptions=True)
        except asyncio.CancelledError:
            upstream.abort("relay cancelled")
            down_task.cancel()
            await asyncio.gather(down_task, return_exceptions=True)
            raise
        finally:
            self.in_up = False
            if not down_task.done():  # only on an error of our own above
                down_task.cancel()
            self.taken.stop()  # (a dialled target's: by its close below)
            if result.error:
                writer.transport.abort()
            else:
                writer.close()
            upstream.close()
        return result


def client_gone(reader: SocketReader, writer: SocketWriter, *, eof_sent: bool = False) -> str:
    """Why the client's connection is gone both ways ("" while it is not): lost to an error,
    or reset while it was not read (reading paused, or ended at its EOF: nothing heard of it but
    the kernel).
    ``eof_sent``: the relay has half-closed the socket itself."""
    exc = reader.exception()
    if exc is not None:
        return f"client connection lost: {exc}"
    sock = writer.get_extra_info("socket")
    if sock is None:
        return ""
    if sock.family == socket.AF_UNIX:
        # POLLHUP: shut down both ways. A peer's close() does that; its shutdown(SHUT_WR) (a
        # half-close, still reading) does not — unless we half-closed too (eof_sent): then a
        # hang-up does not tell the two apart, and the relay goes on.
        if eof_sent:
            return ""
        poller = select.poll()
        poller.register(sock.fileno(), 0)  # POLLHUP and POLLERR are reported regardless
        if any(events & (select.POLLHUP | select.POLLERR) for _fd, events in poller.poll(0)):
            return "client connection closed while its upload waited for credit"
        return ""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return ""
    try:
        state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        if state != _TCP_CLOSE:
            return ""
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    except OSError:
        return ""  # closed under us: the reader says why, next time
    why = os.strerror(err) if err else "closed"
    return f"client connection gone while not read: {why}"


def tune(transport: asyncio.WriteTransport) -> None:
    """A relayed socket: TCP_NODELAY (a small answer must not wait for Nagle), and writes pause
    the relay at :data:`READ_LIMIT` buffered (the relay and the agent's splice alike)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    transport.set_write_buffer_limits(high=READ_LIMIT)
