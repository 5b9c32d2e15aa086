"""A byte stream inside a tunnel (:class:`TunnelStream`) and how one ends in error.

The stream is driven by its :class:`~ravenproxy.transport.session.Session`, seen here only
through :class:`StreamOwner` (what a stream asks of its session), so that this module needs
nothing above the wire protocol.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Protocol

from ravenproxy.errors import RavenProxyError
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.frames import Target
from ravenproxy.wire.streams import Stream


class _Config(Protocol):
    @property
    def wire(self) -> WireConfig: ...


class StreamOwner(Protocol):
    """The session of a stream, as the stream uses it."""

    @property
    def conn(self) -> Connection: ...

    @property
    def config(self) -> _Config: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def _consumed(self, stream: Stream | None, n: int) -> None: ...

    def _wait_window(self, stream: TunnelStream) -> None: ...

    def _flush(self) -> None: ...

    def _write_through(self, stream: Stream | None, data: bytes | memoryview) -> bool: ...

    async def _drained(self) -> None: ...

    def _forget(self, sid: int) -> None: ...


class StreamClosedError(RavenProxyError):
    """The stream was reset (by either side) or its tunnel went away."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message

    def fresh(self) -> StreamClosedError:
        """A new instance to raise: re-raising one shared instance from many tasks would chain
        every raise into its traceback (and make logging it very slow)."""
        return type(self)(self.code, self.message)


class OpenError(StreamClosedError):
    """The peer refused to open the stream, or did not answer in time."""


