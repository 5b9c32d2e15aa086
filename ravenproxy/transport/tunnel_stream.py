"""A byte stream inside a tunnel (:class:`TunnelStream`) and how one ends in error.

The stream is driven by its :class:`~ravenproxy.transport.session.Session`, seen here only
through :class:`StreamOwner` (what a stream asks of its session), so that this module needs
nothing above the wire protocol.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

from ravenproxy.errors import RavenProxyError
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.frames import Target


class _Config(Protocol):
    @property
    def wire(self) -> WireConfig: ...


class StreamOwner(Protocol):
    """The session of a stream, as the stream uses it."""

    @property
    def conn(self) -> Connection: ...

    @property
    def config(self) -> _Config: ...

    def _consumed(self, sid: int, n: int) -> None: ...

    def _wait_window(self, stream: TunnelStream) -> None: ...

    def _flush(self) -> None: ...

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
    """A bidirectional byte stream inside the tunnel, with backpressure both ways."""

    def __init__(self, session: StreamOwner, stream_id: int, target: Target) -> None:
        self.session = session
        self.id = stream_id
        self.target = target
        self._chunks: collections.deque[bytes] = collections.deque()
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._eof = False
        self._error: StreamClosedError | None = None
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.bytes_in = 0
        self.bytes_out = 0

    # -- called by the session ------------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._readable.set()

    def _feed_eof(self) -> None:
        self._eof = True
        self._readable.set()

    def _fail(self, error: StreamClosedError) -> None:
        if self._error is None:
            self._error = error
        # Buffered bytes will never be read: hand their credit back now.
        dropped = sum(len(c) for c in self._chunks)
        self._chunks.clear()
        if dropped:
            self.session._consumed(self.id, dropped)
        self._readable.set()
        self._writable.set()
        if not self._opened.done():
            self._opened.set_exception(error)
            self._opened.exception()  # mark retrieved: nobody may be waiting any more

    def _wake_writer(self) -> None:
        self._writable.set()

    # -- public ----------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._error is not None

    @property
    def buffered(self) -> int:
        return sum(len(c) for c in self._chunks)

    async def read(self) -> bytes:
        """The next chunk, or ``b""`` once the peer half-closed. Reading returns credit."""
        while not self._chunks:
            if self._error is not None:
                raise self._error.fresh()
            if self._eof:
                return b""
            self._readable.clear()
            await self._readable.wait()
        chunk = self._chunks.popleft()
        self.bytes_in += len(chunk)
        self.session._consumed(self.id, len(chunk))
        return chunk

    async def write(self, data: bytes | memoryview) -> None:
        """Send all of ``data``, waiting for credit as needed."""
        view = memoryview(data)
        while view:
            room = await self.writable()
            chunk = view[:room]
            self.session.conn.send_data(self.id, chunk)
            self.bytes_out += len(chunk)
            view = view[room:]
            self.session._flush()
        if self.session.conn.pending_bytes > self.session.config.wire.max_message_size:
            await self.session._drained()

    async def writable(self) -> int:
        """Wait until some credit is available; return how much."""
        while True:
            if self._error is not None:
                raise self._error.fresh()
            room = self.session.conn.send_window(self.id)
            if room > 0:
                return room
            self._writable.clear()
            self.session._wait_window(self)
            await self._writable.wait()

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
