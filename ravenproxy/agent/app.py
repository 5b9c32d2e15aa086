"""The edge agent: keeps one tunnel to the server up and serves the streams it carries.

The connector loop dials ``wss://`` with mTLS, runs a :class:`Session` until it ends, logs why,
and dials again after an exponential, fully jittered delay. The delay sequence restarts once a
tunnel came up (the peer's SETTINGS arrived), so a server restart is followed by a quick return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidMessage, InvalidStatus

from ravenproxy.agent.backoff import backoff
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.kube.sources import model_source
from ravenproxy.lifecycle import listening, parts
from ravenproxy.log import kv
from ravenproxy.metrics import AgentMetrics, metrics_app, start_app
from ravenproxy.model.allowlist import Allowlist, gateway_allowlist
from ravenproxy.model.store import ModelStore
from ravenproxy.transport import tls
from ravenproxy.transport.bytestream import TunnelByteStream
from ravenproxy.transport.dialer import DialError, dial
from ravenproxy.transport.relay import relay
from ravenproxy.transport.session import Session, StreamClosedError, TunnelStream, websocket_options

if TYPE_CHECKING:
    from ravenproxy.l3.publish import KeyPublisher

log = logging.getLogger(__name__)


def describe_connect_error(exc: BaseException) -> str:
    """One line saying why a dial to the server failed, for the log."""
    if isinstance(exc, InvalidStatus):
        return f"server answered HTTP {exc.response.status_code}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"server certificate rejected: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError):
        return exc.strerror or repr(exc)
    if isinstance(exc, InvalidMessage) and isinstance(exc.__cause__, EOFError):
        # With TLS 1.3 the server checks our certificate after our side of the handshake is
        # done, so a refused certificate shows up here, as a connection closed without answer.
        return (
            "the server closed the connection during the handshake: is this agent's "
            "certificate signed by the server's CA, unexpired, and for this node?"
        )
    if isinstance(exc, InvalidHandshake):
        return f"WebSocket handshake failed: {exc}"
    return repr(exc)


class Agent:
    def __init__(self, settings: AgentSettings, store: ModelStore | None = None) -> None:
        self.settings = settings
        self.store = store or ModelStore()
        self.metrics = AgentMetrics()
        self.session: Session | None = None
        self.connected = asyncio.Event()
        self._runners: list[web.AppRunner] = []
        self._stopping = False
        self._extra_allow = Allowlist.parse(settings.allow)
        self.allowlist = self._build_allowlist()
        self.store.subscribe(lambda _model: self._refresh_allowlist())
        self.metrics.streams.set_function(
            lambda: len(self.session.streams) if self.session is not None else 0
        )
        self.ports: dict[str, int] = {}

    def _build_allowlist(self) -> Allowlist:
        return gateway_allowlist(
            self.store.model,
            self.settings.node_name,
            self.settings.metrics_ports,
            self._extra_allow,
        )

    def _refresh_allowlist(self) -> None:
        self.allowlist = self._build_allowlist()
        log.info("allowlist updated", extra=kv(entries=len(self.allowlist)))

    def _ready(self) -> tuple[bool, str]:
        if self.session is not None and not self.session.closed and self.connected.is_set():
            return True, "tunnel up"
        return False, "tunnel down"

    async def run(self) -> None:
        """Serve until cancelled.

        The parts (model source, metrics listener, key publisher, L3 reconciler, the tunnel's
        connect loop) start in one task group: when one fails, at start or later, those started
        are stopped and waited for, and the error is raised alone when it is ours (a taken
        ``--metrics-addr`` is one line naming the flag, see :mod:`ravenproxy.lifecycle`).
        """
        s = self.settings
        ctx = tls.client_context(
            s.ca_file, s.cert_file, s.key_file, server_hostname_check=s.server_hostname_check
        )
        try:
            async with contextlib.AsyncExitStack() as stack:
                if s.inventory or s.kube_model:
                    await stack.enter_async_context(
                        model_source(
                            self.store,
                            inventory=s.inventory,
                            kube=s.kube_model,
                            kubeconfig=s.kubeconfig,
                        )
                    )
                publisher = None
                if s.kube_model and s.l3 is not None and s.l3.vpn_driver == "wireguard":
                    from ravenproxy.kube.client import new_api_client
                    from ravenproxy.l3.publish import KeyPublisher

                    api = await new_api_client(Path(s.kubeconfig) if s.kubeconfig else None)
                    stack.push_async_callback(api.close)
                    publisher = KeyPublisher(self.store, api, s.node_name, s.l3)
                async with parts() as tg:
                    # Listeners bind before any loop dials out: a taken address then fails
                    # the start without cutting a TLS handshake short (uvloop logs that).
                    await self._start_metrics()
                    self._start_parts(tg, ctx, publisher)
        finally:
            for runner in self._runners:
                await runner.cleanup()
            self._runners.clear()

    def _start_parts(
        self, tg: asyncio.TaskGroup, ctx: ssl.SSLContext, publisher: KeyPublisher | None
    ) -> None:
        s = self.settings
        if publisher is not None:
            # Remote gateways can only reach this one once its public key is in the Gateway.
            tg.create_task(publisher.run(), name="agent-wg-key-publish")
        if s.l3 is not None:
            from ravenproxy.l3.driver import Reconciler

            # The route driver reconciles on its own schedule: a tunnel that is down (or a
            # server that is away) never stops the L3 data path from being kept right.
            reconciler = Reconciler(self.store, s.node_name, s.l3)
            tg.create_task(reconciler.run(), name="agent-l3-reconcile")
        if not len(self.allowlist):
            log.warning(
                "the allowlist is empty: every stream will be refused", extra=kv(node=s.node_name)
            )
        tg.create_task(self._connect_loop(ctx), name="agent-connect")

    async def _start_metrics(self) -> None:
        """Bind ``--metrics-addr`` (metrics, /healthz, /readyz); cleaned up when :meth:`run`
        ends."""
        addr = self.settings.metrics_addr
        if addr is None:
            return
        async with listening("--metrics-addr", addr):
            runner, port = await start_app(
                metrics_app(self.metrics.registry, self._ready), addr.host, addr.port
            )
        self._runners.append(runner)
        self.ports["metrics"] = port

    async def _connect_loop(self, ctx: ssl.SSLContext) -> None:
        s = self.settings
        delays = backoff(s.backoff_base, s.backoff_cap)
        wire = s.session.wire
        while True:
            try:
                ws: ClientConnection = await connect(
                    s.server_url,
                    ssl=ctx,
                    open_timeout=10,
                    proxy=None,
                    user_agent_header=f"ravenproxy-agent/{s.node_name}",
                    logger=logging.getLogger("ravenproxy.agent.websocket"),
                    **websocket_options(wire),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure to dial is retried; the log says why
                delay = next(delays)
                self.metrics.connects.labels(result="failed").inc()
                log.warning(
                    "cannot reach the server, retrying",
                    extra=kv(
                        server=s.server_url,
                        reason=describe_connect_error(exc),
                        retry_in=f"{delay:.2f}s",
                    ),
                )
                await asyncio.sleep(delay)
                continue
            self.metrics.connects.labels(result="ok").inc()
            session = Session(
                ws,
                server_side=False,
                config=s.session,
                on_open=self._serve,
                name=s.node_name,
                fields={"node": s.node_name, "server": s.server_url},
            )
            session.on_stream_closed = self._stream_closed
            self.session = session
            runner = asyncio.create_task(session.run(), name="agent-session")
            try:
                await session.wait_ready()
                delays = backoff(s.backoff_base, s.backoff_cap)  # a good tunnel resets backoff
                self.connected.set()
                self.metrics.connected.set(1)
                log.info("tunnel up", extra=kv(node=s.node_name, server=s.server_url))
            except StreamClosedError:
                pass
            try:
                await asyncio.shield(runner)
            except asyncio.CancelledError:
                await session.close("agent stopping")
                await asyncio.gather(runner, return_exceptions=True)
                raise
            finally:
                self.connected.clear()
                self.metrics.connected.set(0)
            delay = next(delays)
            log.warning(
                "tunnel down, reconnecting",
                extra=kv(reason=session.close_reason, retry_in=f"{delay:.2f}s"),
            )
            await asyncio.sleep(delay)

    def _stream_closed(self, stream: TunnelStream) -> None:
        self.metrics.bytes.labels(direction="up").inc(stream.bytes_out)
        self.metrics.bytes.labels(direction="down").inc(stream.bytes_in)

    async def _serve(self, stream: TunnelStream) -> None:
        target = stream.target
        try:
            dialed = await dial(
                target.host, target.port, self.allowlist, self.settings.dial_timeout
            )
        except DialError as exc:
            self.metrics.dials.labels(result=exc.code.name.lower()).inc()
            log.info(
                "stream refused",
                extra=kv(
                    stream=stream.id,
                    target=f"{target.host}:{target.port}",
                    node=target.node,
                    code=exc.code.name,
                    reason=exc.message,
                ),
            )
            stream.reject(exc.code, exc.message)
            return
        self.metrics.dials.labels(result="ok").inc()
        stream.accept()
        await relay(TunnelByteStream(stream), dialed.reader, dialed.writer, label=str(stream.id))


async def run_agent(settings: AgentSettings) -> None:
    agent = Agent(settings)
    await agent.run()


__all__ = ["Agent", "run_agent"]
