"""The lending reader: a :class:`~ravenproxy.transport.socket_stream.SocketStream`'s protocol
once it reads in bulk.

uvloop reads a plain :class:`asyncio.Protocol`'s data into a buffer of its own, then copies each
read into a new ``bytes``. A :class:`Lender` (an :class:`asyncio.BufferedProtocol`) reads into
buffers of its own instead and hands each read to its stream as a read-only view of them; a
buffer is read into again once no view of it is held (as the tunnel's WebSocket reader does it),
found by its reference count. The buffers' size adapts to the pace (:data:`LEND_SMALL` to
:data:`LEND_READ` and back), and they are let go when the stream is idle (:meth:`Lender.release`).
"""

from __future__ import annotations

import asyncio
import collections
import sys
from typing import Protocol

LEND_FROM = 64 * 1024
"""A read at least this large (bulk) switches a stream that may lend to reading into buffers
of its own (see the module's doc); smaller traffic never does."""

LEND_READ = 1024 * 1024 - 12
"""Size of those buffers while the bulk is fast: the wire's default largest frame
(``WireConfig.max_frame_size``, a 1 MiB message with its 12-byte header), so a full read goes
into the tunnel as one DATA frame, which the agent keeps in place."""

LEND_SMALL = 256 * 1024
"""Size of those buffers to start with, and again once the reads are small: a read that fills
all the room it was offered (the socket held more) makes the next buffers :data:`LEND_READ`;
two reads in a row under :data:`LEND_FROM` that left room make them this size again (as
Netty's adaptive receive buffers: a slow upload does not hold a 1 MiB buffer and spares)."""

LEND_ROOM = 16 * 1024
"""Room a buffer must have left to be read into again before its views are let go."""

LEND_SPARES = 4
"""Buffers a lending stream keeps to read into once the views of them are let go."""

LEND_IDLE = 1.0
"""Seconds a lending stream's reader waits for data before the stream lets its buffers go."""


def _unshared_refs() -> int:
    buf = bytearray()
    return sys.getrefcount(buf)


_UNSHARED = _unshared_refs()
"""What ``sys.getrefcount`` says of a buffer with one reference (an attribute, a list slot):
more means a view of it is still held by whoever read it."""


class Borrower(Protocol):
    """What a :class:`Lender` serves: the stream it reads for (a ``SocketStream``), which gets
    each read as a view and every other protocol callback."""

    def _lent(self, view: memoryview) -> None: ...

    def eof_received(self) -> bool | None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


class Lender(asyncio.BufferedProtocol):
    """A lending :class:`SocketStream`'s protocol: reads into buffers of its own and hands each
    read to the stream as a read-only view; every other callback goes to the stream."""

    __slots__ = (
        "buf",
        "connection_lost",
        "end",
        "eof_received",
        "pause_writing",
        "pending",
        "resume_writing",
        "size",
        "small_reads",
        "spares",
        "stream",
        "views",
    )

    def __init__(self, stream: Borrower) -> None:
        self.stream = stream
        self.buf: bytearray | None = None
        self.end = 0
        self.size = LEND_SMALL
        """Size of the next buffer made (:data:`LEND_SMALL` or :data:`LEND_READ`)."""
        self.small_reads = 0  # reads in a row under LEND_FROM that left room
        self.spares: list[bytearray] = []
        self.views: collections.deque[memoryview] = collections.deque()
        self.pending = 0
        self.eof_received = stream.eof_received  # type: ignore[method-assign]
        self.connection_lost = stream.connection_lost  # type: ignore[method-assign]
        self.pause_writing = stream.pause_writing  # type: ignore[method-assign]
        self.resume_writing = stream.resume_writing  # type: ignore[method-assign]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.buf is not None:
            if len(self.buf) != self.size:
                self.buf = None  # not the size wanted now: let it go (its views keep it)
            elif sys.getrefcount(self.buf) <= _UNSHARED:
                self.end = 0  # no view of it is held: read into it from the start
        if self.buf is None or len(self.buf) - self.end < LEND_ROOM:
            self._next_buffer()
        assert self.buf is not None
        return memoryview(self.buf)[self.end :]

    def _next_buffer(self) -> None:
        """A buffer of the wanted size no view is held of: a spare that is free again, else a
        new one; the one whose views are still held becomes a spare (spares are all of the
        wanted size: see :meth:`_resize`)."""
        spares = self.spares
        fresh = None
        for i in range(len(spares)):
            if sys.getrefcount(spares[i]) <= _UNSHARED:
                fresh = spares.pop(i)
                break
        if self.buf is not None and len(spares) < LEND_SPARES:  # of that size: see get_buffer
            spares.append(self.buf)
        self.buf = fresh if fresh is not None else bytearray(self.size)
        self.end = 0

    def _resize(self, size: int) -> None:
        """Make the next buffers ``size``; spares of the old size go (the current one, once
        no view of it is held)."""
        self.size = size
        self.spares.clear()

    def release(self) -> None:
        """Let go of the buffers (views handed out keep theirs alive as long as they need); the
        next ones start small again (the pace after an idle spell is not known)."""
        self.buf = None
        self.end = 0
        self._resize(LEND_SMALL)
        self.small_reads = 0

    def buffer_updated(self, nbytes: int) -> None:
        assert self.buf is not None
        start = self.end
        self.end += nbytes
        if nbytes == len(self.buf) - start:  # all the room offered: the socket held more
            self.small_reads = 0
            if nbytes >= LEND_FROM and self.size != LEND_READ:
                self._resize(LEND_READ)  # bulk: read more at once
        elif nbytes < LEND_FROM:
            self.small_reads += 1
            if self.small_reads == 2 and self.size != LEND_SMALL:
                self._resize(LEND_SMALL)
            if nbytes < LEND_ROOM and self.spares:
                self.spares.clear()  # the bulk is over: an idle connection keeps one buffer
        else:
            self.small_reads = 0
        self.stream._lent(memoryview(self.buf)[start : self.end].toreadonly())
