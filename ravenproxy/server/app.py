"""The cloud proxy server's lifecycle: it builds the agent registry, the router, the connector,
the fronts (which get those, never the server) and the agents' tunnel handler
(:mod:`ravenproxy.server.tunnels`), binds the listeners, stops.

:meth:`ProxyServer.start` binds every listener in order (port 0 allowed; the bound ports are then
in :attr:`ProxyServer.ports`); a listener that fails closes the ones bound before it and is one
:class:`~ravenproxy.errors.ConfigError` naming its flag. :meth:`ProxyServer.stop` stops
accepting, asks agents to drain, waits up to ``drain_timeout``, then closes what is left and
collects every task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import ssl
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from aiohttp import web
from websockets.asyncio.server import Server as WsServer

from ravenproxy.config import Address
from ravenproxy.errors import ConfigError
from ravenproxy.log import kv
from ravenproxy.metrics import ServerMetrics
from ravenproxy.metrics_http import health_app, metrics_app, start_app
from ravenproxy.model.store import ModelStore
from ravenproxy.pki.credentials import Credentials
from ravenproxy.server.agents import add_agents_route
from ravenproxy.server.connector import Connector
from ravenproxy.server.egress import EgressFront
from ravenproxy.server.front import FrontContext, FrontLimits
from ravenproxy.server.http_front import HttpFront
from ravenproxy.server.https_front import HttpsFront
from ravenproxy.server.limits import ClientStreams, ConnectionGate, front_connection_cap
from ravenproxy.server.liveness import KubeLiveness
from ravenproxy.server.loops import OwnListeners, via_token
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import Router
from ravenproxy.server.settings import ServerSettings, owner_ids
from ravenproxy.server.tunnels import Tunnels
from ravenproxy.transport import readiness, tls, ws_server
from ravenproxy.transport.credentials import CredentialFiles, CredentialsWatcher
from ravenproxy.transport.session import websocket_options

log = logging.getLogger(__name__)

T = TypeVar("T")


class ServerContexts(NamedTuple):
    """The contexts of one credential set: every new handshake on a listener uses the current
    ones (:func:`ravenproxy.transport.tls.follow_current`)."""

    tunnel: ssl.SSLContext
    front: ssl.SSLContext
    egress: ssl.SSLContext | None = None
    """The egress TLS listener's (--egress-addr), when there is one."""


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
        self._certificates: contextlib.AsyncExitStack | None = None
        self._cert_task: asyncio.Task[None] | None = None
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        # --cert-file/--key-file/--ca-file, reloaded from disk (the tunnel port and the HTTPS
        # front); --front-client-ca-file and the kubelet client files are read once.
        self.credentials = CredentialsWatcher(
            CredentialFiles.of(settings.ca_file, settings.cert_file, settings.key_file),
            self._contexts,
            role="server",
            on_change=self._credentials_changed,
        )
        self._reload_task: asyncio.Task[None] | None = None
        # The fronts' limits, shared by both fronts (see ravenproxy.server.limits).
        self.front_gate = ConnectionGate(
            front_connection_cap(settings.max_front_connections, _fd_limit())
        )
        self.client_streams = ClientStreams(settings.max_streams_per_client)
        self.metrics.front_connections.set_function(lambda: self.front_gate.open)
        self.listeners = OwnListeners()
        self.via = via_token(settings.node_name)
        """This process's Via pseudonym (loop detection)."""
        # The request path, built downward: front → router → connector → session.
        self.router = Router(store, self.registry, settings.node_name)
        self.connector = Connector(settings, store, self.metrics, self.listeners)
        fronts = self.fronts = FrontContext(
            router=self.router,
            connector=self.connector,
            limits=FrontLimits(
                max_header_size=settings.max_header_size,
                header_timeout=settings.header_timeout,
                idle_timeout=settings.idle_timeout,
                via=self.via,
            ),
            gate=self.front_gate,
            client_streams=self.client_streams,
            metrics=self.metrics,
            track=self.track,
        )
        self.http_front = HttpFront(fronts)
        self.https_front = HttpsFront(fronts)
        self.egress_fronts = {t: EgressFront(fronts, t) for t in ("uds", "tcp")}
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
        self.tunnels = Tunnels(settings, store, self.registry, self.metrics, lambda: self._stopping)

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind every listener, in order; if one fails, close the ones already bound (nothing
        is left listening) and raise :class:`ConfigError` naming the flag and address."""
        s = self.settings
        readiness.of(asyncio.get_running_loop())  # the probe's epoll, before any connection
        async with contextlib.AsyncExitStack() as undo:
            await self._start_certificates(undo)
            self.connector.load_tls()
            if s.kubelet_cert_file and not s.front_client_ca_file:
                log.warning(
                    "--kubelet-cert-file is never presented without --front-client-ca-file: "
                    "only clients that authenticate to the HTTPS front may use the server's "
                    "kubelet identity"
                )
            creds = self.credentials.load()
            self._show_expiry(creds)
            # The listening contexts only hold what is per listener (the refusal observer);
            # each handshake is switched over to the current set's contexts.
            ssl_ctx = tls.server_context_for(creds, on_handshake_error=self._tls_refused)
            tls.follow_current(ssl_ctx, lambda: self.credentials.contexts.tunnel)
            front_ctx = tls.https_server_context_for(creds, s.front_client_ca_file)
            tls.follow_current(front_ctx, lambda: self.credentials.contexts.front)
            ws = self._ws_server = await _bind(
                "--tunnel-addr",
                s.tunnel_addr,
                ws_server.serve(  # TLS on the socket itself (transport/tls_socket.py)
                    self.tunnels.accept,
                    s.tunnel_addr.bind_host,
                    s.tunnel_addr.port,
                    ssl=ssl_ctx,
                    on_handshake_error=self._tls_refused,
                    server_header="ravenproxy",
                    # asyncio's default of 100 overflows when 1 000 agents return at once
                    # after a restart (dropped handshakes are retried by TCP 1, 3, 7 s later).
                    backlog=4096,
                    logger=logging.getLogger("ravenproxy.server.websocket"),
                    **websocket_options(s.session.wire),
                ),
            )
            undo.push_async_callback(_close_ws, ws)
            self.ports["tunnel"] = ws.sockets[0].getsockname()[1]
            self.listeners.add("tunnel", (sock.getsockname() for sock in ws.sockets))
            if self.front_gate.limit < s.max_front_connections:
                log.warning(
                    "front connection cap lowered to stay well under the file descriptor limit",
                    extra=kv(
                        max_front_connections=s.max_front_connections,
                        enforced=self.front_gate.limit,
                        fd_limit=_fd_limit(),
                    ),
                )
            self.ports["http"] = await _bind(
                "--http-addr",
                s.http_addr,
                self.http_front.start(s.http_addr.bind_host, s.http_addr.port),
            )
            undo.push_async_callback(self.http_front.stop)
            self.listeners.add("http", self.http_front.listener.socknames())
            self.ports["https"] = await _bind(
                "--https-addr",
                s.https_addr,
                self.https_front.start(s.https_addr.bind_host, s.https_addr.port, front_ctx),
            )
            undo.push_async_callback(self.https_front.stop)
            self.listeners.add("https", self.https_front.listener.socknames())
            await self._start_egress(undo, creds)
            # /metrics and /agents only where metrics are served (loopback by default); the
            # health address, on every interface for the probes, answers /healthz and /readyz.
            metrics = metrics_app(self.metrics.registry, self._ready)
            add_agents_route(metrics, self.registry.sessions)
            runner, port = await _bind(
                "--metrics-addr",
                s.metrics_addr,
                start_app(metrics, s.metrics_addr.host, s.metrics_addr.port),
            )
            undo.push_async_callback(runner.cleanup)
            self._runners.append(runner)
            self.ports["metrics"] = port
            self.listeners.add("metrics", runner.addresses)
            health = health_app(self._ready)
            runner, port = await _bind(
                "--health-addr",
                s.health_addr,
                start_app(health, s.health_addr.host, s.health_addr.port),
            )
            undo.push_async_callback(runner.cleanup)
            self._runners.append(runner)
            self.ports["health"] = port
            self.listeners.add("health", runner.addresses)
            if s.agent_leases:
                liveness = KubeLiveness(self.registry.connected_nodes, s.kubeconfig)
                await liveness.start()
                self._liveness = liveness
            self._reload_task = asyncio.create_task(
                self.credentials.run(), name="server-cert-reload"
            )
            undo.pop_all()  # started: stop() takes everything down from here
        uds = {"egress_uds": s.egress_uds} if s.egress_uds is not None else {}
        log.info("server listening", extra=kv(server_id=s.identity, **self.ports, **uds))

    async def _start_egress(self, undo: contextlib.AsyncExitStack, creds: Credentials) -> None:
        """The egress listeners (:mod:`ravenproxy.server.egress`), those configured."""
        s = self.settings
        if s.egress_uds is not None:
            owner = owner_ids(s.egress_uds_owner) if s.egress_uds_owner else None
            front = self.egress_fronts["uds"]
            await _bind(
                "--egress-uds", s.egress_uds, front.start_unix(s.egress_uds, s.egress_mode, owner)
            )
            undo.push_async_callback(front.stop)
        if s.egress_addr is not None:
            assert s.egress_client_ca_file is not None, "settings require it"
            ctx = tls.egress_server_context_for(creds, s.egress_client_ca_file)
            tls.follow_current(ctx, self._egress_context)
            front = self.egress_fronts["tcp"]
            self.ports["egress"] = await _bind(
                "--egress-addr",
                s.egress_addr,
                front.start_tls(s.egress_addr.bind_host, s.egress_addr.port, ctx),
            )
            undo.push_async_callback(front.stop)
            self.listeners.add("egress", front.listener.socknames())

    def _egress_context(self) -> ssl.SSLContext:
        ctx = self.credentials.contexts.egress
        assert ctx is not None, "built with the egress listener"
        return ctx

    def _contexts(self, creds: Credentials) -> ServerContexts:
        s = self.settings
        front = tls.https_server_context_for(creds, s.front_client_ca_file)
        front.set_alpn_protocols(["http/1.1"])
        egress = None
        if s.egress_addr is not None and s.egress_client_ca_file is not None:
            egress = tls.egress_server_context_for(creds, s.egress_client_ca_file)
        return ServerContexts(tls.server_context_for(creds), front, egress)

    def _show_expiry(self, creds: Credentials) -> None:
        self.metrics.cert_expiry.labels(role="server").set(creds.not_after.timestamp())
        self.metrics.cert_expiry.labels(role="ca").set(creds.ca_not_after.timestamp())

    def _credentials_changed(self, old: Credentials, new: Credentials) -> None:
        self._show_expiry(new)
        if old.ca_certs != new.ca_certs:
            log.warning(
                "CA bundle changed: agents whose certificates do not verify against it are "
                "refused at their next handshake; tunnels up stay up",
                extra=kv(ca=_subjects(new), old_ca=_subjects(old)),
            )

    async def _start_certificates(self, undo: contextlib.AsyncExitStack) -> None:
        """``--cert-dir``: until the directory holds the server certificate (requested from
        Kubernetes if it does not), then keep it fresh in a task of its own until :meth:`stop`."""
        s = self.settings
        if s.cert_dir is None:
            return
        from ravenproxy.kube.certificates import RequestSettings, kept_certificates

        assert s.node_name is not None, "settings require --node-name with --cert-dir"
        request = RequestSettings(
            role="server",
            node=s.node_name,
            cert_dir=Path(s.cert_dir),
            lifetime=s.cert_lifetime,
            follow_ca_bundle=s.follows_ca_bundle,
        )
        self._certificates = contextlib.AsyncExitStack()
        undo.push_async_callback(self._stop_certificates)
        requester = await self._certificates.enter_async_context(
            kept_certificates(request, s.kubeconfig, store=self.store, extra_sans=s.server_sans)
        )
        self._cert_task = asyncio.create_task(requester.run(), name="server-cert-rotate")

    async def _stop_certificates(self) -> None:
        task, self._cert_task = self._cert_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        kept, self._certificates = self._certificates, None
        if kept is not None:
            await kept.aclose()

    def _tls_refused(self, exc: ssl.SSLError) -> None:
        reason = exc.reason or exc.strerror or str(exc)
        self.metrics.agent_sessions.labels(outcome="tls_refused").inc()
        log.warning(
            "agent TLS handshake refused: is its certificate from our CA, unexpired, "
            "and presented at all?",
            extra=kv(
                reason=reason,
                verify=getattr(exc, "verify_message", "") or "",
                ca=_subjects(self.credentials.current),
            ),
        )

    def _ready(self) -> tuple[bool, str]:
        if self._stopping:
            return False, "stopping"
        return True, f"ready, {len(self.registry)} agent(s) connected"

    async def stop(self) -> None:
        """Drain, then stop. In this order: ``/readyz`` answers 503 (first, so the Service stops
        sending requests here), the fronts and the tunnel listener stop accepting, kept-alive
        idle client connections close, every agent gets GOAWAY; open streams then have up to
        --drain-timeout to finish, and what is left is cut."""
        self._stopping = True  # /readyz: 503 from now on
        if self._reload_task is not None:
            self._reload_task.cancel()
            await asyncio.gather(self._reload_task, return_exceptions=True)
        await self.http_front.stop()
        await self.https_front.stop()
        for egress in self.egress_fronts.values():
            await egress.stop()
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
        idle = self.fronts.drain.start()
        for session in self.registry.sessions():
            session.goaway("server shutting down")
        timeout = self.settings.drain_timeout
        log.info(
            "server draining",
            extra=kv(
                connections=len(self._conn_tasks),
                idle_closed=idle,
                agents=len(self.registry),
                drain_timeout=f"{timeout:g}s",
            ),
        )
        began = asyncio.get_running_loop().time()
        if self._conn_tasks:
            await asyncio.wait(set(self._conn_tasks), timeout=timeout)
        if self._conn_tasks:
            log.warning(
                "drain timeout: cutting the connections still open",
                extra=kv(connections=len(self._conn_tasks), drain_timeout=f"{timeout:g}s"),
            )
        else:
            took = asyncio.get_running_loop().time() - began
            log.info("server drained", extra=kv(took=f"{took:.2f}s"))
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
        await self._stop_certificates()
        for runner in self._runners:
            await runner.cleanup()
        readiness.release(asyncio.get_running_loop())
        log.info("server stopped")

    def track(self, task: asyncio.Task[Any]) -> None:
        """Own a connection task: collected (cancelled after the drain timeout) at shutdown."""
        self._conn_tasks.add(task)
        task.add_done_callback(self._conn_tasks.discard)


def _subjects(creds: Credentials) -> str:
    return ";".join(c.subject for c in creds.ca_certs)


def _fd_limit() -> int | None:
    """The soft descriptor limit (the CLI lifts it to the hard one at start-up)."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):  # pragma: no cover - no limit to read
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


async def _bind(flag: str, address: Address | str, binding: Awaitable[T]) -> T:
    """Await a listener's bind; a failure (address in use, not ours, ...) becomes a
    :class:`ConfigError` naming the flag, so the CLI prints one line instead of a traceback."""
    try:
        return await binding
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(flag, f"cannot listen on {address}: {why}") from None


async def _close_ws(server: WsServer) -> None:
    server.close()
    await server.wait_closed()
