"""The cloud proxy server: the agent listener, the agent registry and the fronts.

Lifecycle: :meth:`ProxyServer.start` binds every listener (port 0 allowed; the bound ports are
then in :attr:`ProxyServer.ports`), :meth:`ProxyServer.stop` stops accepting, asks agents to
drain, waits up to ``drain_timeout``, then closes what is left and collects every task.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
import ssl
import time
from typing import Any

from aiohttp import web
from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection, serve

from ravenproxy.errors import PKIError, RoutingError
from ravenproxy.log import kv
from ravenproxy.metrics import ServerMetrics, metrics_app, start_app
from ravenproxy.model.allowlist import Allowlist, gateway_allowlist
from ravenproxy.model.store import ModelStore
from ravenproxy.server.agents import add_agents_route
from ravenproxy.server.http_front import HttpFront
from ravenproxy.server.https_front import HttpsFront
from ravenproxy.server.limits import (
    ClientStreams,
    ConnectionGate,
    StreamLease,
    client_key,
    front_connection_cap,
)
from ravenproxy.server.liveness import KubeLiveness
from ravenproxy.server.loops import FRONTS, OwnListeners, via_token
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
from ravenproxy.transport.dialer import DialError, dial
from ravenproxy.transport.relay import RelayResult
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
        self._runners: list[web.AppRunner] = []
        self._liveness: KubeLiveness | None = None
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        # The fronts' limits, shared by both fronts (see ravenproxy.server.limits).
        self.front_gate = ConnectionGate(
            front_connection_cap(settings.max_front_connections, _fd_limit())
        )
        self.client_streams = ClientStreams(settings.max_streams_per_client)
        self.metrics.front_connections.set_function(lambda: self.front_gate.open)
        self.http_front = HttpFront(self)
        self.https_front = HttpsFront(self)
        self.kubelet_tls: ssl.SSLContext | None = None
        """Re-originated TLS presenting --kubelet-cert-file: for authenticated clients only."""
        self.kubelet_tls_anonymous: ssl.SSLContext | None = None
        """Re-originated TLS without a client certificate: for everyone else."""
        self.listeners = OwnListeners()
        self.via = via_token(settings.node_name)
        """This process's Via pseudonym (loop detection)."""
        self._extra_allow = Allowlist.parse(settings.allow)
        self.allowlist = self._build_allowlist()
        self.store.subscribe(lambda _model: self._refresh_allowlist())
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
        self.kubelet_tls = self._kubelet_context(with_client_cert=True)
        self.kubelet_tls_anonymous = self._kubelet_context(with_client_cert=False)
        if s.kubelet_cert_file and not s.front_client_ca_file:
            log.warning(
                "--kubelet-cert-file is never presented without --front-client-ca-file: only "
                "clients that authenticate to the HTTPS front may use the server's kubelet identity"
            )
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
        self.listeners.add("tunnel", (sock.getsockname() for sock in self._ws_server.sockets))
        if self.front_gate.limit < s.max_front_connections:
            log.warning(
                "front connection cap lowered to stay well under the file descriptor limit",
                extra=kv(
                    max_front_connections=s.max_front_connections,
                    enforced=self.front_gate.limit,
                    fd_limit=_fd_limit(),
                ),
            )
        self.ports["http"] = await self.http_front.start(s.http_addr.bind_host, s.http_addr.port)
        self.listeners.add("http", self.http_front.listener.socknames())
        self.ports["https"] = await self.https_front.start(
            s.https_addr.bind_host, s.https_addr.port
        )
        self.listeners.add("https", self.https_front.listener.socknames())
        runner, port = await start_app(
            metrics_app(self.metrics.registry), s.metrics_addr.host, s.metrics_addr.port
        )
        self._runners.append(runner)
        self.ports["metrics"] = port
        self.listeners.add("metrics", runner.addresses)
        health = metrics_app(self.metrics.registry, self._ready)
        add_agents_route(health, self.registry.sessions)
        runner, port = await start_app(health, s.health_addr.host, s.health_addr.port)
        self._runners.append(runner)
        self.ports["health"] = port
        self.listeners.add("health", runner.addresses)
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

    def _build_allowlist(self) -> Allowlist:
        """The policy of the server's own dials: the agent's, for the server's node."""
        node = self.settings.node_name
        if node is None:
            return Allowlist()  # no node, no gateway of its own: it never dials directly
        return gateway_allowlist(
            self.store.model, node, self.settings.metrics_ports, self._extra_allow
        )

    def _refresh_allowlist(self) -> None:
        self.allowlist = self._build_allowlist()
        log.debug("direct-dial allowlist updated", extra=kv(entries=len(self.allowlist)))

    def _kubelet_context(self, *, with_client_cert: bool) -> ssl.SSLContext:
        """TLS re-originated to kubelets: verified against --kubelet-ca-file (or the system
        store) unless --kubelet-insecure-skip-verify; ``with_client_cert`` presents
        --kubelet-cert-file."""
        s = self.settings
        ctx = tls.origin_client_context(
            s.kubelet_ca_file,
            s.kubelet_cert_file if with_client_cert else None,
            s.kubelet_key_file if with_client_cert else None,
            verify=not s.kubelet_insecure_skip_verify,
        )
        ctx.set_alpn_protocols(["http/1.1"])
        if s.kubelet_insecure_skip_verify and with_client_cert:
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
        await self.http_front.stop()
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
        if self._liveness is not None:
            await self._liveness.stop()  # releases every Lease it holds
        for runner in self._runners:
            await runner.cleanup()
        log.info("server stopped")

    def track(self, task: asyncio.Task[Any]) -> None:
        """Own a connection task: collected (cancelled after the drain timeout) at shutdown."""
        self._conn_tasks.add(task)
        task.add_done_callback(self._conn_tasks.discard)

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

    # -- limits -----------------------------------------------------------------------------
    def stream_lease(self, front: str, peer: object) -> StreamLease:
        """A stream slot of the client at ``peer`` (--max-streams-per-client); refused with
        :class:`RoutingError` 429 (counted) while that address holds all of its slots."""
        client = client_key(peer)
        lease = self.client_streams.acquire(client)
        if lease is None:
            self.metrics.client_stream_limit.labels(front=front).inc()
            raise RoutingError(
                429,
                "",
                f"too many concurrent streams from {client} (limit {self.client_streams.limit})",
            )
        return lease

    def relay_done(self, front: str, relay: str, result: RelayResult, **fields: object) -> None:
        """Account for a finished relay (``relay``: connect, upgrade, passthrough, request):
        one closed for --idle-timeout is counted and logged."""
        if result.idle:
            self.metrics.idle_timeouts.labels(front=front, relay=relay).inc()
            log.info(
                f"{front} front: idle connection closed",
                extra=kv(relay=relay, idle_timeout=f"{self.settings.idle_timeout:g}s", **fields),
            )
        else:
            log.debug(f"{front} front: {relay} done", extra=kv(error=result.error, **fields))

    # -- streams ----------------------------------------------------------------------------
    async def connect(
        self, route: Route, *, tls_to: bool = False, authenticated: bool = False
    ) -> ByteStream:
        """A byte stream to the route's target: through its agent, or dialled by the server
        itself for a target in its own gateway; with ``tls_to``, TLS re-originated on top
        (verified against the kubelet CA). The kubelet client certificate is presented only
        when the client ``authenticated`` to the front (a certificate from
        --front-client-ca-file): the server never lends its identity to an anonymous client.
        Failures become a :class:`RoutingError` with their HTTP status."""
        upstream: ByteStream
        if route.session is None:
            upstream = await self._dial_direct(route)
        else:
            upstream = TunnelByteStream(await self.open(route))
        if not tls_to:
            return upstream
        ctx = self.kubelet_tls if authenticated else self.kubelet_tls_anonymous
        assert ctx is not None
        self.metrics.kubelet_tls.labels(
            client_cert="presented"
            if authenticated and self.settings.kubelet_cert_file
            else "withheld"
        ).inc()
        secured = TlsByteStream(upstream, ctx, route.node.name)
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
        """Dial a target of the server's own gateway under the agent's policy, never one of the
        server's own listeners (a front → 508: the request would come straight back)."""
        target = route.target
        where = f"{target.host}:{target.port}"
        try:
            ip = ipaddress.ip_address(target.host)
        except ValueError:
            ip = None  # a name: the dialer checks every address it resolves to
        own = self.listeners.which(ip, target.port) if ip is not None else None
        if own in FRONTS:
            self.metrics.direct_dials.labels(result="refused").inc()
            self.metrics.loops.labels(kind="self_dial").inc()
            raise RoutingError(
                508, route.node.name, f"loop: {where} is this server's own {own} front"
            )
        if own is not None:
            self.metrics.direct_dials.labels(result="refused").inc()
            raise RoutingError(403, route.node.name, f"{where} is not in the server's allowlist")
        started = time.monotonic()
        try:
            dialed = await dial(
                target.host,
                target.port,
                self.allowlist,
                self.settings.dial_timeout,
                owner="the server",
            )
        except DialError as exc:
            result = exc.code.name.lower()
            self.metrics.direct_dials.labels(result=result).inc()
            status = HTTP_STATUS.get(exc.code, 502)
            reason = exc.message if status == 403 else f"direct {exc.message}"
            raise RoutingError(status, route.node.name, reason) from None
        finally:
            self.metrics.dial.observe(time.monotonic() - started)
        self.metrics.direct_dials.labels(result="ok").inc()
        return SocketByteStream(dialed.reader, dialed.writer)

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


def _fd_limit() -> int | None:
    """The soft descriptor limit (the CLI lifts it to the hard one at start-up)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):  # pragma: no cover - no limit to read
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)
