"""The writing half of the tunnel's TLS transport (:class:`~.tls_socket.TLSSocketTransport`,
which this is the base of): ``SSL_write`` at once while nothing is queued or waited for; the rest
queued (by reference, as ``sslproto`` does) and written on write readiness, corked when it is
several records; asyncio's flow control (``pause_writing`` above the high-water mark,
``resume_writing`` at the low). ``SSL_write`` is all or nothing: after ``SSLWantWriteError`` the
same piece is written again."""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

CORK_MIN = 32 * 1024
"""Bytes queued from which a flush corks the socket (``TCP_CORK``) while it writes them."""

HIGH_WATER = 64 * 1024  # the default write buffer high-water mark (asyncio's)


class WriteSide(asyncio.Transport):
    """The write methods of :class:`~.tls_socket.TLSSocketTransport`. The state they read is
    the transport's (set by its ``__init__``; declared here, not made: no attribute more)."""

    _protocol: asyncio.BaseProtocol
    _sock: ssl.SSLSocket
    _sslwrite: Callable[[Any], int]
    _queue: collections.deque[bytes | bytearray | memoryview]
    _queued: int
    _high: int
    _low: int
    _writing_paused: bool  # the protocol was told to pause writing
    _reading_paused: bool
    _closing: bool
    _shutdown: int
    _write_wants_read: bool  # the queued piece waits for read readiness
    _reader: bool  # add_reader in place
    _writer: bool
    _lost: bool
    _cork: bool

    if TYPE_CHECKING:  # the transport's (reading, closing, the loop's readiness)

        def _fatal(self, exc: BaseException, where: str) -> None: ...
        def _start_shutdown(self) -> None: ...
        def _update_io(self) -> None: ...

    # -- asyncio.WriteTransport -------------------------------------------------------------
    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if high is None:
            high = HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self._high, self._low = high, low
        self._check_pause()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def get_write_buffer_size(self) -> int:
        return self._queued

    def write(self, data: bytes | bytearray | memoryview) -> None:
        # A small piece while nothing is queued or waited for (the session's write-through of
        # a message alone, a frame): SSL_write now, not through the queue and _flush (~3 400
        # instructions less a message). What it leaves is queued as writelines queues it.
        if (
            type(data) is bytes
            and 0 < len(data) < CORK_MIN  # (uncorked in _flush too)
            and not (self._queue or self._writer or self._write_wants_read or self._closing)
        ):
            try:
                self._sslwrite(data)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
                pass  # nothing taken: queued below, and _flush asks again as it would
            except (OSError, ssl.SSLError) as exc:
                self._fatal(exc, "write")
                return
            else:
                if not self._reader or self._reading_paused:  # as _flush's end, queue empty
                    self._update_io()
                return
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"data: expected a bytes-like object, not {type(data).__name__}")
        if data:  # (dropped after close, as asyncio's transports do: writelines' check)
            self.writelines((data,))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        if self._closing:
            return
        queue = self._queue
        for data in list_of_data:
            if data:
                queue.append(data)
                self._queued += len(data)
        if not (self._writer or self._write_wants_read):  # else it writes on readiness
            self._flush()
        if not self._writing_paused and self._queued > self._high and not self._lost:
            self._writing_paused = True  # _check_pause, written out (a write per message)
            self._protocol.pause_writing()

    def write_eof(self) -> None:
        raise NotImplementedError("TLS: no half-close (close() sends close_notify)")

    def can_write_eof(self) -> bool:
        return False

    # -- writing ----------------------------------------------------------------------------
    def _flush(self) -> None:
        """Write queued pieces until the socket takes no more."""
        queue = self._queue
        sock = self._sock
        send = self._sslwrite
        self._write_wants_read = False
        # Several records to write: cork, so the kernel sends full segments, not one per
        # record (each SSL_write of a record is a send() of its own; TCP_NODELAY is on).
        cork = self._queued >= CORK_MIN and self._cork
        failed: BaseException | None = None
        try:
            if cork:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
            while queue:
                piece = queue[0]
                sent = send(piece)
                queue.popleft()
                self._queued -= sent
        except ssl.SSLWantWriteError:
            pass
        except ssl.SSLWantReadError:
            self._write_wants_read = True
        except (OSError, ssl.SSLError) as exc:
            failed = exc
        if cork:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)
            except OSError as exc:
                failed = failed or exc
        if failed is not None:
            self._fatal(failed, "write")
            return
        if not queue and self._closing and self._shutdown == 0:
            self._start_shutdown()
        if not self._reader or self._writer or queue or self._closing or self._reading_paused:
            self._update_io()  # else it would change nothing (see _read's end)
        if self._writing_paused and self._queued <= self._low:
            self._writing_paused = False
            self._protocol.resume_writing()

    def _check_pause(self) -> None:
        if not self._writing_paused and self._queued > self._high and not self._lost:
            self._writing_paused = True
            self._protocol.pause_writing()
