"""The edge agent: holds one tunnel to every proxy server and serves the streams they carry.

Where the servers are: every ``--server-addr`` (several, or one load balancer's address dialled
until ``--server-count`` distinct servers are held), or, with ``--discover-servers``, the public
address of every active proxy endpoint in the model, followed as it changes. Each tunnel slot
has its own dial loop and backoff. A server is known by the id it announces in SETTINGS
(SERVER_ID): a second tunnel to a server already held is closed as a duplicate (close code
4000) and the slot dials again. Streams from any tunnel are served the same way.

Re-dial: a tunnel that was up is re-dialled within a second (jittered), whether its server
drained (GOAWAY) or went away, and its failed dials are retried 0.5-1.5 s apart for the next
10 s (a restart: about one dial a second per agent, not a herd); after that a failed dial backs
off exponentially with full jitter, only across consecutive failures
(:func:`ravenproxy.backoff.redial`). A slot's outage is logged once at WARNING (the first
failed dial, again on a new reason), its retries at DEBUG, its return with the attempts taken.

Certificates are reloaded from disk (:mod:`ravenproxy.transport.credentials`): every dial uses
the current set. When the agent's own certificate changes, each slot that is up rotates
make-before-break: it dials a replacement tunnel with the new certificate; once that is up on
the same server id, it becomes the slot's tunnel and the old one drains (GOAWAY, its streams
finish, then it closes), so no stream is cut. The replacement belongs to the slot it replaces,
so it is not a duplicate; a replacement that lands on another server (behind a load balancer)
is closed as one and dialled again.

The slots, their dial loops and rotations are :mod:`ravenproxy.agent.tunnels` (one slot:
:mod:`ravenproxy.agent.slot`); this module starts them and serves the streams they carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from ravenproxy.agent.settings import AgentSettings
from ravenproxy.agent.slot import Tunnel
from ravenproxy.agent.tunnels import TunnelSlots
from ravenproxy.kube.sources import model_source
from ravenproxy.lifecycle import listening, parts
from ravenproxy.log import kv
from ravenproxy.metrics import AgentMetrics
from ravenproxy.model.allowlist import Allowlist, gateway_allowlist
from ravenproxy.model.store import ModelStore
from ravenproxy.pki.credentials import Credentials
from ravenproxy.transport import readiness, tls
from ravenproxy.transport.credentials import CredentialFiles, CredentialsWatcher
from ravenproxy.transport.dialer import DialError, dial_protocol
from ravenproxy.transport.session import Session, TunnelStream
from ravenproxy.transport.splice import Splice

if TYPE_CHECKING:
    from aiohttp import web

    from ravenproxy.kube.certificates import CertificateRequester
    from ravenproxy.l3.publish import KeyPublisher

log = logging.getLogger(__name__)


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        store: ModelStore | None = None,
        metrics: AgentMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.store = store or ModelStore()
        # Kept only when served (--metrics-addr): nothing else reads them. A library agent
        # that reads them itself passes its own.
        self.metrics = metrics or AgentMetrics(served=settings.metrics_addr is not None)
        self._runners: list[web.AppRunner] = []
        self._stopping = False
        self._extra_allow = Allowlist.parse(settings.allow)
        self.credentials = CredentialsWatcher(
            CredentialFiles.of(settings.ca_file, settings.cert_file, settings.key_file),
            self._client_context,
            role="agent",
            on_change=self._credentials_changed,
        )
        self.slots = TunnelSlots(
            settings,
            self.store,
            self.metrics,
            self.credentials,
            serve=self._serve,
            stream_closed=self._stream_closed,
        )
        self.tunnels: dict[int, Tunnel] = self.slots.tunnels
        self.connected = self.slots.connected
        """Set while at least one tunnel is up."""
        self.allowlist = self._build_allowlist()
        self.store.subscribe(lambda _model: self._refresh_allowlist())
        m = self.metrics
        m.streams.set_function(self.slots.open_streams)
        m.tunnels_up.set_function(lambda: len(self.slots.up()))
        m.tunnels_wanted.set_function(self.slots.wanted)
        self.ports: dict[str, int] = {}

    @property
    def session(self) -> Session | None:
        """One tunnel that is up (None: none is)."""
        up = self.slots.up()
        return up[0].session if up else None

    def _build_allowlist(self) -> Allowlist:
        return gateway_allowlist(
            self.store.model,
            self.settings.node_name,
            self.settings.metrics_ports,
            self._extra_allow,
            pods=self.settings.allow_pods,
        )

    def _refresh_allowlist(self) -> None:
        self.allowlist = self._build_allowlist()
        log.info("allowlist updated", extra=kv(entries=len(self.allowlist)))

    def _ready(self) -> tuple[bool, str]:
        """Ready while at least one tunnel is up: any server can then reach this node."""
        return bool(self.slots.up()), f"tunnels up {self.slots.tally()}"

    async def run(self) -> None:
        """Serve until cancelled.

        The parts (model source, metrics listener, key publisher, L3 reconciler, the tunnels'
        dial loops) start in one task group: when one fails, at start or later, those started
        are stopped and waited for, and the error is raised alone when it is ours (a taken
        ``--metrics-addr`` is one line naming the flag, see :mod:`ravenproxy.lifecycle`).
        """
        s = self.settings
        readiness.of(asyncio.get_running_loop())  # the probe's epoll, before any connection
        try:
            async with contextlib.AsyncExitStack() as stack:
                # With --cert-dir the files exist once the first certificate is issued.
                requester = await self._certificates(stack)
                self._show_expiry(self.credentials.load())
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
                    from ravenproxy.kube.rest import connect
                    from ravenproxy.l3.publish import KeyPublisher

                    api = connect(s.kubeconfig)
                    stack.push_async_callback(api.close)
                    publisher = KeyPublisher(self.store, api, s.node_name, s.l3)
                async with parts() as tg:
                    # Listeners bind before any loop dials out: a taken address then fails
                    # the start without cutting a TLS handshake short (uvloop logs that).
                    await self._start_metrics()
                    tg.create_task(self.credentials.run(), name="agent-cert-reload")
                    if requester is not None:
                        tg.create_task(requester.run(), name="agent-cert-rotate")
                    self._start_parts(tg, publisher)
        finally:
            self.slots.stopped()
            for runner in self._runners:
                await runner.cleanup()
            self._runners.clear()
            readiness.release(asyncio.get_running_loop())

    # -- certificates ---------------------------------------------------------------------------
    def _client_context(self, creds: Credentials) -> ssl.SSLContext:
        return tls.client_context_for(
            creds, server_hostname_check=self.settings.server_hostname_check
        )

    def _show_expiry(self, creds: Credentials) -> None:
        self.metrics.cert_expiry.labels(role="agent").set(creds.not_after.timestamp())
        self.metrics.cert_expiry.labels(role="ca").set(creds.ca_not_after.timestamp())

    def _credentials_changed(self, old: Credentials, new: Credentials) -> None:
        self._show_expiry(new)
        if old.leaf_fingerprint == new.leaf_fingerprint:
            return  # only the CA bundle changed: new dials trust it, tunnels up stay
        log.info(
            "certificate rotated",
            extra=kv(
                node=self.settings.node_name,
                old_serial=old.serial,
                new_serial=new.serial,
                not_after=new.not_after.isoformat(),
                tunnels=len(self.slots.up()),
            ),
        )
        self.slots.rotate()

    async def _certificates(self, stack: contextlib.AsyncExitStack) -> CertificateRequester | None:
        """``--cert-dir``: until the directory holds this node's certificate (requested from
        Kubernetes if it does not); the requester then keeps it fresh (None: files given)."""
        s = self.settings
        if s.cert_dir is None:
            return None
        from ravenproxy.kube.certificates import RequestSettings, kept_certificates

        request = RequestSettings(
            role="agent",
            node=s.node_name,
            cert_dir=Path(s.cert_dir),
            lifetime=s.cert_lifetime,
            follow_ca_bundle=s.follows_ca_bundle,
        )
        return await stack.enter_async_context(kept_certificates(request, s.kubeconfig))

    def _start_parts(self, tg: asyncio.TaskGroup, publisher: KeyPublisher | None) -> None:
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
        self.slots.start(tg)

    async def _start_metrics(self) -> None:
        """Bind ``--metrics-addr`` (/metrics, /healthz, /readyz) and ``--health-addr`` (/healthz
        and /readyz only); cleaned up when :meth:`run` ends. aiohttp's server is imported here,
        only when one of them is given (an agent without them stays small)."""
        s = self.settings
        if s.metrics_addr is None and s.health_addr is None:
            return
        from ravenproxy.metrics_http import health_app, metrics_app, start_app

        addr = s.metrics_addr
        if addr is not None:
            registry = self.metrics.registry
            assert registry is not None, "an agent with --metrics-addr keeps its metrics"
            async with listening("--metrics-addr", addr):
                runner, port = await start_app(
                    metrics_app(registry, self._ready), addr.host, addr.port
                )
            self._runners.append(runner)
            self.ports["metrics"] = port
        addr = s.health_addr
        if addr is not None:
            async with listening("--health-addr", addr):
                runner, port = await start_app(health_app(self._ready), addr.host, addr.port)
            self._runners.append(runner)
            self.ports["health"] = port

    def _stream_closed(self, stream: TunnelStream) -> None:
        self.metrics.bytes.labels(direction="up").inc(stream.bytes_out)
        self.metrics.bytes.labels(direction="down").inc(stream.bytes_in)

    async def _serve(self, stream: TunnelStream) -> None:
        target = stream.target
        try:
            # Spliced by callbacks, not relayed by two tasks: a small request and its answer
            # cost no task wake-up of their own on the agent.
            splice, _ = await dial_protocol(
                target.host, target.port, self.allowlist, self.settings.dial_timeout, Splice
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
        if not stream.closed:  # else reset while dialling: the splice ends at once, closing it
            stream.accept()
        splice.start(stream)
        await splice.wait()


async def run_agent(settings: AgentSettings) -> None:
    agent = Agent(settings)
    await agent.run()


__all__ = ["Agent", "run_agent"]
