"""The tunnel's WebSocket, client side (the agent's dial): :class:`TunnelClientConnection`, our
frame reader (:class:`~ravenproxy.transport.websocket.TunnelConnectionMixin`) on a small
asyncio protocol of our own around ``websockets``' sans-I/O
:class:`~websockets.client.ClientProtocol`, and :func:`connect`, which opens it as
``websockets.asyncio.client.connect`` would.

Not ``websockets``' asyncio connection classes (issue 15: an idle agent as shipped in <= 30 MB):
``websockets.asyncio.client`` imports ``urllib.request`` for proxy detection (with
``http.client`` and ``email``'s parser), and ``websockets.asyncio.connection`` and ``.messages``
are ~0.13 MB of code for what the agent does not use of them (message streaming, fragmented
sends, broadcast, a task per keepalive). The sans-I/O protocol keeps what matters: the opening
handshake and its checks, the state machine, the closing handshake, answering PINGs; this
module does the I/O around it the way ``websockets.asyncio.connection.Connection`` does (its
flow control, keepalive, close timeout and exceptions), in callbacks and timers, no task.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import ssl as ssl_module
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Self, cast

import websockets.protocol
from websockets.client import ClientProtocol
from websockets.exceptions import ConcurrencyError, ConnectionClosed, ConnectionClosedOK
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Event, State
from websockets.typing import Subprotocol
from websockets.uri import WebSocketURI, parse_uri

from ravenproxy.transport import tls_handshake
from ravenproxy.transport.websocket import TunnelConnectionMixin


class ClientSide(asyncio.Protocol):
    """The I/O around a :class:`~websockets.client.ClientProtocol`, as
    ``websockets.asyncio.connection.Connection`` does it, for what the tunnel uses:

    - writing: :meth:`send` (a binary message), or the transport itself (the session's writer
      writes frames it made); :attr:`paused` and :meth:`drain` follow the transport's write
      buffer (``write_limit``); a connection lost wakes :meth:`drain` with
      :class:`~websockets.exceptions.ConnectionClosed`;
    - keepalive (``ping_interval``, off with None): a PING every ``ping_interval`` seconds; no
      PONG within ``ping_timeout`` fails the connection with 1011 "keepalive ping timeout";
      :meth:`ping` sends one and tells when its PONG is in;
    - closing: :meth:`close` runs the closing handshake; from the moment the TCP connection is
      expected to close (a CLOSE sent, or received and answered, or the connection failed) it
      is aborted after ``close_timeout`` seconds if it is still up;
    - messages ``websockets`` parses (before our reader takes over, or after it hands over):
      :meth:`recv` and ``async for``, at most ``max_queue`` waiting before reading pauses;
      ``async for`` ends on a normal closure and raises
      :class:`~websockets.exceptions.ConnectionClosedError` otherwise, as ``websockets``'.
    """

    protocol: ClientProtocol
    transport: asyncio.Transport

    def __init__(
        self,
        protocol: ClientProtocol,
        *,
        ping_interval: float | None = None,
        ping_timeout: float | None = 20,
        close_timeout: float | None = 10,
        max_queue: int | None = 16,
        write_limit: int = 2**15,
    ) -> None:
        self.protocol = protocol
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.close_timeout = close_timeout
        self.max_queue_high = max_queue
        self.write_limit = write_limit
        self.loop = asyncio.get_running_loop()
        self.request: Request | None = None
        self.response: Response | None = None
        self.latency = 0.0  # round trip of the last PING answered, in seconds
        self.paused = False  # the transport's write buffer is over write_limit
        # What ended the TCP connection, if not the closing handshake (close_exc's cause).
        self.connection_exc: BaseException | None = None
        self.connection_lost_waiter: asyncio.Future[None] = self.loop.create_future()
        self._response_rcvd: asyncio.Future[None] = self.loop.create_future()
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._close_timer: asyncio.TimerHandle | None = None
        self._keepalive_timer: asyncio.TimerHandle | None = None
        self._pings: dict[bytes, tuple[asyncio.Future[float], float]] = {}  # unanswered, sent
        self._ping: bytes | None = None  # the keepalive PING's payload, until its PONG
        self._inbox: collections.deque[bytes | str] = collections.deque()
        self._parts: list[bytes] = []  # a fragmented message so far
        self._text = False
        self._recv_waiter: asyncio.Future[None] | None = None
        self._inbox_paused = False

    # -- what websockets' Connection offers, as far as the tunnel uses it ----------------------
    @property
    def state(self) -> State:
        return self.protocol.state

    @property
    def subprotocol(self) -> Subprotocol | None:
        return self.protocol.subprotocol

    @property
    def close_exc(self) -> ConnectionClosed:
        """The exception for a closed connection: its close frames, caused by
        :attr:`connection_exc`."""
        exc = self.protocol.close_exc
        if self.connection_exc is not None:
            exc.__cause__ = self.connection_exc
        return exc

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close(CloseCode.NORMAL_CLOSURE if exc_type is None else CloseCode.INTERNAL_ERROR)

    async def send(self, message: bytes | bytearray | memoryview) -> None:
        """Send a binary message; raises :class:`ConnectionClosed` once the connection is not
        open (after it is closed)."""
        if self.protocol.state is not State.OPEN:
            await self._closed()
        self.protocol.send_binary(message)
        self.send_data()
        await self.drain()

    async def recv(self) -> bytes | str:
        """The next message ``websockets`` parsed; raises :class:`ConnectionClosed` once the
        connection is closed and none is left."""
        while not self._inbox:
            if self.connection_lost_waiter.done():
                raise self.close_exc
            self._recv_waiter = waiter = self.loop.create_future()
            try:
                await waiter
            finally:
                self._recv_waiter = None
        message = self._inbox.popleft()
        if self._inbox_paused and not self._inbox:
            self._inbox_paused = False
            self.transport.resume_reading()
        return message

    async def __aiter__(self) -> AsyncIterator[bytes | str]:
        try:
            while True:
                yield await self.recv()
        except ConnectionClosedOK:
            return

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """The closing handshake: send a CLOSE (unless one was), wait for the TCP connection to
        end, for ``close_timeout`` at most (then abort it). Idempotent."""
        if self.protocol.state is State.OPEN:
            self.protocol.send_close(code, reason)
            self.send_data()
        try:
            await self._closed()
        except ConnectionClosed:
            pass

    async def wait_closed(self) -> None:
        await asyncio.shield(self.connection_lost_waiter)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is over ``write_limit``; raises
        :class:`ConnectionClosed` once the connection is lost."""
        if self.transport.is_closing():  # let connection_lost run
            await asyncio.sleep(0)
        while self.paused and not self.connection_lost_waiter.done():
            waiter = self.loop.create_future()
            self._drain_waiters.append(waiter)
            try:
                await waiter
            finally:
                self._drain_waiters.remove(waiter)
        if self.connection_lost_waiter.done():
            raise self.close_exc

    async def ping(self, data: bytes | None = None) -> asyncio.Future[float]:
        """Send a PING (``data``, else 4 random bytes); the future it returns gets the round
        trip in seconds once the PONG is in (or a later one: a PONG answers every PING before
        it too), or :class:`ConnectionClosed` once the connection is lost."""
        if self.protocol.state is not State.OPEN:
            await self._closed()
        if data in self._pings:
            raise ConcurrencyError("already waiting for a pong with the same data")
        while data is None or data in self._pings:
            data = os.urandom(4)
        return self._send_ping(data)

    def start_keepalive(self) -> None:
        if self.ping_interval is not None and self._keepalive_timer is None:
            self._keepalive_timer = self.loop.call_later(self.ping_interval, self._keepalive)

    # -- internals --------------------------------------------------------------------------
    async def _closed(self) -> None:
        """Wait until the connection is lost (bounded by the close timer), raise close_exc."""
        if not self.connection_lost_waiter.done():
            self._expect_close()
            await asyncio.shield(self.connection_lost_waiter)
        raise self.close_exc

    def send_data(self) -> None:
        """Write what the protocol has to send; end the TCP connection when it says so."""
        for data in self.protocol.data_to_send():
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                try:
                    self.transport.write_eof()
                except Exception:  # uvloop raises RuntimeError, others OSError
                    pass
            else:
                self.transport.close()
        if self.protocol.close_expected():
            self._expect_close()

    def _expect_close(self) -> None:
        """The TCP connection should end soon: abort it after ``close_timeout`` otherwise."""
        if self._close_timer is None and self.close_timeout is not None:
            if not self.connection_lost_waiter.done():
                self._close_timer = self.loop.call_later(self.close_timeout, self._close_timed_out)

    def _close_timed_out(self) -> None:
        self._close_timer = None
        if self.connection_exc is None:
            self.connection_exc = TimeoutError("timed out while closing connection")
        self.transport.abort()

    def _send_ping(self, data: bytes) -> asyncio.Future[float]:
        answered: asyncio.Future[float] = self.loop.create_future()
        self._pings[data] = (answered, self.loop.time())
        self.protocol.send_ping(data)
        self.send_data()
        return answered

    def _keepalive(self) -> None:
        self._keepalive_timer = None
        if self.protocol.state is not State.OPEN:
            return
        data = os.urandom(4)
        while data in self._pings:
            data = os.urandom(4)
        self._send_ping(data)
        assert self.ping_interval is not None
        if self.ping_timeout is None:  # no waiting for the PONG
            self._keepalive_timer = self.loop.call_later(self.ping_interval, self._keepalive)
        else:
            self._ping = data
            self._keepalive_timer = self.loop.call_later(self.ping_timeout, self._pong_missed)

    def _pong(self, data: bytes) -> None:
        if data not in self._pings:
            return  # unsolicited
        now = self.loop.time()
        for key in list(self._pings):  # in the order sent: this PONG answers those before
            answered, sent = self._pings.pop(key)
            if not answered.done():
                answered.set_result(now - sent)
            if key == data:
                self.latency = now - sent
                break
        if self._ping is not None and self._ping not in self._pings:  # the keepalive's
            self._ping = None
            if self._keepalive_timer is not None:
                self._keepalive_timer.cancel()
            assert self.ping_interval is not None
            delay = max(0.0, self.ping_interval - self.latency)
            self._keepalive_timer = self.loop.call_later(delay, self._keepalive)

    def _pong_missed(self) -> None:
        self._keepalive_timer = None
        if self.protocol.state is State.OPEN:
            self.protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
            self.send_data()

    def process_event(self, event: Event) -> None:
        if self.response is None:  # the first event: the handshake's response
            assert isinstance(event, Response)
            self.response = event
            self._response_rcvd.set_result(None)
            return
        assert isinstance(event, Frame)
        opcode = event.opcode
        if opcode is Opcode.PONG:
            self._pong(bytes(event.data))
        elif opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
            if opcode is not Opcode.CONT:
                self._text = opcode is Opcode.TEXT
            self._parts.append(bytes(event.data))
            if not event.fin:
                return
            data = b"".join(self._parts)
            self._parts.clear()
            self._inbox.append(data.decode(errors="replace") if self._text else data)
            high = self.max_queue_high
            if high is not None and len(self._inbox) >= high and not self._inbox_paused:
                self._inbox_paused = True
                self.transport.pause_reading()
            self._wake_recv()

    def _wake_recv(self) -> None:
        if self._recv_waiter is not None and not self._recv_waiter.done():
            self._recv_waiter.set_result(None)

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport.set_write_buffer_limits(self.write_limit)

    def data_received(self, data: bytes) -> None:
        self.protocol.receive_data(data)
        events = self.protocol.events_received()
        try:
            self.send_data()  # PONGs, the CLOSE answered
        except Exception as exc:
            self.connection_exc = self.connection_exc or exc
        for event in events:
            self.process_event(event)

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        events = self.protocol.events_received()
        self.send_data()
        for event in events:  # an HTTP response without Content-Length ends at EOF
            self.process_event(event)

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the state is CLOSED from here on
        if self.connection_exc is None:
            self.connection_exc = exc
        for timer in (self._close_timer, self._keepalive_timer):
            if timer is not None:
                timer.cancel()
        self._close_timer = self._keepalive_timer = None
        self.connection_lost_waiter.set_result(None)
        if self._pings:
            closed = self.close_exc
            for answered, _ in self._pings.values():
                if not answered.done():
                    answered.set_exception(closed)
                    answered.exception()  # retrieved: no "never retrieved" log if unawaited
            self._pings.clear()
        self._wake_recv()
        self.paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)  # drain() raises ConnectionClosed

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)


