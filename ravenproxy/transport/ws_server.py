"""The tunnel's WebSocket, server side (the tunnel listener): ``websockets``' server and its
connections over :class:`~ravenproxy.transport.tls_socket.TLSSocketTransport`, OpenSSL on the
socket instead of the event loop's memory-BIO TLS.

:func:`serve` is ``websockets.asyncio.server.serve`` for the tunnel's options, with its own
listener (:class:`TLSListener`, the part of :class:`asyncio.Server` that ``websockets``'
:class:`~websockets.asyncio.server.Server` uses): it accepts, wraps each socket server side
with the listening context (its SNI callback switches the handshake over to the current
credentials, :func:`~ravenproxy.transport.tls.follow_current`), runs the TLS handshake in a task
of its own, off the accept path and within ``open_timeout``, tells ``on_handshake_error`` of
every refused one, then builds the connection as ``serve`` does and runs the handler in
``websockets``' own way (opening handshake, keepalive, ``async with connection``).
Closing the listener stops accepting, cancels the TLS handshakes under way, and
:meth:`TLSListener.wait_closed` waits for the connections to be closed, as asyncio's does.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from websockets.asyncio.server import Server, ServerConnection
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from ravenproxy.log import kv
from ravenproxy.transport import listener, tls, tls_handshake, tls_socket
from ravenproxy.transport.websocket import TunnelConnectionMixin

log = logging.getLogger(__name__)

ACCEPT_BATCH = 64
"""Connections accepted per readiness of the listening socket at most (the rest on the next
loop iteration), so a thousand agents returning at once do not hold the loop."""

ACCEPT_RETRY_DELAY = 1.0
"""Seconds accepting pauses when the process is out of descriptors or memory (asyncio's)."""


class TunnelServerConnection(TunnelConnectionMixin, ServerConnection):
    """``websockets``' server connection with our frame reader (``create_connection=``). Here,
    with the listener, rather than beside the mixin: an agent, which only dials, never imports
    ``websockets``' server side (issue 15: an idle agent's memory)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        ServerConnection.__init__(self, *args, **kwargs)
        self._init_reader()


class TLSListener:
    """Listening sockets whose connections become TLS transports (see the module's doc)."""

    def __init__(
        self,
        sockets: Sequence[socket.socket],
        ssl_context: ssl.SSLContext,
        make_connection: Callable[[], ServerConnection],
        *,
        handshake_timeout: float,
        on_handshake_error: tls.HandshakeObserver | None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._sockets = tuple(sockets)
        self._ctx = ssl_context
        self._make_connection = make_connection
        self._timeout = handshake_timeout
        self._on_error = on_handshake_error
        self._serving = False
        self._closed = False
        self._handshakes: set[asyncio.Task[None]] = set()
        self._connections: set[ServerConnection] = set()
        self._retry: asyncio.TimerHandle | None = None

    # -- the asyncio.Server part websockets uses --------------------------------------------
    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._closed else self._sockets

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        self._listen()

    def close(self) -> None:
        """Stop accepting, close the listening sockets, cancel the TLS handshakes under way;
        connections up stay up (``websockets`` closes them)."""
        if self._closed:
            return
        self._closed = True
        self._stop_listening()
        for sock in self._sockets:
            sock.close()
        for task in list(self._handshakes):
            task.cancel()

    async def wait_closed(self) -> None:
        """Once closed: until the handshakes under way ended and every connection is closed."""
        if not self._closed:
            return
        while self._handshakes or self._connections:
            waiting: list[asyncio.Future[Any]] = list(self._handshakes)
            waiting += [c.connection_lost_waiter for c in self._connections]
            await asyncio.wait(waiting)

    # -- accepting --------------------------------------------------------------------------
    def _listen(self) -> None:
        if self._serving or self._closed:
            return
        self._serving = True
        for sock in self._sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _stop_listening(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._serving:
            self._serving = False
            for sock in self._sockets:
                self._loop.remove_reader(sock.fileno())

    def _accept(self, listener: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                raw, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.error(
                        "tunnel listener cannot accept, pausing",
                        extra=kv(error=exc, retry_in=f"{ACCEPT_RETRY_DELAY:g}s"),
                    )
                    self._stop_listening()
                    self._retry = self._loop.call_later(ACCEPT_RETRY_DELAY, self._resume)
                    return
                raise
            task = self._loop.create_task(self._handshake(raw), name="tunnel-tls-handshake")
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    def _resume(self) -> None:
        self._retry = None
        self._listen()

    async def _handshake(self, raw: socket.socket) -> None:
        try:
            raw.setblocking(False)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = self._ctx.wrap_socket(
                raw,
                server_side=True,
                do_handshake_on_connect=False,
                suppress_ragged_eofs=False,  # tell a FIN without close_notify
            )
        except BaseException:
            raw.close()
            raise
        try:
            await tls_handshake.handshake(sock, self._timeout, on_error=self._on_error)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            # Refusals were told to on_handshake_error; a peer gone or silent is not news
            # (asyncio's own TLS says nothing of either outside debug mode).
            log.debug("tunnel TLS handshake failed", extra=kv(error=exc))
            sock.close()
            return
        except BaseException:
            sock.close()
            raise
        if self._closed:
            sock.close()
            return
        connection = self._make_connection()
        self._connections.add(connection)
        connection.connection_lost_waiter.add_done_callback(
            lambda _: self._connections.discard(connection)
        )
        tls_socket.TLSSocketTransport(self._loop, sock, connection)


async def bind(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for ``host`` (None: every interface) and ``port``, as
    ``loop.create_server`` binds them (:func:`~ravenproxy.transport.listener.bind_each`); a
    :class:`~ravenproxy.transport.listener.BindError` naming the address if one cannot be bound
    (none is left open)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets = listener.bind_each(infos)
    for sock in sockets:
        sock.listen(backlog)
        sock.setblocking(False)
    return sockets


def serve(
    handler: Callable[[ServerConnection], Awaitable[None]],
    host: str | None,
    port: int,
    *,
    ssl: ssl.SSLContext,
    on_handshake_error: tls.HandshakeObserver | None = None,
    backlog: int = 100,
    server_header: str | None = None,
    logger: logging.Logger,
    subprotocols: Sequence[Subprotocol],
    max_size: int,
    max_queue: int,
    write_limit: int,
    create_connection: type[ServerConnection] = TunnelServerConnection,
    compression: None = None,
    ping_interval: float | None = None,
    open_timeout: float = 10,
    close_timeout: float = 10,
) -> Server:
    """``websockets.asyncio.server.serve(handler, host, port, ssl=ssl, ...)`` with the
    tunnel's options (those :func:`~ravenproxy.transport.session.websocket_options` gives),
    its TLS on :class:`~ravenproxy.transport.tls_socket.TLSSocketTransport`: await it (or
    ``async with``) to listen; ``close()`` and ``wait_closed()`` as ``websockets``'."""

    def make_connection() -> ServerConnection:
        protocol = ServerProtocol(subprotocols=subprotocols, max_size=max_size, logger=logger)
        return create_connection(
            protocol,
            server,
            ping_interval=ping_interval,
            close_timeout=close_timeout,
            max_queue=max_queue,
            write_limit=write_limit,
        )

    async def create_server() -> asyncio.Server:
        sockets = await bind(host, port, backlog)
        listener = TLSListener(
            sockets,
            ssl,
            make_connection,
            handshake_timeout=open_timeout,
            on_handshake_error=on_handshake_error,
        )
        await listener.start_serving()
        return cast(asyncio.Server, listener)

    async def run_handler(connection: ServerConnection) -> None:
        # websockets.asyncio.server.serve's protocol_handler, as it is: the opening handshake
        # within open_timeout, then the handler inside ``async with connection`` (closed after).
        try:
            async with asyncio.timeout(open_timeout):
                await connection.handshake(None, None, server_header)
            if connection.protocol.state is not State.OPEN:
                connection.transport.abort()
                return
            server.all_connections.add(connection)
            connection.start_keepalive()
            try:
                async with connection:
                    await handler(connection)
            except Exception:
                connection.logger.error("connection handler failed", exc_info=True)
            finally:
                server.all_connections.discard(connection)
        except Exception:
            connection.transport.abort()
        finally:
            task = asyncio.current_task()
            if task is not None:
                server.handler_tasks.discard(task)

    server = Server(create_server, run_handler, logger)
    return server
