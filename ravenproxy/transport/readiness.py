"""Whether more input is waiting in this loop turn: the signal that lets a session write small
output through at once (a lone request) and still send a burst's output in one write.

The event loop (libuv's epoll, and asyncio's selector) takes a whole batch of ready sockets,
then runs their read callbacks one after the other. Its epoll is level-triggered: a socket whose
callback is still to come in the batch is still *readable* (its data unread) while an earlier
callback runs. A second, level-triggered ``epoll`` of our own (:class:`Readiness`, one per loop)
holds the sockets whose input can queue tunnel output: the server's front connections and
tunnel sockets, the agent's target connections and tunnel socket. ``poll(0, 1)`` on it, one
syscall that never blocks, says whether any of them has input waiting, in this batch or just
arrived. Decrypted bytes OpenSSL holds for a read in the next turn make no readiness: the TLS
transport that schedules such a read counts itself in :attr:`Readiness.soon` until it runs.

A socket is registered when its connection is made and never unregistered: the kernel drops a
closed descriptor from every epoll set, and a late ``unregister`` could remove the new socket
of a reused descriptor number. "More input" is only ever a reason to leave the write to the
session's writer (what every write did before): a socket that stays readable (reading paused
with data waiting) costs that, never lost or late output. A socket whose peer ended its input
is left out (:meth:`Readiness.quiet`, from ``eof_received``): half-closed, it is readable for ever.

Asked once a burst: once a poll said "more" (:attr:`Readiness.seen`), every later write of the
same loop turn waits for the turn's end too, without a poll of its own (what a poll would mostly
say: the batch's next socket is still unread). Each writer that waited writes at the turn's end
(its ``call_soon``), before the loop polls again; the first of them clears ``seen``.
"""

from __future__ import annotations

import asyncio
import select
import weakref
from typing import Any


class Readiness:
    """The readable-input probe of one event loop (:func:`of`)."""

    __slots__ = ("_epoll", "poll", "seen", "soon")

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self.poll = self._epoll.poll
        """``epoll.poll``: ``poll(0, 1)`` is :meth:`more_input` without :attr:`soon` (a session's
        flush asks it inline); ValueError once closed."""
        self.soon: set[object] = set()
        """TLS transports with decrypted bytes to read in the next turn (no readiness event)."""
        self.seen = False
        """A poll said "more input" in this loop turn: the turn's later writes wait for its end
        without asking again. Set by the session whose poll said so, cleared by the first
        write at the turn's end (a session's ``call_soon``, which the setter made or had made:
        each poll that says more leaves one pending)."""

    def watch(self, transport: Any) -> None:
        """Count ``transport``'s socket from now on (until it is closed)."""
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd < 0 or self._epoll.closed:
            return
        try:
            self._epoll.register(fd, select.EPOLLIN)
        except FileExistsError:  # this socket again (the entry is keyed by socket and number)
            pass

    def quiet(self, transport: Any) -> None:
        """Stop counting ``transport``'s socket: its peer ended its input (``eof_received``),
        and a half-closed socket kept open for our half stays readable for ever, which would
        leave every write of the process to the writers. Its errors are still reported."""
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0 and not self._epoll.closed:
            try:
                self._epoll.modify(fd, 0)
            except FileNotFoundError:  # a socket that was not watched (a direct route's)
                pass

    def more_input(self) -> bool:
        """Whether a watched socket has input waiting (or a TLS read is due next turn, or a poll
        said so earlier in this turn)."""
        if self.soon or self.seen:
            return True
        try:
            return bool(self.poll(0, 1))
        except ValueError:  # closed: say more, so the writer writes, as without the probe
            return True

    def close(self) -> None:
        self._epoll.close()


_OF: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Readiness] = weakref.WeakKeyDictionary()


def of(loop: asyncio.AbstractEventLoop) -> Readiness:
    """``loop``'s probe, made on first use (the server and the agent make it as they start:
    its descriptor is not a connection's); closed by :func:`release`, or when the loop is let
    go."""
    probe = _OF.get(loop)
    if probe is None:
        probe = _OF[loop] = Readiness()
        weakref.finalize(loop, probe.close)
    return probe


def release(loop: asyncio.AbstractEventLoop) -> None:
    """Close ``loop``'s probe (at shutdown). Sessions still holding it leave every write to
    their writer; a later :func:`of` makes a new one."""
    probe = _OF.pop(loop, None)
    if probe is not None:
        probe.close()


def watch(transport: asyncio.BaseTransport) -> None:
    """Count a connection's socket in the running loop's probe (from ``connection_made``)."""
    of(asyncio.get_running_loop()).watch(transport)


def quiet(transport: asyncio.BaseTransport) -> None:
    """Stop counting a connection's socket once its peer ended its input (``eof_received``)."""
    probe = _OF.get(asyncio.get_running_loop())
    if probe is not None:
        probe.quiet(transport)
