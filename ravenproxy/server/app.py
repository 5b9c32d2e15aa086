"""The cloud proxy server: the agent listener, the agent registry and the fronts.

Lifecycle: :meth:`ProxyServer.start` binds every listener (port 0 allowed; the bound ports are
then in :attr:`ProxyServer.ports`), :meth:`ProxyServer.stop` stops accepting, asks agents to
drain, waits up to ``drain_timeout``, then closes what is left and collects every task.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time
from typing import Any

from aiohttp import web
from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve

from ravenproxy.agent.allowlist import denied_always
from ravenproxy.errors import PKIError, RoutingError
from ravenproxy.log import kv
from ravenproxy.metrics import ServerMetrics, metrics_app, start_app
from ravenproxy.model.store import ModelStore
from ravenproxy.server.http_front import HttpFront
from ravenproxy.server.https_front import HttpsFront
from ravenproxy.server.liveness import KubeLiveness, add_agents_route
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.routing import HTTP_STATUS, REASONS, Route
from ravenproxy.server.settings import ServerSettings
from ravenproxy.server.upstream import (
    ByteStream,
    SocketByteStream,
    TlsByteStream,
    TlsError,
    TunnelByteStream,
)
from ravenproxy.transport import tls
from ravenproxy.transport.relay import READ_LIMIT
from ravenproxy.transport.session import (
    OpenError,
    Session,
    StreamClosedError,
    TunnelStream,
    websocket_options,
)
from ravenproxy.wire.codes import SUBPROTOCOL, ErrorCode

log = logging.getLogger(__name__)


class ProxyServer:
    def __init__(self, settings: ServerSettings, store: ModelStore) -> None:
        self.settings = settings
        self.store = store
        self.registry = AgentRegistry()
        self.metrics = ServerMetrics()
        self.ports: dict[str, int] = {}
        self._ws_server: WsServer | None = None
        self._fronts: list[asyncio.Server] = []
        self._runners: list[web.AppRunner] = []
        self._liveness: KubeLiveness | None = None
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self.http_front = HttpFront(self)
        self.https_front = HttpsFront(self)
        self.kubelet_tls: ssl.SSLContext | None = None
        self.metrics.streams.set_function(
            lambda: sum(len(s.streams) for s in self.registry.sessions())
        )
        self.metrics.buffered.set_function(
            lambda: max(
                (st.buffered for s in self.registry.sessions() for st in s.streams.values()),
                default=0,
            )
        )
        self._stopping = False

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        self.kubelet_tls = self._kubelet_context()
        ssl_ctx = tls.server_context(
            s.ca_file, s.cert_file, s.key_file, on_handshake_error=self._tls_refused
        )
        wire = s.session.wire
        self._ws_server = await serve(
            self._agent_connected,
            s.tunnel_addr.bind_host,
            s.tunnel_addr.port,
            ssl=ssl_ctx,
            server_header="ravenproxy",
            logger=logging.getLogger("ravenproxy.server.websocket"),
            **websocket_options(wire),
        )
        self.ports["tunnel"] = self._ws_server.sockets[0].getsockname()[1]
        http = await asyncio.start_server(
            self._owned(self.http_front.handle),
            s.http_addr.bind_host,
            s.http_addr.port,
            limit=64 * 1024,
            backlog=4096,
        )
        self._fronts.append(http)
        self.ports["http"] = http.sockets[0].getsockname()[1]
        self.ports["https"] = await self.https_front.start(
            s.https_addr.bind_host, s.https_addr.port
        )
        runner, port = await start_app(
            metrics_app(self.metrics.registry), s.metrics_addr.host, s.metrics_addr.port
        )
        self._runners.append(runner)
        self.ports["metrics"] = port
        health = metrics_app(self.metrics.registry, self._ready)
        add_agents_route(health, self.registry.sessions)
        runner, port = await start_app(health, s.health_addr.host, s.health_addr.port)
        self._runners.append(runner)
        self.ports["health"] = port
        if s.agent_leases:
            self._liveness = KubeLiveness(self.registry.connected_nodes, s.kubeconfig)
            await self._liveness.start()
        log.info("server listening", extra=kv(**self.ports))

    def _tls_refused(self, exc: ssl.SSLError) -> None:
        reason = exc.reason or exc.strerror or str(exc)
        self.metrics.agent_sessions.labels(outcome="tls_refused").inc()
        log.warning(
            "agent TLS handshake refused: is its certificate from our CA, unexpired, "
            "and presented at all?",
            extra=kv(reason=reason, verify=getattr(exc, "verify_message", "") or ""),
        )

    def _kubelet_context(self) -> ssl.SSLContext:
        """TLS re-originated to kubelets: verified against --kubelet-ca-file (or the system
        store) unless --kubelet-insecure-skip-verify, presenting --kubelet-cert-file."""
        s = self.settings
        ctx = tls.origin_client_context(
            s.kubelet_ca_file,
            s.kubelet_cert_file,
            s.kubelet_key_file,
            verify=not s.kubelet_insecure_skip_verify,
        )
        ctx.set_alpn_protocols(["http/1.1"])
        if s.kubelet_insecure_skip_verify:
            log.warning(
                "kubelet certificates are NOT verified (--kubelet-insecure-skip-verify): "
                "re-originated TLS to kubelets can be intercepted"
            )
        return ctx

    def _ready(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "stopping"
        return True, f"ready, {len(self.registry)} agent(s) connected"

    async def stop(self) -> None:
        self._stopping = True
        for front in self._fronts:
            front.close()
        await self.https_front.stop()
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
        for session in self.registry.sessions():
            session.goaway("server shutting down")
        if self._conn_tasks:
            await asyncio.wait(set(self._conn_tasks), timeout=self.settings.drain_timeout)
        for task in list(self._conn_tasks):
            task.cancel()
        await asyncio.gather(*self._conn_tasks, return_exceptions=True)
        for session in self.registry.sessions():
            await session.close("server shutting down")
        if self._ws_server is not None:
            self._ws_server.close()
            await self._ws_server.wait_closed()
        for front in self._fronts:
            await front.wait_closed()
        if self._liveness is not None:
            await self._liveness.stop()  # releases every Lease it holds
        for runner in self._runners:
            await runner.cleanup()
        log.info("server stopped")

    def track(self, task: asyncio.Task[Any]) -> None:
        """Own a connection task: collected (cancelled after the drain timeout) at shutdown."""
        self._conn_tasks.add(task)
        task.add_done_callback(self._conn_tasks.discard)

    def _owned(self, handler: Any) -> Any:
        """Wrap a connection handler so its task is tracked and cancelled at shutdown."""

        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._conn_tasks.add(task)
            try:
                await handler(reader, writer)
            finally:
                self._conn_tasks.discard(task)
                if not writer.is_closing():
                    writer.transport.abort()

        return run

    # -- agents -----------------------------------------------------------------------------
    async def _agent_connected(self, ws: ServerConnection) -> None:
        peer = ws.remote_address
        try:
            node = tls.peer_node_name(ws.transport.get_extra_info("ssl_object"))
        except PKIError as exc:
            log.warning("agent refused: bad certificate", extra=kv(peer=peer, error=exc))
            self.metrics.agent_sessions.labels(outcome="bad_certificate").inc()
            await ws.close(1008, "certificate does not name a node")
            return
        if ws.subprotocol != SUBPROTOCOL:
            log.warning(
                "agent refused: protocol version",
                extra=kv(
                    node=node,
                    peer=peer,
                    offered=ws.request.headers.get("Sec-WebSocket-Protocol", "")
                    if ws.request
                    else "",
                ),
            )
            self.metrics.agent_sessions.labels(outcome="bad_protocol").inc()
            await ws.close(1002, f"subprotocol {SUBPROTOCOL} required")
            return
        if self._stopping:
            await ws.close(1001, "server shutting down")
            return
        if self.store.model.node(node) is None:
            log.warning(
                "agent for a node not in the model: it can serve nothing yet",
                extra=kv(node=node, peer=peer),
            )
        session = Session(
            ws,
            server_side=True,
            config=self.settings.session,
            name=node,
            fields={"node": node, "peer": _peer(peer)},
        )
        session.on_stream_closed = self._stream_closed
        self.registry.add(node, session)
        self.metrics.agents.set(len(self.registry))
        self.metrics.agent_sessions.labels(outcome="connected").inc()
        log.info("agent connected", extra=kv(node=node, peer=_peer(peer)))
        try:
            await session.run()
        finally:
            if session.error is not None:  # closed by us for a connection error
                flood = session.error is ErrorCode.ENHANCE_YOUR_CALM
                outcome = "flood_closed" if flood else "protocol_error"
                self.metrics.agent_sessions.labels(outcome=outcome).inc()
            self.registry.remove(node, session)
            self.metrics.agents.set(len(self.registry))
            log.info("agent disconnected", extra=kv(node=node, reason=session.close_reason))

    def _stream_closed(self, stream: TunnelStream) -> None:
        self.metrics.bytes.labels(direction="up").inc(stream.bytes_out)
        self.metrics.bytes.labels(direction="down").inc(stream.bytes_in)

    # -- streams ----------------------------------------------------------------------------
    async def connect(self, route: Route, *, tls_to: bool = False) -> ByteStream:
        """A byte stream to the route's target: through its agent, or dialled by the server
        itself for a target in its own gateway; with ``tls_to``, TLS re-originated on top
        (verified against the kubelet CA, presenting the kubelet client certificate).
        Failures become a :class:`RoutingError` with their HTTP status."""
        upstream: ByteStream
        if route.session is None:
            upstream = await self._dial_direct(route)
        else:
            upstream = TunnelByteStream(await self.open(route))
        if not tls_to:
            return upstream
        assert self.kubelet_tls is not None
        secured = TlsByteStream(upstream, self.kubelet_tls, route.node.name)
        try:
            async with asyncio.timeout(self.settings.dial_timeout + 5):
                await secured.handshake()
        except TlsError as exc:
            upstream.close()
            raise RoutingError(502, route.node.name, f"TLS to the kubelet failed: {exc}") from None
        except TimeoutError:
            upstream.close()
            raise RoutingError(
                504, route.node.name, "TLS handshake to the kubelet timed out"
            ) from None
        except (ConnectionError, StreamClosedError) as exc:
            upstream.close()
            raise RoutingError(502, route.node.name, f"TLS to the kubelet failed: {exc}") from None
        return secured

    async def _dial_direct(self, route: Route) -> ByteStream:
        target = route.target
        where = f"{target.host}:{target.port}"
        try:
            ip = ipaddress.ip_address(target.host)
        except ValueError:
            ip = None
        if ip is not None and denied_always(ip):
            self.metrics.direct_dials.labels(result="refused").inc()
            raise RoutingError(403, route.node.name, f"{where} is never dialled")
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.dial_timeout):
                reader, writer = await asyncio.open_connection(
                    target.host, target.port, limit=READ_LIMIT
                )
        except TimeoutError:
            self.metrics.direct_dials.labels(result="dial_timeout").inc()
            raise RoutingError(
                504,
                route.node.name,
                f"direct dial {where} timed out after {self.settings.dial_timeout:g}s",
            ) from None
        except OSError as exc:
            self.metrics.direct_dials.labels(result="dial_failed").inc()
            raise RoutingError(
                502, route.node.name, f"direct dial {where} failed: {exc.strerror or exc}"
            ) from None
        finally:
            self.metrics.dial.observe(time.monotonic() - started)
        self.metrics.direct_dials.labels(result="ok").inc()
        return SocketByteStream(reader, writer)

    async def open(self, route: Route) -> TunnelStream:
        """Open a stream for a route; failures become a :class:`RoutingError` with its status."""
        assert route.session is not None, "a direct route has no agent stream"
        started = time.monotonic()
        try:
            stream = await route.session.open_stream(route.target)
        except OpenError as exc:
            self.metrics.opens.labels(result=exc.code.name.lower()).inc()
            status = HTTP_STATUS.get(exc.code, 502)
            reason = REASONS.get(exc.code, exc.code.name.lower())
            if exc.message:
                reason = f"{reason} ({exc.message})"
            raise RoutingError(status, route.node.name, reason) from None
        finally:
            self.metrics.dial.observe(time.monotonic() - started)
        self.metrics.opens.labels(result="ok").inc()
        return stream


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
