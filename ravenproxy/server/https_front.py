"""The HTTPS front (``--https-addr``, default :10263): what the internal Service's kubelet ports
(10250, …) lead to.

The ClientHello is *peeked* (``MSG_PEEK``), not read, so that the socket still holds every byte
when the front decides:

- its SNI names a node the server knows → the raw TLS bytes go through a stream to that node's
  kubelet (InternalIP : kubelet port of the Node object): TLS runs end to end between the
  client and the kubelet, and the tunnel never sees plaintext;
- otherwise (no SNI, an IP, an unknown name) → TLS is terminated here with the server
  certificate, and the HTTP requests inside are routed like the HTTP front's, with TLS
  re-originated to the kubelet.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import TYPE_CHECKING

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.server import sni
from ravenproxy.server.http_proxy import HttpProxy
from ravenproxy.server.routing import route
from ravenproxy.server.upstream import splice
from ravenproxy.transport import tls
from ravenproxy.transport.relay import READ_LIMIT

if TYPE_CHECKING:
    from ravenproxy.server.app import ProxyServer

log = logging.getLogger(__name__)

HELLO_TIMEOUT = 10.0
"""A client that sends no complete ClientHello in this long is dropped."""
HANDSHAKE_TIMEOUT = 10.0


class HttpsFront:
    name = "https"

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.proxy = HttpProxy(server, self.name, over_tls=True)
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._ctx: ssl.SSLContext | None = None
        self._handed: set[socket.socket] = set()
        """Accepted sockets a transport has taken over (and will close)."""

    async def start(self, host: str | None, port: int) -> int:
        s = self.server.settings
        self._ctx = tls.https_server_context(s.cert_file, s.key_file, s.front_client_ca_file)
        self._ctx.set_alpn_protocols(["http/1.1"])
        if host is None and socket.has_dualstack_ipv6():
            sock = socket.create_server(
                ("", port), family=socket.AF_INET6, backlog=4096, dualstack_ipv6=True
            )
        else:
            sock = socket.create_server((host or "", port), backlog=4096)
        sock.setblocking(False)
        self._sock = sock
        self._accepting = asyncio.create_task(self._accept_loop(sock), name="https-front-accept")
        return int(sock.getsockname()[1])

    def socknames(self) -> list[tuple[object, ...]]:
        """Where the front listens (for the server's own-listener check)."""
        return [self._sock.getsockname()] if self._sock is not None else []

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError as exc:  # EMFILE and friends: back off instead of spinning
                log.warning("https front: accept failed", extra=kv(error=exc))
                await asyncio.sleep(0.1)
                continue
            conn.setblocking(False)
            task = asyncio.create_task(self._handle(conn, peer), name=f"https-front:{peer}")
            self.server.track(task)

    async def _handle(self, conn: socket.socket, peer: object) -> None:
        # Until a transport takes the socket over, closing it is ours to do.
        try:
            try:
                hello = await _peek_client_hello(conn, HELLO_TIMEOUT)
            except (sni.NotClientHello, ConnectionError, TimeoutError, OSError) as exc:
                self.server.metrics.tls_connections.labels(mode="refused").inc()
                log.info("https front: not a TLS client", extra=kv(peer=peer, reason=exc))
                conn.close()
                return
            model = self.server.store.model
            node = model.node(hello.server_name) if hello.server_name else None
            if node is not None:
                await self._passthrough(conn, peer, node.name)
            else:
                await self._terminate(conn, peer, hello.server_name)
        except Exception:
            log.exception("https front: connection failed", extra=kv(peer=peer))
        finally:
            if conn in self._handed:
                self._handed.discard(conn)  # its transport closes it
            else:
                conn.close()

    async def _passthrough(self, conn: socket.socket, peer: object, node: str) -> None:
        try:
            r = route(
                self.server.store.model,
                self.server.registry,
                node,
                None,
                local_node=self.server.settings.node_name,
            )
            upstream = await self.server.connect(r)
        except RoutingError as exc:
            # Inside TLS we cannot answer in HTTP without a certificate for the node: close.
            self.server.metrics.tls_connections.labels(mode="refused").inc()
            self.server.metrics.requests.labels(front=self.name, status=str(exc.status)).inc()
            log.info(
                "https front: refused",
                extra=kv(peer=peer, node=exc.node, status=exc.status, reason=exc.reason, sni=node),
            )
            return
        self.server.metrics.tls_connections.labels(mode="passthrough").inc()
        log.debug(
            "https front: SNI passthrough",
            extra=kv(peer=peer, node=node, target=f"{r.target.host}:{r.target.port}"),
        )
        try:
            reader, writer = await _streams(conn, None)
        except BaseException:
            upstream.close()
            raise
        self._handed.add(conn)
        error = await splice(upstream, reader, writer)
        log.debug("https front: passthrough done", extra=kv(node=node, error=error))

    async def _terminate(self, conn: socket.socket, peer: object, server_name: str | None) -> None:
        assert self._ctx is not None
        try:
            reader, writer = await _streams(conn, self._ctx)
            self._handed.add(conn)
        except (ssl.SSLError, ConnectionError, TimeoutError, OSError) as exc:
            self.server.metrics.tls_connections.labels(mode="refused").inc()
            log.info("https front: TLS handshake failed", extra=kv(peer=peer, error=exc))
            return
        self.server.metrics.tls_connections.labels(mode="terminate").inc()
        log.debug("https front: terminating TLS", extra=kv(peer=peer, sni=server_name or "-"))
        await self.proxy.serve(reader, writer)


async def _streams(
    conn: socket.socket, ctx: ssl.SSLContext | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Stream reader/writer over an accepted socket, optionally with server-side TLS."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_LIMIT)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.connect_accepted_socket(
        lambda: protocol,
        conn,
        ssl=ctx,
        ssl_handshake_timeout=HANDSHAKE_TIMEOUT if ctx is not None else None,
    )
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer


async def _wait_readable(conn: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(conn.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(conn.fileno())


async def _peek_client_hello(conn: socket.socket, timeout: float) -> sni.ClientHello:
    """Wait until the socket holds a whole ClientHello and parse it, consuming nothing."""
    seen = -1
    async with asyncio.timeout(timeout):
        while True:
            await _wait_readable(conn)
            try:
                data = conn.recv(sni.MAX_HELLO + 5, socket.MSG_PEEK)
            except BlockingIOError:
                continue
            if not data:
                raise ConnectionError("closed before a ClientHello")
            hello = sni.parse_client_hello(data)
            if hello is not None:
                return hello
            if len(data) == seen:
                # Readable but nothing new (the bytes stay queued): wait for the rest briefly
                # rather than spin on a level-triggered readiness.
                await asyncio.sleep(0.005)
            seen = len(data)
