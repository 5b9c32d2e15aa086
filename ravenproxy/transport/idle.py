"""Idleness of a relayed connection: no byte either way for a while (--idle-timeout, the HTTP
fronts' keep-alive timeout). Tracked once per connection by an :class:`IdleWatch` that the copy
loops and callbacks only stamp, checked by one timer per event loop and timeout value
(:class:`_Sweep`)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import sys
import termios
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any, ClassVar

from ravenproxy.errors import RavenProxyError
from ravenproxy.transport.socket_stream import SocketStream, SocketWriter


class IdleTimeout(RavenProxyError):
    """No byte moved either way on a relayed connection for its idle timeout."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no byte either way for {timeout:g}s")
        self.timeout = timeout


class IdleWatch:
    """An ``asyncio.timeout`` that activity pushes back: the block it guards is cancelled (and
    leaves with :class:`IdleTimeout`) once no one called :meth:`touch` for ``timeout`` seconds.
    ``timeout`` None: never. It may guard one block after another (not two at once).

    The copy loops call :meth:`touch` per chunk, which only stamps the loop's clock. The
    stamps are checked by one timer per event loop and timeout value (:class:`_Sweep`), not one
    per connection: an idle connection's own timer was a large part of what it held.

    ``turns``: for a connection that waits by turns for different things (the HTTP fronts'
    callbacks: a next request, an answer), the timeout of the turn it is in, asked only when
    its sweep looks (rarely) and at its expiry: a turn then changes nothing but the stamp
    (:meth:`touch`), where :meth:`retime` switched the timeout twice a request. ``timeout`` is
    then the sweep it waits in: no longer than any ``turns`` answers.
    """

    __slots__ = (
        "_cancelling",
        "_expired",
        "_loop",
        "_sweep",
        "_task",
        "clock",
        "last",
        "timeout",
        "turns",
    )

    def __init__(self, timeout: float | None, turns: Callable[[], float] | None = None) -> None:
        self.timeout = timeout
        self.turns = turns
        self._loop = asyncio.get_running_loop()
        self.clock = self._loop.time
        """The loop's clock, for :meth:`touch` written out where a chunk a request stamps
        (``watch.last = watch.clock()``: the front's splice): the call to :meth:`touch` was
        half of what a stamp cost (~380 of ~780 instructions)."""
        self.last = self._loop.time()
        self._task: asyncio.Task[Any] | None = None
        self._expired = False
        self._cancelling = 0
        self._sweep: _Sweep | None = None

    def touch(self) -> None:
        """A byte moved: the connection is not idle. (Written out as ``watch.last =
        watch.clock()`` where it is per request.)"""
        self.last = self.clock()

    def timeout_now(self) -> float | None:
        """The timeout the guarded block has now (its turn's, with ``turns``)."""
        return self.timeout if self.turns is None else self.turns()

    def retime(self, timeout: float | None) -> None:
        """Guard the block being guarded with another ``timeout`` from now on (its clock
        restarts): one watch for a connection that waits by turns for different things.
        An expired watch keeps the timeout it expired with."""
        self.last = self._loop.time()
        if timeout == self.timeout or self._expired:
            return
        self.timeout = timeout
        sweep = self._sweep
        if sweep is not None and timeout is not None and sweep.timeout <= timeout:
            # Longer: it stays where it is, checked early and often enough (a sweep looks at
            # each watch's own timeout). A keep-alive connection switching between its two
            # timeouts per request then moves once, not twice a request.
            return
        if sweep is not None:
            sweep.remove(self)
            self._sweep = None
        if self._task is not None and timeout is not None:
            self._sweep = _Sweep.of(self._loop, timeout)
            self._sweep.add(self)

    # Entered once per read on a keep-alive connection: the guard is the watch itself (the
    # task it cancels, a flag), not an asyncio.timeout made and torn down each time.
    async def __aenter__(self) -> IdleWatch:
        self.last = self._loop.time()
        self._task = task = asyncio.current_task(self._loop)
        assert task is not None
        self._expired = False
        self._cancelling = task.cancelling()
        if self.timeout is not None:
            self._sweep = _Sweep.of(self._loop, self.timeout)
            self._sweep.add(self)
        return self

    def _expire(self, now: float) -> None:
        """Cancel the guarded block at once (its exit turns that into :class:`IdleTimeout`)."""
        if self._task is not None:
            self._expired = True
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sweep is not None:
            self._sweep.remove(self)
            self._sweep = None
        task, self._task = self._task, None
        if self._expired:
            self._expired = False
            timeout = self.timeout_now()  # the turn it expired in: no turn was taken since
            assert task is not None and timeout is not None
            # Ours alone (no other cancellation pending): the block was idle. As
            # asyncio.timeout does it.
            if task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise IdleTimeout(timeout) from None


