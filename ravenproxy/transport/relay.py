"""The one relay: socket ⇄ any :class:`~ravenproxy.transport.bytestream.ByteStream` (a tunnel
stream, a dialled socket, TLS on either), with backpressure both ways and half-close carried
through. The agent relays its dialled target to the tunnel with it; the server's fronts relay
their clients (CONNECT, upgrades, SNI passthrough) to the route's target.

Socket → stream: read only as much as the stream accepts now (:meth:`ByteStream.writable`, a
tunnel stream's credit), so a slow tunnel stops reading the socket (TCP pushes back on the
sender) instead of queueing. Stream → socket: the next chunk is taken (and its credit returned)
only after the socket accepted the previous one.

Idleness (no byte either way for a while) is tracked once, by :class:`IdleWatch`, for this relay
and for every other copy loop of a relayed connection: the loops only stamp the time.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from types import TracebackType

from ravenproxy.errors import RavenProxyError
from ravenproxy.transport.bytestream import READ_LIMIT, ByteStream
from ravenproxy.transport.tunnel_stream import StreamClosedError

log = logging.getLogger(__name__)

__all__ = ["IDLE_ERROR", "READ_LIMIT", "IdleTimeout", "IdleWatch", "RelayResult", "relay"]


class IdleTimeout(RavenProxyError):
    """No byte moved either way on a relayed connection for its idle timeout."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no byte either way for {timeout:g}s")
        self.timeout = timeout


class IdleWatch:
    """An ``asyncio.timeout`` that activity pushes back: the block it guards is cancelled (and
    leaves with :class:`IdleTimeout`) once no one called :meth:`touch` for ``timeout`` seconds.
    ``timeout`` None: never. It may guard one block after another (not two at once).

    The copy loops call :meth:`touch` per chunk, which only stamps the loop's clock; one timer
    per connection checks the stamp when it is due and re-arms itself for the stamp's deadline,
    so a busy connection costs no timer work per chunk.
    """

    __slots__ = ("_cm", "_loop", "_timer", "last", "timeout")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._loop = asyncio.get_running_loop()
        self.last = self._loop.time()
        self._cm: asyncio.Timeout | None = None
        self._timer: asyncio.TimerHandle | None = None

    def touch(self) -> None:
        """A byte moved: the connection is not idle."""
        self.last = self._loop.time()

    async def __aenter__(self) -> IdleWatch:
        self.touch()
        self._cm = asyncio.timeout(None)
        await self._cm.__aenter__()
        if self.timeout is not None:
            self._timer = self._loop.call_at(self.last + self.timeout, self._check)
        return self

    def _check(self) -> None:
        assert self.timeout is not None and self._cm is not None
        due = self.last + self.timeout
        now = self._loop.time()
        if now >= due - 0.001:  # timers may fire a clock tick early
            self._timer = None
            self._cm.reschedule(now)  # cancels the guarded block at once
        else:
            self._timer = self._loop.call_at(due, self._check)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        assert self._cm is not None
        try:
            await self._cm.__aexit__(exc_type, exc, tb)  # never swallows: returns None
        except TimeoutError:  # raised by the timeout itself: only when it expired
            assert self.timeout is not None
            raise IdleTimeout(self.timeout) from None
        finally:
            self._cm = None


@dataclass(slots=True)
class RelayResult:
    bytes_up: int = 0
    """Socket → upstream."""
    bytes_down: int = 0
    """Upstream → socket."""
    error: str = ""
    idle: bool = False
    """Closed because no byte moved either way for the idle timeout."""


IDLE_ERROR = "idle timeout"
"""The error a relay closed for idleness reports."""


async def relay(
    upstream: ByteStream,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    initial_up: bytes = b"",
    initial_down: bytes = b"",
    idle_timeout: float | None = None,
    label: str = "",
) -> RelayResult:
    """Copy socket ⇄ ``upstream`` until both sides finished (half-close carried) or either
    failed, or no byte moved either way for ``idle_timeout`` seconds (``idle`` set in the
    result). Always closes the socket and the upstream. ``initial_up`` was already read from the
    socket and belongs upstream; ``initial_down`` was already read from upstream.

    A socket that cannot half-close (TLS) ends the relay once upstream is done: there is no
    other way to tell its peer."""
    result = RelayResult()
    _tune(writer)
    watch = IdleWatch(idle_timeout)

    async def up() -> None:
        if initial_up:
            await upstream.write(initial_up)
            result.bytes_up += len(initial_up)
        while True:
            # Read only as much as upstream takes now (a tunnel stream's credit): a slow
            # tunnel stops reading the socket, and TCP pushes back on the sender.
            room = await upstream.writable()
            data = await reader.read(min(room, READ_LIMIT))
            if not data:
                await upstream.write_eof()
                return
            await upstream.write(data)
            result.bytes_up += len(data)
            watch.touch()

    async def down() -> None:
        if initial_down:
            writer.write(initial_down)
            result.bytes_down += len(initial_down)
            await writer.drain()
        while True:
            chunk = await upstream.read()
            if not chunk:
                if writer.can_write_eof() and not writer.is_closing():
                    writer.write_eof()
                return
            writer.write(chunk)
            result.bytes_down += len(chunk)
            watch.touch()
            await writer.drain()

    half_close = writer.can_write_eof()
    suffix = f":{label}" if label else ""
    up_task = asyncio.create_task(up(), name=f"relay-up{suffix}")
    down_task = asyncio.create_task(down(), name=f"relay-down{suffix}")
    # One future that either direction's end completes, rather than an asyncio.wait() per
    # turn (a future and callbacks of its own for each wait, held by every idle relay).
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def one_ended(_: asyncio.Task[None]) -> None:
        if not ended.done():
            ended.set_result(None)

    up_task.add_done_callback(one_ended)
    down_task.add_done_callback(one_ended)
    try:
        pending = [up_task, down_task]
        async with watch:
            while pending:
                await ended
                done = [task for task in pending if task.done()]
                pending = [task for task in pending if not task.done()]
                ended = asyncio.get_running_loop().create_future()  # one_ended sees the new one
                failures = [exc for task in done if (exc := task.exception()) is not None]
                if failures:
                    # One direction failed: the other has nothing sensible left to do.
                    exc = failures[0]
                    if isinstance(exc, StreamClosedError):
                        result.error = str(exc)
                    else:
                        result.error = f"socket: {exc!r}"
                        upstream.abort("socket error")
                elif down_task not in done or half_close:
                    continue
                for other in pending:
                    other.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                pending = []
    except IdleTimeout:
        result.error, result.idle = IDLE_ERROR, True
        upstream.abort(IDLE_ERROR)
        up_task.cancel()
        down_task.cancel()
        await asyncio.gather(up_task, down_task, return_exceptions=True)
    except asyncio.CancelledError:
        upstream.abort("relay cancelled")
        up_task.cancel()
        down_task.cancel()
        await asyncio.gather(up_task, down_task, return_exceptions=True)
        raise
    finally:
        if result.error:
            writer.transport.abort()
        else:
            writer.close()
        upstream.close()
    return result


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    writer.transport.set_write_buffer_limits(high=READ_LIMIT)
