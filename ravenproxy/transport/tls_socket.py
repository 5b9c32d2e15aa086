"""A TLS transport that drives a non-blocking :class:`ssl.SSLSocket` itself, for the tunnel.

Why: the event loop's TLS (``sslproto``) runs OpenSSL over memory BIOs: what is received is read
into a ``bytes``, written into the incoming BIO, then decrypted, and the way out the same in
reverse. Here OpenSSL reads and writes the socket itself: ``SSL_read`` decrypts from the kernel
into the protocol's buffer (:class:`asyncio.BufferedProtocol`), ``SSL_write`` encrypts to it.

The contract is asyncio's :class:`asyncio.Transport` (what ``websockets`` and the session use):

- reading: ``loop.add_reader``; each readiness fills the buffer the protocol offers with as many
  ``SSL_read`` calls as it takes (a record each), then one ``buffer_updated``. Decrypted bytes
  OpenSSL still holds (``pending()``: the rest of a record larger than the buffer) make no
  readiness event: they are read on the next loop iteration (:mod:`.readiness` counts that).
- writing (:mod:`.tls_write`, the base class's): ``write`` encrypts at once while nothing is
  queued; the rest is queued (by reference, as ``sslproto`` does), written on ``add_writer``
  readiness; ``SSL_write`` is all or nothing: after ``SSLWantWriteError`` the same piece is
  written again. Flow control as asyncio's. Either direction may need the other's readiness (a
  key update); both are waited for.
- closing: ``close()`` writes what is queued, ``close_notify``, a FIN, then drops what comes
  until the peer's FIN, within :data:`SHUTDOWN_TIMEOUT` (the socket's steps: :mod:`.tls_close`);
  ``abort()`` closes at once.
  ``connection_lost`` is called exactly once, from the loop, once the socket is closed.
- the peer's ``close_notify`` (or a FIN without it) is the protocol's ``eof_received``; unless
  that returns true, the transport closes.

:mod:`.tls_handshake` makes such sockets (the agent's dial), :mod:`.ws_server` accepts them.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import socket
import ssl
from collections.abc import Callable
from typing import Any

from ravenproxy.transport.readiness import of as readiness_of
from ravenproxy.transport.tls_close import Shutdown, drained_to_fin, shut_down
from ravenproxy.transport.tls_names import tls_names
from ravenproxy.transport.tls_write import HIGH_WATER, WriteSide

SHUTDOWN_TIMEOUT = 10.0
"""Seconds ``close()`` may take (queued data, ``close_notify``, FIN, the peer's FIN), at most."""

READ_ROUNDS = 4
"""Buffers filled per read readiness at most (a busy connection must not starve the loop)."""

RECORD = 16 * 1024  # TLS's largest record payload: one SSL_read returns one record at most


class TLSSocketTransport(WriteSide):
    """An :class:`asyncio.Transport` over a connected, handshaken, non-blocking
    :class:`ssl.SSLSocket` (see the module's doc)."""

    # The class's until set, which a transport's usual life never does (a close, the peer's
    # EOF, a read scheduled for decrypted bytes left): Python 3.11 keeps up to 29 attributes
    # of an instance in shared-key values; with 30 the transport got a dict of its own, and
    # every attribute load and store of each read and write took the hinted dict lookup.
    # tests/unit/transport/test_connection_attributes.py holds it to that count.
    _shutdown_wants_write = False  # the close_notify waits for write readiness
    _shutdown_timer: asyncio.TimerHandle | None = None
    _read_soon: asyncio.Handle | None = None
    _peer_eof = False
    _ragged = False  # the peer's FIN came without its close_notify

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: ssl.SSLSocket,
        protocol: asyncio.BaseProtocol,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(extra)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._use(protocol)
        # CPython's TLS object under the SSLSocket: read(), write() and pending() are what
        # recv_into(), send() and pending() end in, two Python calls later (~6 % of bulk CPU;
        # four calls a small request); the SSLSocket's own methods if it has none.
        tls = getattr(sock, "_sslobj", None)
        self._sslread: Callable[[int, memoryview], int] | None = getattr(tls, "read", None)
        self._sslwrite: Callable[[Any], int] = getattr(tls, "write", sock.send)
        self._sslpending: Callable[[], int] = getattr(tls, "pending", sock.pending)
        self._queue: collections.deque[bytes | bytearray | memoryview] = collections.deque()
        self._queued = 0
        self._high = HIGH_WATER
        self._low = HIGH_WATER // 4
        self._writing_paused = False  # the protocol was told to pause writing
        self._reading_paused = False
        self._closing = False  # close() called, or the connection is going down
        self._shutdown = 0  # 0: not started; 1: close_notify to write; 2: draining to the FIN
        self._write_wants_read = False  # the queued piece waits for read readiness
        self._read_wants_write = False  # a read waits for write readiness
        self._reader = False  # add_reader in place
        self._writer = False
        self._soon = readiness_of(loop).soon
        self._lost = False  # connection_lost scheduled
        self._closed = False  # the socket is closed
        # Read now: the socket answers none of these once closed (and an SSLSocket none of the
        # TLS ones once its close_notify is sent).
        self._cork = sock.family in (socket.AF_INET, socket.AF_INET6)
        self._names = tls_names(sock)
        protocol.connection_made(self)
        self._update_io()

    # -- asyncio.BaseTransport --------------------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in self._names:
            return self._names[name]
        if name in ("ssl_object", "socket"):
            return self._sock
        if name == "sslcontext":
            return self._sock.context
        return super().get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._reading_paused = True  # nothing more for the protocol: drop what arrives
        self._shutdown_timer = self._loop.call_later(SHUTDOWN_TIMEOUT, self._force_close)
        if not self._queue:
            self._start_shutdown()
        self._update_io()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._use(protocol)

    def _use(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol
        # A BufferedProtocol's two read methods, bound once: called as methods in _read they
        # were loaded unspecialized (methods of its class, which the tunnel's Feeder shadows
        # with attributes: ~2 generic lookups a read on 3.11).
        self._get_buffer: Callable[[int], Any] | None = None
        self._updated: Callable[[int], Any] | None = None
        if isinstance(protocol, asyncio.BufferedProtocol):
            self._get_buffer, self._updated = protocol.get_buffer, protocol.buffer_updated

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    # -- asyncio.ReadTransport --------------------------------------------------------------
    def is_reading(self) -> bool:
        return not self._reading_paused and not self._closing

    def pause_reading(self) -> None:
        if self._closing or self._reading_paused:
            return
        self._reading_paused = True
        self._update_io()

    def resume_reading(self) -> None:
        if self._closing or not self._reading_paused or self._peer_eof:
            return
        self._reading_paused = False
        self._update_io()
        if self._sock.pending():  # decrypted bytes make no readiness event
            self._schedule_read()

    # -- reading ----------------------------------------------------------------------------
    def _schedule_read(self) -> None:
        if self._read_soon is None:
            self._read_soon = self._loop.call_soon(self._read_again)
            self._soon.add(self)  # more input in this turn, which no readiness shows

    def _read_again(self) -> None:
        self._read_soon = None
        self._soon.discard(self)
        if not self._reading_paused and not self._closed:
            self._read(False)

    def _read(self, ready: bool = True) -> None:
        """Read what the socket has, into the protocol's buffers. ``ready``: by the loop's read
        readiness (no method that checks and forwards), what else it may be for checked first;
        the default, so the loop calls it without arguments (no tuple of them a read)."""
        if ready and (
            self._shutdown or self._write_wants_read or self._reading_paused or self._closing
        ):
            self._readable()
            return
        sslread = self._sslread
        self._read_wants_write = False
        # Counted down, only by a round that filled its buffer: the usual read (one round) makes
        # no iterator (a range's was ~700 instructions a read, a tuple's ~250).
        rounds = READ_ROUNDS
        while True:
            get_buffer, updated = self._get_buffer, self._updated
            got = 0
            end: str | BaseException | None = None  # why this round stopped short
            try:
                # A view as given (the tunnel's: no view of a view a read), else one of ours.
                given = get_buffer(-1) if get_buffer is not None else bytearray(256 * 1024)
                view = given if type(given) is memoryview else memoryview(given)
                size = len(view)
                if not size:
                    raise RuntimeError("get_buffer() returned an empty buffer")
            except Exception as exc:
                self._fatal(exc, "protocol")
                return
            try:
                while got < size:
                    into = view[got:] if got else view
                    n = sslread(size - got, into) if sslread else self._sock.recv_into(into)
                    if not n:
                        end = "eof"
                        break
                    got += n
                    if n < RECORD and got < size:
                        # A short record: a small message, likely all there is. Not reading
                        # on spares the failed read (an SSLError made in C) that finds the
                        # socket empty; readiness is level-triggered, anything left is read next.
                        end = "drained"
                        break
            except ssl.SSLWantReadError:
                end = "drained"
            except ssl.SSLWantWriteError:  # a key update to answer, the socket full
                end = "want_write"
            except ssl.SSLEOFError:  # a FIN without close_notify (suppress_ragged_eofs=False)
                end = "ragged"
            except (OSError, ssl.SSLError) as exc:
                end = exc
            try:
                if got:  # what came before an end is delivered first
                    if updated is not None:
                        updated(got)
                    elif isinstance(self._protocol, asyncio.Protocol):
                        self._protocol.data_received(bytes(view[:got]))
            except Exception as exc:
                self._fatal(exc, "protocol")
                return
            finally:
                if view is not given:
                    view.release()
            if end == "drained":
                # The socket has no more now, and OpenSSL holds none decrypted: a read that got
                # less than it asked for took its record's last byte (SSL_read returns one
                # record at most, less only at its end; Python sets no read-ahead), and one that
                # found no whole record holds none. So no pending(), which answers 0 here and
                # releases and takes the GIL (~500 instructions a read, a read a request).
                break
            # Any other end, or a next round: none of this round's buffer held on from here (a
            # protocol counts who holds its buffers: its eof_received or connection_lost may
            # resize them). A drained round drops them with the call's frame.
            del view, given, into
            if isinstance(end, BaseException):
                self._fatal(end, "read")
                return
            if end == "eof" or end == "ragged":
                self._eof(ragged=end == "ragged")
                return
            if end == "want_write":
                self._read_wants_write = True
                break
            if self._reading_paused or self._closing or self._closed:
                break
            # A full buffer (the record's rest may be in OpenSSL): the next round reads on,
            # unless this was the last.
            rounds -= 1
            if not rounds:
                if self._sslpending():  # decrypted bytes make no readiness event
                    self._schedule_read()
                break
        # Not when _update_io would change nothing (the usual end: a call a read, for nothing).
        steady = self._reader and not (self._writer or self._queue or self._read_wants_write)
        if not steady or self._closing or self._reading_paused:
            self._update_io()

    def _eof(self, *, ragged: bool = False) -> None:
        self._peer_eof = True
        self._ragged = ragged
        if self._closing:  # a close() underway: its shutdown ends here
            self._close_now(None)
            return
        self._reading_paused = True
        try:
            protocol = self._protocol
            keep_open = (
                protocol.eof_received()
                if isinstance(protocol, asyncio.Protocol | asyncio.BufferedProtocol)
                else None
            )
        except Exception as exc:
            self._fatal(exc, "protocol")
            return
        if not keep_open:
            self.close()
        else:
            self._update_io()

    def _readable(self) -> None:
        """Read readiness while the transport is not simply reading (see :meth:`_read`)."""
        if self._shutdown == 2:
            self._drain_to_fin()
            return
        if self._write_wants_read:
            self._flush()
            if self._closed:
                return
        if not self._reading_paused and not self._closing:
            self._read(False)

    def _on_writable(self) -> None:
        if self._read_wants_write:
            self._read(False)
            if self._closed:
                return
        if self._queue:
            self._flush()
        elif self._shutdown_wants_write:
            self._start_shutdown()
        else:
            self._update_io()

    # -- closing ----------------------------------------------------------------------------
    def abort(self) -> None:
        self._close_now(None)

    def _start_shutdown(self) -> None:
        """Everything queued is written: the ``close_notify``, then the FIN, then wait for the
        peer's FIN (reading and dropping what comes before it), within the close's timeout."""
        self._shutdown = 1
        self._shutdown_wants_write = False
        done = shut_down(self._sock, self._ragged)
        if done is Shutdown.WANT_WRITE:
            self._shutdown_wants_write = True
            self._update_io()
        elif done is Shutdown.FAILED or self._peer_eof:
            self._close_now(None)
        else:
            self._shutdown = 2
            self._update_io()

    def _drain_to_fin(self) -> None:
        if drained_to_fin(self._sock):
            self._close_now(None)

    def _force_close(self) -> None:
        self._shutdown_timer = None
        self._close_now(None)

    def _fatal(self, exc: BaseException, where: str) -> None:
        if isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ECONNRESET):
            self._close_now(exc)
            return
        if not isinstance(exc, OSError | ssl.SSLError):
            self._loop.call_exception_handler(
                {
                    "message": f"TLS transport: the protocol failed in {where}",
                    "exception": exc,
                    "transport": self,
                    "protocol": self._protocol,
                }
            )
        self._close_now(exc)

    def _close_now(self, exc: BaseException | None) -> None:
        """Close the socket now (no more TLS), and tell the protocol once, from the loop."""
        self._closing = True
        self._reading_paused = True
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
            self._shutdown_timer = None
        if not self._closed:  # (a read scheduled finds it closed)
            self._closed = True
            self._update_io()
            self._queue.clear()
            self._queued = 0
            sock = self._sock  # its methods from here: the TLS object's would reach a reused fd
            self._sslread, self._sslwrite, self._sslpending = None, sock.send, sock.pending
            sock.close()  # no close_notify: SSLSocket.close() does not send one
        if not self._lost:
            self._lost = True
            self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: BaseException | None) -> None:
        try:
            self._protocol.connection_lost(exc if isinstance(exc, Exception) else None)
        finally:
            self._use(_Gone())

    # -- the loop's readiness ---------------------------------------------------------------
    def _update_io(self) -> None:
        """Register for exactly the readiness the state needs."""
        if self._closed:
            want_read = want_write = False
        else:
            want_read = (
                (not self._reading_paused and not self._closing)
                or self._write_wants_read
                or self._shutdown == 2
            )
            want_write = (
                self._read_wants_write
                or (bool(self._queue) and not self._write_wants_read)
                or self._shutdown_wants_write
            )
        loop = self._loop
        if want_read != self._reader:
            self._reader = want_read
            if want_read:
                loop.add_reader(self._fd, self._read)
            else:
                loop.remove_reader(self._fd)
        if want_write != self._writer:
            self._writer = want_write
            if want_write:
                loop.add_writer(self._fd, self._on_writable)
            else:
                loop.remove_writer(self._fd)


class _Gone(asyncio.BaseProtocol):
    """The protocol after ``connection_lost``: nothing more is said to the real one."""
