"""A socket's two directions as one slotted :class:`asyncio.Protocol`.

What the fronts and the relay use of asyncio's streams — ``read(n)`` on the reader; ``write``,
``drain``, ``write_eof``, ``close`` … on the writer — typed as :class:`SocketReader` and
:class:`SocketWriter`, which asyncio's :class:`~asyncio.StreamReader` and
:class:`~asyncio.StreamWriter` also satisfy.

:class:`SocketStream` is both, for the server's accepted front sockets and every dialled target
connection (:func:`ravenproxy.transport.bytestream.open_connection`): idle connections are the
common case at scale, and asyncio's trio (reader, writer, protocol: three objects with a
``__dict__`` each, a buffer, two futures, a weak reference) costs ~1 KiB more per connection than
one object with ``__slots__`` whose futures are made only while someone waits. Same semantics
for what is used: ``read(n)`` returns up to ``n`` buffered bytes, ``b""`` at EOF, raises what
ended the connection; reading pauses above ``limit`` buffered bytes (TCP pushes back); ``drain``
waits while the transport's write buffer is over its high mark and raises once the connection
is lost; an EOF keeps the transport open for writing (half-close), except over TLS.

Bulk uploads through the relay are read without the copy an :class:`asyncio.Protocol` costs
(uvloop reads into a buffer of its own, then copies each read into a new ``bytes``): a stream
the relay allows to (:meth:`SocketStream.lend_reads`) switches, at its first large read, to a
:class:`~ravenproxy.transport.lender.Lender` (an :class:`asyncio.BufferedProtocol`) that reads
into buffers of its own and hands the bytes on as read-only views of them
(:meth:`SocketStream.read_chunk`). A buffer is read into again once no view of it is held (as
the tunnel's WebSocket reader does it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, cast

from ravenproxy.transport.lender import LEND_FROM, LEND_IDLE, Lender
from ravenproxy.transport.readiness import quiet


class SocketReader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...

    def exception(self) -> BaseException | None:
        """What ended the connection, if it was lost to an error (a reset)."""
        ...


class SocketWriter(Protocol):
    @property
    def transport(self) -> asyncio.WriteTransport: ...

    def write(self, data: bytes | bytearray | memoryview) -> None: ...

    async def drain(self) -> None: ...

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...

    def close(self) -> None: ...

    def is_closing(self) -> bool: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class SocketStream(asyncio.Protocol):
    __slots__ = (
        "_buffer",
        "_drain_waiter",
        "_eof",
        "_error",
        "_lend",
        "_limit",
        "_loop",
        "_on_data",
        "_on_take",
        "_on_writing",
        "_over_ssl",
        "_read_paused",
        "_read_waiter",
        "_transport",
        "lost",
        "pending",
        "transport",
        "write_paused",
    )

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._transport: asyncio.Transport | None = None
        self.transport: asyncio.Transport
        """The socket's transport, from ``connection_made`` on (a plain attribute, not a
        property: read a few times a request)."""
        self._buffer: bytes | bytearray = b""
        self._eof = False
        self.lost = False
        """The connection is gone (``connection_lost`` ran): a plain attribute, not a property
        (a 3.11 property read is a Python call: the front's splice asks it a client read)."""
        self._error: BaseException | None = None
        self._read_paused = False
        self.write_paused = False
        """The transport's write buffer is over its high mark (what :meth:`drain` waits out);
        a plain attribute, kept by ``pause_writing``/``resume_writing``."""
        self._over_ssl = False
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._on_data: Callable[[], None] | None = None
        self._on_take: Callable[[bytes], bool] | None = None
        self._on_writing: asyncio.BaseProtocol | None = None
        self._lend: bool | Lender = False
        """True: may switch to lending at a large read; the lender once it did."""
        self.pending = False
        """Bytes, the EOF or the loss arrived that :meth:`read_nowait` did not return yet
        (False: it would return None). What the HTTP fronts' callbacks look at after an
        answer, rather than call a read that finds nothing (a call a request)."""

    # -- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = self.transport = cast(asyncio.Transport, transport)
        # Kept: on 3.11 each get_running_loop() is a getpid() syscall, and a future is made
        # per read that waits.
        self._loop = asyncio.get_running_loop()
        self._over_ssl = transport.get_extra_info("sslcontext") is not None

    def data_received(self, data: bytes) -> None:
        take = self._on_take
        if take is not None and not self._buffer and take(data):
            return  # taken as it came (on_data's take): nothing buffered, no callback
        self.pending = True
        if self._lend is True and len(data) >= LEND_FROM:
            self._start_lending()
        if not self._buffer:
            self._buffer = data  # the common case: no copy until a second chunk waits
        elif isinstance(self._buffer, bytearray):
            self._buffer += data
        else:
            self._buffer = bytearray(self._buffer) + data
        if not self._read_paused and len(self._buffer) > 2 * self._limit:
            assert self._transport is not None
            try:
                self._transport.pause_reading()
                self._read_paused = True
            except NotImplementedError:
                pass
        if self._read_waiter is not None:  # _wake_reader's check: a call a request spared
            self._wake_reader()
        # Loaded once, as an attribute: a bound method held in a slot and called as
        # ``self._on_data()`` is a LOAD_METHOD 3.11 leaves unspecialized (a chunk a request).
        callback = self._on_data
        if callback is not None:
            callback()

    def eof_received(self) -> bool:
        self._eof = self.pending = True
        quiet(self.transport)  # half-closed: readable for ever, no more input (readiness.py)
        self._wake_reader()
        if self._on_data is not None:
            self._on_data()
        return not self._over_ssl  # keep the transport open for our half of the stream

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = self.pending = True
        if exc is not None:
            self._error = exc
        self._eof = True
        self._wake_reader()
        self._wake_drainer()  # it sees the loss itself: no future ever holds an exception
        if self._on_data is not None:
            self._on_data()

    def pause_writing(self) -> None:
        self.write_paused = True
        if self._on_writing is not None:
            self._on_writing.pause_writing()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_drainer()
        if self._on_writing is not None:
            self._on_writing.resume_writing()

    def _wake_drainer(self) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_reader(self) -> None:
        waiter, self._read_waiter = self._read_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def ended(self) -> bool:
        """Nothing more will arrive: the peer half-closed, or the connection was lost (bytes
        received before may still be buffered)."""
        return self._eof

    # -- SocketReader -------------------------------------------------------------------------
    async def read(self, n: int = -1) -> bytes:
        while not self._buffer:
            if type(self._lend) is Lender and self._lend.views:
                return bytes(self._take_lent(n))
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._wait_data()
        return self._take(n)

    async def read_chunk(self, n: int = -1) -> bytes | memoryview:
        """:meth:`read`, but once the stream lends (:meth:`lend_reads`), a read-only view of
        the buffer it was read into rather than a copy: that part of the buffer is not read
        into again while the view is held."""
        while not self._buffer:
            lender = self._lend
            if type(lender) is Lender and lender.views:
                return self._take_lent(n)
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            if type(lender) is Lender:
                await self._wait_lending(lender)
            else:
                await self._wait_data()
        return self._take(n)

    async def _wait_lending(self, lender: Lender) -> None:
        """Wait for data; once none came for :data:`LEND_IDLE` seconds, the lender lets its
        buffers go: a connection idle after a bulk upload holds none (the next read takes one
        again). Not sooner: a bulk upload's reader catches up with the socket at most reads,
        and a buffer made anew per read costs its zeroing and page faults."""
        timer = self._loop.call_later(LEND_IDLE, lender.release)
        try:
            await self._wait_data()
        finally:
            timer.cancel()

    async def _wait_data(self) -> None:
        if self._read_waiter is not None:
            raise RuntimeError("read() called while another coroutine is waiting")
        self._read_waiter = self._loop.create_future()
        try:
            await self._read_waiter
        finally:
            self._read_waiter = None

    def exception(self) -> BaseException | None:
        return self._error

    def on_data(
        self, callback: Callable[[], None] | None, take: Callable[[bytes], bool] | None = None
    ) -> None:
        """Serve the reading side by callbacks: ``callback`` runs when bytes, the EOF or the
        loss of the connection arrive (after they are buffered); it takes them with
        :meth:`read_nowait`. None: stop.

        ``take``: bytes that arrive while nothing is buffered are offered to it first, as
        they come; True: it took them (they are not buffered, ``callback`` is not called);
        False: they are buffered and ``callback`` runs, as without it. The front's splice
        takes a client's small read so: not buffered, called back and read back (two reads,
        the second finding nothing) per request."""
        self._on_data = callback
        self._on_take = take

    def on_writing(self, protocol: asyncio.BaseProtocol | None) -> None:
        """``pause_writing`` and ``resume_writing`` go on to ``protocol`` too. None: stop."""
        self._on_writing = protocol

    def read_nowait(self, n: int = -1) -> bytes | None:
        """:meth:`read` without waiting: None while nothing is buffered."""
        buffer = self._buffer
        if not buffer:
            if type(self._lend) is Lender and self._lend.views:
                return bytes(self._take_lent(n))
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            self.pending = False
            return None
        if self._read_paused or 0 <= n < len(buffer):
            return self._take(n)
        # All of it, reading not paused: _take's usual case written out (a call a request on
        # the server's front); one chunk is bytes already (bytes() of it: a type call for
        # the same object).
        self._buffer = b""
        if not self._eof and type(self._lend) is not Lender:  # nothing else to return
            self.pending = False
        return buffer if type(buffer) is bytes else bytes(buffer)

    def read_chunk_nowait(self, n: int = -1) -> bytes | memoryview | None:
        """:meth:`read_chunk` without waiting: None while nothing is buffered."""
        if not self._buffer:
            if type(self._lend) is Lender and self._lend.views:
                return self._take_lent(n)
            if self._error is not None:
                raise self._error
            return b"" if self._eof else None
        return self._take(n)

    def _take(self, n: int) -> bytes:
        buffer = self._buffer
        if n < 0 or n >= len(buffer):
            data, self._buffer = bytes(buffer), b""
        else:
            data, self._buffer = bytes(buffer[:n]), buffer[n:]
        if self._read_paused and len(self._buffer) <= self._limit and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        return data

    # -- lending -------------------------------------------------------------------------------
    @property
    def read_buffer_size(self) -> int:
        """Bytes of lending buffers this stream holds (0 until it lends): its current one and
        its spares; buffers only the views handed out still hold are not counted."""
        lender = self._lend
        if type(lender) is not Lender:
            return 0
        held = len(lender.buf) if lender.buf is not None else 0
        return held + sum(len(spare) for spare in lender.spares)

    def lend_reads(self) -> bool:
        """Allow the switch to reading into buffers of our own at the first large read (the
        relay's upload: :meth:`read_chunk` then returns views). Plain TCP only (not over TLS,
        whose transport reads for us). Whether it is allowed."""
        if self._over_ssl or self._transport is None or self.lost:
            return False
        if self._lend is False:
            self._lend = True
        return True

    def let_go_reads(self) -> None:
        """Let the lending buffers go: no read came for :data:`LEND_IDLE`, and no reader
        waits to see it (the splice's sender)."""
        if type(self._lend) is Lender:
            self._lend.release()

    def _start_lending(self) -> None:
        transport = self._transport
        assert transport is not None
        lender = self._lend = Lender(self)
        transport.set_protocol(lender)
        if not self._read_paused:
            # uvloop picks its read callbacks (into our buffer, or into bytes of its own) when
            # reading starts: start it again.
            transport.pause_reading()
            transport.resume_reading()

    def _lent(self, view: memoryview) -> None:
        lender = self._lend
        assert type(lender) is Lender
        lender.views.append(view)
        lender.pending += len(view)
        self.pending = True
        if not self._read_paused and lender.pending > 2 * self._limit:
            assert self._transport is not None
            self._transport.pause_reading()
            self._read_paused = True
        self._wake_reader()
        if self._on_data is not None:
            self._on_data()

    def _take_lent(self, n: int) -> memoryview:
        lender = self._lend
        assert type(lender) is Lender
        views = lender.views
        view = views[0]
        if 0 <= n < len(view):
            views[0] = view[n:]
            view = view[:n]
        else:
            views.popleft()
        lender.pending -= len(view)
        if self._read_paused and lender.pending <= self._limit and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        return view

    # -- SocketWriter -------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        if self.transport.is_closing():
            # As asyncio's StreamWriter: let connection_lost run before saying it is lost.
            await asyncio.sleep(0)
        while True:
            if self._error is not None:
                raise self._error
            if self.lost:
                raise ConnectionResetError("Connection lost")
            if not self.write_paused:
                return
            waiter = self._drain_waiter
            if waiter is None or waiter.done():
                waiter = self._drain_waiter = self._loop.create_future()
            await waiter

    async def wait_closed(self) -> None:
        """Until the connection is gone (after :meth:`close`)."""
        while not self.lost:
            waiter = self._drain_waiter  # connection_lost wakes the drainer
            if waiter is None or waiter.done():
                waiter = self._drain_waiter = self._loop.create_future()
            await waiter

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def write_eof(self) -> None:
        self.transport.write_eof()

    def close(self) -> None:
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default)