class TunnelStream:
    """A bidirectional byte stream inside the tunnel, with backpressure both ways.

    An idle stream is the common case at scale (thousands of open, silent connections), so it
    holds as little as it can: slots, no receive buffer until the first chunk, and a waiting
    read or write holds one future, created when it starts to wait (not two ``asyncio.Event``
    objects per stream, each with its own deque).
    """

    __slots__ = (
        "_chunks",
        "_eof",
        "_error",
        "_on_chunk",
        "_on_readable",
        "_opened",
        "_read_waiters",
        "_wire",
        "_write_waiters",
        "bytes_in",
        "bytes_out",
        "id",
        "session",
        "target",
    )

    def __init__(self, session: StreamOwner, stream_id: int, target: Target) -> None:
        self.session = session
        self.id = stream_id
        self.target = target
        self._wire = session.conn.streams.get(stream_id)
        """The wire's stream, whose credit a chunk read returns (``conn.consumed_on``) and on
        which a small write goes through (``send_small_on``): not looked up by id again per
        chunk and write. None if it already ended (as the id would find nothing)."""
        self._chunks: collections.deque[bytes | memoryview] | None = None
        """Received, not yet read; created with the first chunk."""
        self._read_waiters: list[asyncio.Future[None]] | None = None
        self._write_waiters: list[asyncio.Future[None]] | None = None
        self._eof = False
        self._error: StreamClosedError | None = None
        self._opened: asyncio.Future[None] | None = None
        """The OPEN_RESULT, while this side waits for it (:meth:`_opening`)."""
        self._on_readable: Callable[[], None] | None = None
        """Called, instead of waking a waiting :meth:`read`, when a chunk, the end or an error
        arrives (:meth:`on_readable`)."""
        self._on_chunk: Callable[[bytes | memoryview], bool] | None = None
        """Offered each chunk that arrives while none is held (:meth:`on_readable`)."""
        self.bytes_in = 0
        self.bytes_out = 0

    # -- called by the session ------------------------------------------------------------
    def _opening(self) -> asyncio.Future[None]:
        """The future the peer's OPEN_RESULT completes (this side opened the stream)."""
        self._opened = self.session.loop.create_future()
        return self._opened

    def _accepted(self) -> None:
        opened, self._opened = self._opened, None  # nothing to keep once it is answered
        if opened is not None and not opened.done():
            opened.set_result(None)

    def _feed(self, data: bytes | memoryview) -> None:
        take = self._on_chunk
        if take is not None and not self._chunks and take(data):
            # Taken as it came (a chunk a request, on the agent): read, as read_nowait counts
            # it, without holding it for a callback to read back.
            n = len(data)
            self.bytes_in += n
            session = self.session
            conn = session.conn
            if not conn.closed and conn.consumed_on(self._wire, n):
                session._flush()
            return
        if self._chunks is None:
            self._chunks = collections.deque()
        self._chunks.append(data)
        # _wake_readers, written out: a chunk a request, on both ends, in the read callback.
        waiters = self._read_waiters
        if waiters is not None:
            self._read_waiters = None
            _wake(waiters)
        callback = self._on_readable
        if callback is not None:
            callback()

    def _feed_eof(self) -> None:
        self._eof = True
        self._wake_readers()

    def _fail(self, error: StreamClosedError) -> None:
        if self._error is None:
            self._error = error
        # Buffered bytes will never be read: hand their credit back now.
        if self._chunks:
            dropped = sum(len(c) for c in self._chunks)
            self._chunks.clear()
            self.session._consumed(self._wire, dropped)
        self._wake_readers()
        self._wake_writer()
        if self._opened is not None and not self._opened.done():
            self._opened.set_exception(error)
            self._opened.exception()  # mark retrieved: nobody may be waiting any more

    def _wake_readers(self) -> None:
        waiters, self._read_waiters = self._read_waiters, None
        if waiters:
            _wake(waiters)
        if self._on_readable is not None:
            self._on_readable()

    def _wake_writer(self) -> None:
        waiters, self._write_waiters = self._write_waiters, None
        if waiters:
            _wake(waiters)

    # -- public ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._error is not None

    @property
    def ended(self) -> bool:
        """Nothing more will arrive: the peer half-closed, or the stream was reset or lost
        (chunks received before may still be waiting)."""
        return self._eof or self._error is not None

    @property
    def buffered(self) -> int:
        return sum(len(c) for c in self._chunks) if self._chunks else 0

    async def read(self) -> bytes | memoryview:
        """The next chunk, or ``b""`` once the peer half-closed. Reading returns credit. A
        chunk may be a view into the tunnel message it came in (read-only; no copy)."""
        while not self._chunks:
            if self._error is not None:
                raise self._error.fresh()
            if self._eof:
                return b""
            waiters = self._read_waiters
            if waiters is None:
                waiters = self._read_waiters = []
            # Waited here, not in a helper coroutine: an idle stream's reader holds one frame
            # less.
            fut = self.session.loop.create_future()
            waiters.append(fut)
            try:
                await fut
            finally:
                _forget(waiters, fut)
        chunk = self._chunks.popleft()
        self.bytes_in += len(chunk)
        self.session._consumed(self._wire, len(chunk))
        return chunk

    def on_readable(
        self,
        callback: Callable[[], None] | None,
        take: Callable[[bytes | memoryview], bool] | None = None,
    ) -> None:
        """Serve the stream by callbacks (a relay without a task per direction): ``callback``
        runs, from the session's reader (the tunnel's read callback), when a chunk, the end or
        an error arrives; it takes them with :meth:`read_nowait`. None: stop.

        ``take``: each chunk that arrives while the stream holds none is offered to it first;
        it returns whether it took the chunk (passed it on), which then counts as read
        (:meth:`read_nowait`'s count and credit), with no call of ``callback`` to read it back
        (a call and a read a chunk). A chunk not taken is held and ``callback`` called, as
        without ``take``; none overtakes one held."""
        self._on_readable = callback
        self._on_chunk = take

    def read_nowait(self) -> bytes | memoryview | None:
        """:meth:`read` without waiting: None while nothing has arrived."""
        if not self._chunks:
            if self._error is not None:
                raise self._error.fresh()
            return b"" if self._eof else None
        chunk = self._chunks.popleft()
        n = len(chunk)
        self.bytes_in += n
        # session._consumed, written out (a chunk a request, on both ends).
        session = self.session
        conn = session.conn
        if not conn.closed and conn.consumed_on(self._wire, n):
            session._flush()
        return chunk

    def try_write(self, data: bytes | memoryview) -> int:
        """:meth:`write` without waiting: as much of ``data`` as the credit at hand and the
        room in the session's output allow goes now; returns how much (the rest is for
        :meth:`write`)."""
        if self._error is not None:
            return 0
        session = self.session
        if session._write_through(self._wire, data):  # a small write: through, or queued once
            n = len(data)
            self.bytes_out += n
            return n
        conn = session.conn
        limit = session.config.wire.max_message_size
        n = conn.send_upto(self.id, data, limit - conn.outbox.pending_bytes)
        if n:
            self.bytes_out += n
            session._flush()
        return n

    async def write(self, data: bytes | memoryview) -> None:
        """Send all of ``data``, waiting for credit as needed."""
        session = self.session
        if self._error is None and session._write_through(self._wire, data):
            # A small write, as try_write sends it: written through, or queued behind a
            # burst's output (the drain below would not wait: the queue stays within one
            # message).
            self.bytes_out += len(data)
            return
        if self._error is None and 0 < len(data) <= session.conn.send_window(self.id):
            # The common small write: credit at hand, one frame, no waiting.
            session.conn.send_data(self.id, data)
            self.bytes_out += len(data)
            session._flush()
            if session.conn.outbox.pending_bytes > session.config.wire.max_message_size:
                await session._drained()
            return
        view = memoryview(data)
        while view:
            room = await self.writable()
            chunk = view[:room]
            session.conn.send_data(self.id, chunk)
            self.bytes_out += len(chunk)
            view = view[room:]
            session._flush()
        if session.conn.outbox.pending_bytes > session.config.wire.max_message_size:
            await session._drained()

    def room(self) -> int:
        """The credit available now (0: :meth:`writable` would wait); 1 on a failed stream,
        whose :meth:`writable` raises at once."""
        if self._error is not None:
            return 1
        return self.session.conn.send_window(self.id)

    async def writable(self) -> int:
        """Wait until some credit is available; return how much."""
        while True:
            if self._error is not None:
                raise self._error.fresh()
            room = self.session.conn.send_window(self.id)
            if room > 0:
                return room
            self.session._wait_window(self)
            waiters = self._write_waiters
            if waiters is None:
                waiters = self._write_waiters = []
            fut = self.session.loop.create_future()
            waiters.append(fut)
            try:
                await fut
            finally:
                _forget(waiters, fut)

    def write_eof(self) -> None:
        """Half-close: no more data from this side."""
        if self._error is None and self.id in self.session.conn.streams:
            stream = self.session.conn.streams[self.id]
            if stream.can_send:
                self.session.conn.end_stream(self.id)
                self.session._flush()

    def reset(self, code: ErrorCode = ErrorCode.CANCEL, message: str = "") -> None:
        if self._error is None:
            self.session.conn.reset_stream(self.id, code, message)
            self.session._flush()
            self._fail(StreamClosedError(code, message or "reset locally"))
        self.session._forget(self.id)

    def accept(self) -> None:
        self.session.conn.accept_stream(self.id)
        self.session._flush()

    def reject(self, code: ErrorCode, message: str) -> None:
        self.session.conn.reject_stream(self.id, code, message)
        self.session._flush()
        self._fail(StreamClosedError(code, message))
        self.session._forget(self.id)

    def close(self) -> None:
        """The application is done with this stream: reset it unless both sides already
        finished cleanly, and forget it. Idempotent."""
        if self.id in self.session.conn.streams and self._error is None:
            self.reset(ErrorCode.CANCEL, "closed by the application")
        self.session._forget(self.id)


def _wake(waiters: list[asyncio.Future[None]] | None) -> None:
    """Wake every waiter of one direction: each checks again what it waits for (the stream
    forgot the list: a waiter that waits again starts a new one)."""
    if waiters:
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def _forget(waiters: list[asyncio.Future[None]], fut: asyncio.Future[None]) -> None:
    """A waiter stops waiting: one cancelled (not woken) leaves its list, which the stream may
    still hold (a woken one's list the stream already dropped). The waiter's own list, not the
    stream's attribute read again after the ``await``: a waiter cancelled just before the
    stream woke its list finds the attribute ``None`` (mypy's narrowing hides it)."""
    if fut.cancelled():
        with contextlib.suppress(ValueError):
            waiters.remove(fut)
