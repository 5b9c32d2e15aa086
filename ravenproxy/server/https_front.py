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

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.server import sni
from ravenproxy.server.accept import FrontListener, streams
from ravenproxy.server.front import FrontContext
from ravenproxy.server.http_proxy import HttpProxy
from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.front_splice import splice_or_relay

log = logging.getLogger(__name__)


class HttpsFront:
    name = "https"

    def __init__(self, ctx: FrontContext) -> None:
        self.kit = ctx
        self.metrics = ctx.metrics
        self.proxy = HttpProxy(ctx, self.name, over_tls=True)
        self.listener = FrontListener(self.name, self._handle, ctx.gate, ctx.metrics, ctx.track)
        self._ctx: ssl.SSLContext | None = None
        self._handed: set[socket.socket] = set()
        """Accepted sockets a transport has taken over (and will close)."""

    async def start(self, host: str | None, port: int, ctx: ssl.SSLContext) -> int:
        """Listen; ``ctx`` terminates TLS (the server certificate, and client certificates
        from --front-client-ca-file when given)."""
        self._ctx = ctx
        self._ctx.set_alpn_protocols(["http/1.1"])
        return await self.listener.start(host, port)

    async def stop(self) -> None:
        await self.listener.stop()

    async def _handle(self, conn: socket.socket, peer: object) -> None:
        # Until a transport takes the socket over, closing it is ours to do.
        # --header-timeout bounds the ClientHello and the TLS handshake together.
        timeout = self.kit.limits.header_timeout
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            try:
                hello = await _peek_client_hello(conn, timeout)
            except TimeoutError:
                self.metrics.tls_connections.labels(mode="refused").inc()
                self.metrics.header_timeouts.labels(front=self.name, stage="client_hello").inc()
                log.info(
                    "https front: no ClientHello in time, closing",
                    extra=kv(peer=peer, header_timeout=f"{timeout:g}s"),
                )
                conn.close()
                return
            except (sni.NotClientHello, ConnectionError, OSError) as exc:
                self.metrics.tls_connections.labels(mode="refused").inc()
                log.info("https front: not a TLS client", extra=kv(peer=peer, reason=exc))
                conn.close()
                return
            node = self.kit.router.node_named(hello.server_name) if hello.server_name else None
            if node is not None:
                await self._passthrough(conn, peer, node.name)
            else:
                await self._terminate(conn, peer, hello.server_name, deadline)
        except Exception:
            log.exception("https front: connection failed", extra=kv(peer=peer))
        finally:
            if conn in self._handed:
                self._handed.discard(conn)  # its transport closes it
            else:
                conn.close()

    async def _passthrough(self, conn: socket.socket, peer: object, node: str) -> None:
        try:
            lease = self.kit.stream_lease(self.name, peer)
        except RoutingError as exc:
            # No HTTP to answer in (the TLS is the client's with the kubelet): close.
            self.metrics.tls_connections.labels(mode="refused").inc()
            self.metrics.requests.labels(front=self.name, status=str(exc.status)).inc()
            log.info(
                "https front: refused",
                extra=kv(peer=peer, node=node, status=exc.status, reason=exc.reason, sni=node),
            )
            return
        try:
            await self._passthrough_leased(conn, peer, node)
        finally:
            lease.release()

    async def _passthrough_leased(self, conn: socket.socket, peer: object, node: str) -> None:
        try:
            r = self.kit.router.route(node)
            upstream = await self.kit.connector.connect(r)
        except RoutingError as exc:
            # Inside TLS we cannot answer in HTTP without a certificate for the node: close.
            self.metrics.tls_connections.labels(mode="refused").inc()
            self.metrics.requests.labels(front=self.name, status=str(exc.status)).inc()
            log.info(
                "https front: refused",
                extra=kv(peer=peer, node=exc.node, status=exc.status, reason=exc.reason, sni=node),
            )
            return
        self.metrics.tls_connections.labels(mode="passthrough").inc()
        log.debug(
            "https front: SNI passthrough",
            extra=kv(peer=peer, node=node, target=f"{r.target.host}:{r.target.port}"),
        )
        try:
            reader, writer = await streams(conn, limit=READ_LIMIT)
        except BaseException:
            upstream.close()
            raise
        self._handed.add(conn)
        result = await splice_or_relay(
            upstream, reader, writer, idle_timeout=self.kit.limits.idle_timeout
        )
        self.kit.relay_done(self.name, "passthrough", result, peer=peer, node=node)

    async def _terminate(
        self, conn: socket.socket, peer: object, server_name: str | None, deadline: float
    ) -> None:
        assert self._ctx is not None
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        budget = asyncio.timeout(remaining)
        try:
            async with budget:
                reader, writer = await streams(
                    conn, self._ctx, limit=READ_LIMIT, handshake_timeout=remaining + 1
                )
            self._handed.add(conn)
        except TimeoutError as exc:
            if not budget.expired():  # ETIMEDOUT from the socket: a failed handshake
                self.metrics.tls_connections.labels(mode="refused").inc()
                log.info("https front: TLS handshake failed", extra=kv(peer=peer, error=exc))
                return
            self.metrics.tls_connections.labels(mode="refused").inc()
            self.metrics.header_timeouts.labels(front=self.name, stage="tls_handshake").inc()
            log.info(
                "https front: TLS handshake timed out, closing",
                extra=kv(peer=peer, header_timeout=f"{self.kit.limits.header_timeout:g}s"),
            )
            return
        except (ssl.SSLError, ConnectionError, OSError) as exc:
            self.metrics.tls_connections.labels(mode="refused").inc()
            log.info("https front: TLS handshake failed", extra=kv(peer=peer, error=exc))
            return
        self.metrics.tls_connections.labels(mode="terminate").inc()
        log.debug("https front: terminating TLS", extra=kv(peer=peer, sni=server_name or "-"))
        await self.proxy.serve(reader, writer)


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