class _Sweep:
    """The one timer of every entered :class:`IdleWatch` with the same timeout on one event
    loop (or a longer one, retimed while in it: each expires by its own). It fires when the
    oldest stamp is due by the sweep's timeout, expires the watches that are, and re-arms
    for the oldest remaining stamp, but at most every ``min(timeout / 8, 60 s)``: with
    thousands of busy connections a check is a scan of all of them, so it must stay rare. A
    watch therefore expires at its due time, or up to that much later while others are busy.
    """

    __slots__ = ("loop", "timeout", "timer", "watches")

    _all: ClassVar[dict[tuple[asyncio.AbstractEventLoop, float], _Sweep]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop = loop
        self.timeout = timeout
        self.watches: dict[IdleWatch, None] = {}
        self.timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop, timeout: float) -> _Sweep:
        sweep = cls._all.get((loop, timeout))
        if sweep is None:
            # Sweeps of closed loops (whose timers will never fire) are dropped here.
            for key in [key for key in cls._all if key[0].is_closed()]:
                del cls._all[key]
            sweep = cls._all[(loop, timeout)] = cls(loop, timeout)
        return sweep

    def add(self, watch: IdleWatch) -> None:
        self.watches[watch] = None
        # An armed timer is due no later than this watch (its stamp is the newest).
        if self.timer is None:
            self.timer = self.loop.call_at(watch.last + self.timeout, self._check)

    def remove(self, watch: IdleWatch) -> None:
        # Emptied, the sweep stays (its timer armed) until the timer finds it empty: a
        # keep-alive connection enters and leaves its watch once per request, and a timer made
        # and cancelled each time was a good part of what a small request cost.
        self.watches.pop(watch, None)

    def _close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self._all.get((self.loop, self.timeout)) is self:
            del self._all[(self.loop, self.timeout)]

    def _check(self) -> None:
        self.timer = None
        now = self.loop.time()
        oldest = now
        for watch in list(self.watches):
            # Its own timeout: the sweep's, or longer (see IdleWatch.retime, IdleWatch.turns).
            own = watch.timeout if watch.turns is None else watch.turns()
            timeout = self.timeout if own is None else own
            if now >= watch.last + timeout - 0.001:  # timers may fire a tick early
                del self.watches[watch]  # expired once; its block's exit finds it gone
                watch._expire(now)
            elif watch.last < oldest:
                oldest = watch.last
        if not self.watches:
            self._close()
            return
        gap = min(self.timeout / 8, 60.0)
        self.timer = self.loop.call_at(max(oldest + self.timeout, now + gap), self._check)


async def drain_taken(writer: SocketWriter, watch: IdleWatch) -> None:
    """``writer.drain()`` inside ``watch`` (entered), the bytes its peer takes meanwhile
    touching it (:class:`Taken`)."""
    taken = Taken(writer.transport, watch)
    try:
        await taken.drain(writer)
    finally:
        taken.stop()


class Taken:
    """The rule for bytes that wait for a peer under an :class:`IdleWatch`: idle is no
    progress (HAProxy's ``timeout client``, Envoy's ``idle_timeout``), and a peer that reads
    steadily but slowly — one drain from the high mark down taking longer than the timeout —
    is not idle. From a drain that waits (:meth:`drain`, :meth:`waiting`) on, a timer looks
    every eighth of the watch's timeout (as late as its sweep may be), at most every minute,
    at what the peer has not taken (:func:`untaken`) and touches the watch when that went
    down, until the peer took everything — also after the drain, while what stayed below the
    low mark (a relay's: 256 KiB) goes: a peer that stops reading is cut one to 1.25 timeouts
    after the last byte it took. One timer at most per peer, none while its writer was not
    paused: the bulk path of a peer that keeps up is ``drain()``'s alone. Not looked at: a
    tail that never filled the buffer to its high mark, taken slower than the timeout. Its
    user calls :meth:`stop` at its end: :func:`drain_taken`, the relay's copy loops
    (:mod:`~ravenproxy.transport.relay`), the front's splice
    (:class:`~ravenproxy.transport.front_splice.FrontSplice`)."""

    __slots__ = ("left", "timer", "transport", "watch")

    def __init__(self, transport: asyncio.WriteTransport, watch: IdleWatch) -> None:
        self.transport = transport
        self.watch = watch
        self.left = 0
        """What the peer had not taken at the last look."""
        self.timer: asyncio.TimerHandle | None = None

    def drain(self, writer: SocketWriter) -> Coroutine[Any, Any, None]:
        """``writer.drain()``, looked at (:meth:`waiting`) unless it is a
        :class:`~ravenproxy.transport.socket_stream.SocketStream` not paused. (A plain
        function: no frame of its own per chunk.)"""
        if type(writer) is not SocketStream or writer.write_paused:
            self.waiting()
        return writer.drain()

    def waiting(self) -> None:
        """Bytes wait for the peer (its writer paused): it is looked at until it took them
        all (an armed look is left alone)."""
        if self.timer is None:
            self._arm(untaken(self.transport))

    def _arm(self, left: int) -> None:
        self.left = left
        timeout = self.watch.timeout_now()
        if timeout is not None:  # (never idle: nothing to look at)
            loop = self.watch._loop  # (the module's own)
            self.timer = loop.call_later(min(timeout / 8, 60.0), self._look)

    def _look(self) -> None:
        self.timer = None
        size = untaken(self.transport)
        if size < self.left:
            self.watch.touch()
        if size and not self.transport.is_closing():
            self._arm(size)

    def stop(self) -> None:
        """The writer is done (or gone): no more looks."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def untaken(transport: asyncio.WriteTransport) -> int:
    """Bytes written to a peer that it has not acknowledged: the transport's buffer and the
    kernel's send queue (``SIOCOUTQ``: the kernel tells a socket writable only once much of
    its queue is free, so the buffer alone may stand still for long while the peer reads)."""
    size = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):  # closed meanwhile: the buffer tells
            queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
            size += int.from_bytes(queued, sys.byteorder, signed=True)
    return size