class TunnelClientConnection(TunnelConnectionMixin, ClientSide):
    """The agent's tunnel connection: our frame reader on :class:`ClientSide`. The sans-I/O
    :class:`~websockets.client.ClientProtocol` makes and checks the opening handshake (key and
    Sec-WebSocket-Accept, subprotocol, status) and keeps the closing handshake and the control
    frames; our reader takes the binary messages once the connection is open."""

    def __init__(self, protocol: ClientProtocol, **kwargs: Any) -> None:
        ClientSide.__init__(self, protocol, **kwargs)
        self._init_reader()

    def _pong_missed(self) -> None:
        super()._pong_missed()
        # As websockets after fail(): nothing more is read as frames (RFC 6455 7.1.7).
        if self.protocol.state is not State.OPEN:
            self._stop_frames()

    async def handshake(self, user_agent_header: str | None = None) -> None:
        """Send the request, wait for the response (or the connection lost), raise what the
        protocol found wrong (InvalidStatus, InvalidMessage, InvalidHandshake...)."""
        self.request = self.protocol.connect()
        if user_agent_header is not None:
            self.request.headers.setdefault("User-Agent", user_agent_header)
        self.protocol.send_request(self.request)
        self.send_data()
        await asyncio.wait(
            [self._response_rcvd, self.connection_lost_waiter],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if self.protocol.handshake_exc is not None:
            raise self.protocol.handshake_exc
        if self.response is None:
            raise self.close_exc


class _NoUuid:
    """Stands in for the ``uuid`` module in ``websockets.protocol`` while a client protocol is
    made: its ``Protocol.__init__`` gives each connection a ``uuid.uuid4()`` id that only
    ``websockets``' own connection classes read (for their logs). ``uuid`` imports ``platform``
    at its import, ~0.28 MB of an idle agent together; the agent defers both
    (:mod:`ravenproxy.agent.deferred`) and its connections' ``protocol.id`` is None."""

    @staticmethod
    def uuid4() -> None:
        return None


def client_protocol(
    uri: WebSocketURI,
    *,
    subprotocols: Sequence[Subprotocol] | None,
    max_size: int,
    logger: logging.Logger | None,
) -> ClientProtocol:
    """``websockets``' sans-I/O client protocol for ``uri``, made without ``uuid``
    (:class:`_NoUuid`). Synchronous: nothing else runs between the swap and its undoing."""
    module: Any = websockets.protocol
    saved, module.uuid = module.uuid, _NoUuid
    try:
        return ClientProtocol(uri, subprotocols=subprotocols, max_size=max_size, logger=logger)
    finally:
        module.uuid = saved


async def connect(
    uri: str,
    *,
    ssl: ssl_module.SSLContext | None = None,
    open_timeout: float = 10,
    user_agent_header: str | None = None,
    logger: logging.Logger | None = None,
    subprotocols: Sequence[Subprotocol] | None = None,
    max_size: int = 2**20,
    max_queue: int | None = 16,
    write_limit: int = 2**15,
    create_connection: type[TunnelClientConnection] = TunnelClientConnection,
    compression: None = None,
    ping_interval: float | None = None,
    ping_timeout: float | None = 20,
    close_timeout: float | None = 10,
) -> TunnelClientConnection:
    """A client WebSocket to ``uri`` (``wss://`` with ``ssl``, ``ws://`` without), as
    ``websockets.asyncio.client.connect`` opens one with the same arguments, but with no
    proxy and no redirect followed: TCP, TLS and the opening handshake within
    ``open_timeout`` (else :class:`TimeoutError`); the connection is aborted on any failure.
    The defaults are ``websockets``' (no User-Agent header unless given)."""
    ws_uri = parse_uri(uri)
    if ws_uri.secure != (ssl is not None):
        raise ValueError(f"{uri}: wss:// needs an ssl context, ws:// takes none")

    def factory() -> TunnelClientConnection:
        protocol = client_protocol(
            ws_uri, subprotocols=subprotocols, max_size=max_size, logger=logger
        )
        return create_connection(
            protocol,
            ping_interval=ping_interval,
            ping_timeout=ping_timeout,
            close_timeout=close_timeout,
            max_queue=max_queue,
            write_limit=write_limit,
        )

    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(open_timeout):
            if ssl is not None:  # OpenSSL on the socket itself (see tls_handshake)
                _, protocol = await tls_handshake.open_client(
                    factory,
                    ws_uri.host,
                    ws_uri.port,
                    ssl_context=ssl,
                    server_hostname=ws_uri.host,
                    handshake_timeout=open_timeout,
                )
                assert isinstance(protocol, TunnelClientConnection)
                connection = protocol
            else:
                _, connection = await loop.create_connection(factory, ws_uri.host, ws_uri.port)
            try:
                await connection.handshake(user_agent_header=user_agent_header)
            except BaseException:
                connection.transport.abort()
                raise
    except TimeoutError as exc:
        raise TimeoutError("timed out during opening handshake") from exc
    connection.start_keepalive()
    return connection
