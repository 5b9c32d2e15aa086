"""The controller's entry points: ``ravenproxy controller`` against Kubernetes, and its dry run.

:func:`run_controller_with` wires the parts together: the model (through ``model_source``, like
every command), agent liveness, leader election (:mod:`leader`), the reconcile loop
(:mod:`reconciler`) writing through :mod:`writer`, and the certificate issuer (:mod:`issuer`);
with ``metrics_addr`` and ``health_addr``, ``/metrics`` (:class:`ControllerMetrics`) and the
probes (``/readyz``: 200 once the model synced, ``leader`` or ``follower``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from kubernetes_asyncio import client as k8s_client

from ravenproxy.config import Address
from ravenproxy.controller.agents import AgentLeases, AgentPoller
from ravenproxy.controller.desired import desired_state
from ravenproxy.controller.dryrun import dry_run_documents, render_documents
from ravenproxy.controller.election import DEFAULT_GRACE, Health
from ravenproxy.controller.issuer import Issuer
from ravenproxy.controller.leader import LeaderSettings, lead
from ravenproxy.controller.reconciler import Reconciler
from ravenproxy.controller.services import load_balancer_ingress
from ravenproxy.controller.settings import (
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    IssuerSettings,
)
from ravenproxy.controller.writer import KubeWriter, internal_cluster_ip
from ravenproxy.kube.client import new_api_client
from ravenproxy.kube.leases import default_identity
from ravenproxy.kube.reflector import WatchSettings
from ravenproxy.kube.sources import model_source
from ravenproxy.metrics import ControllerMetrics
from ravenproxy.metrics_http import health_app, metrics_app, serving
from ravenproxy.model.store import ModelStore


@dataclass(frozen=True)
class ControllerSettings:
    # Reconcile at least this often even without a model change (agent grace expiry, resync).
    interval: float = 5.0
    lease_name: str = "ravenproxy-controller"
    lease_namespace: str = "kube-system"
    # client-go's defaults; lease_duration > renew_deadline > 1.2 * retry_period >= 1.2.
    lease_duration: float = LEASE_DURATION
    renew_deadline: float = RENEW_DEADLINE
    retry_period: float = RETRY_PERIOD
    identity: str = field(default_factory=default_identity)
    # Gateways are cluster-scoped; Kubernetes puts Events about such objects in "default".
    event_namespace: str = "default"
    watch: WatchSettings = field(default_factory=WatchSettings)
    # An edge gateway's agent not reported (Lease renewal observed) for this long is gone.
    agent_grace: float = DEFAULT_GRACE
    # Watch the servers' agent-liveness Leases (ravenproxy.kube.leases) into Health.
    agent_leases: bool = True
    # Poll these servers' GET /agents instead of watching Leases (servers without API access).
    agents_urls: tuple[str, ...] = ()
    # Approve and sign our signers' CSRs (issuer.py); the CA lives in a Secret.
    certificates: IssuerSettings | None = field(default_factory=IssuerSettings)
    # /metrics (Prometheus) and /healthz + /readyz (probes): not served when None.
    metrics_addr: Address | None = None
    health_addr: Address | None = None

    @property
    def leader(self) -> LeaderSettings:
        return LeaderSettings(
            self.lease_name,
            self.lease_namespace,
            self.identity,
            self.lease_duration,
            self.renew_deadline,
            self.retry_period,
        )


async def run_controller_with(
    api: k8s_client.ApiClient,
    settings: ControllerSettings | None = None,
    health: Callable[[], Health] | None = None,
    store: ModelStore | None = None,
) -> None:
    """Model, agent liveness, leader election, reconcile loop and certificate issuer on an
    existing API client, until cancelled.

    The model comes through ``model_source`` on this same client, with the Calico blocks (status
    subnets) beside it. It starts without waiting for the first list: the replica campaigns and
    watches agent Leases meanwhile, and the reconciler starts once the model is complete.
    """
    settings = settings or ControllerSettings()
    store = store or ModelStore()
    leading = asyncio.Event()
    metrics = ControllerMetrics()
    writer = KubeWriter(api, leading.is_set, metrics)
    agents: AgentLeases | AgentPoller | None = None
    if health is None and settings.agents_urls:
        agents = AgentPoller(settings.agents_urls, settings.agent_grace)
        health = agents.health
    elif health is None and settings.agent_leases:
        agents = AgentLeases(api, settings.agent_grace, settings.watch)
        health = agents.health
    async with model_source(
        store, api=api, watch=settings.watch, calico_blocks=True, sync_timeout=None
    ) as feed:
        reconciler = Reconciler(
            writer,
            store,
            health or Health.ready_only,
            settings.event_namespace,
            block_affinities=feed.block_affinities,
            metrics=metrics,
        )
        metrics.model_synced.set_function(lambda: float(feed.synced.is_set()))

        def ready() -> tuple[bool, str]:
            """Ready once the model has synced; says whether this replica leads."""
            if not feed.synced.is_set():
                return False, "model not synced yet"
            return True, "leader" if leading.is_set() else "follower"

        def leadership(now_leading: bool) -> None:
            metrics.leader.set(1 if now_leading else 0)
            transition = "acquired" if now_leading else "lost"
            metrics.leader_transitions.labels(transition=transition).inc()

        async def reconcile_when_synced() -> None:
            await feed.synced.wait()
            await reconciler.run(settings.interval, leading)

        async with contextlib.AsyncExitStack() as listeners:
            # Bound before anything else starts: a taken address fails the start at once.
            if settings.metrics_addr is not None:
                await listeners.enter_async_context(
                    serving(
                        "--metrics-addr",
                        settings.metrics_addr,
                        metrics_app(metrics.registry, ready),
                    )
                )
            if settings.health_addr is not None:
                await listeners.enter_async_context(
                    serving("--health-addr", settings.health_addr, health_app(ready))
                )
            async with asyncio.TaskGroup() as tg:
                if agents is not None:
                    tg.create_task(agents.run(), name="controller-agent-liveness")
                tg.create_task(feed.wait(), name="controller-source")
                tg.create_task(
                    lead(api, settings.leader, leading, leadership),
                    name="controller-leader-election",
                )
                tg.create_task(reconcile_when_synced(), name="controller-reconciler")
                if settings.certificates is not None:
                    issuing = replace(
                        settings.certificates, event_namespace=settings.event_namespace
                    )
                    issuer = Issuer(api, writer, store, issuing, settings.watch, metrics)
                    tg.create_task(
                        issuer.run(leading, feed.synced), name="controller-certificate-issuer"
                    )


async def run_controller(
    kubeconfig: Path | None,
    settings: ControllerSettings | None = None,
    health: Callable[[], Health] | None = None,
) -> None:
    """``ravenproxy controller [--kubeconfig F]``: run until cancelled (in-cluster config when
    ``kubeconfig`` is None). ``health`` supplies agent liveness; without it the servers' agent
    Leases do (``settings.agent_leases``), else Ready alone decides."""
    api = await new_api_client(kubeconfig)
    async with api:
        await run_controller_with(api, settings, health)


async def dry_run_with(api: k8s_client.ApiClient, health: Health | None = None) -> str:
    """What one reconcile would write, as YAML, from one list of the cluster (no writes)."""
    store = ModelStore()
    async with model_source(store, api=api, calico_blocks=True, follow=False) as feed:
        existing = await KubeWriter(api, lambda: False).list_owned()
        desired = desired_state(
            store.model,
            health or Health.ready_only(),
            time.time(),
            internal_cluster_ip(existing),
            load_balancer_ingress(existing),
            feed.block_affinities(),
        )
    return render_documents(dry_run_documents(desired))


async def dry_run_kube(kubeconfig: Path | None) -> str:
    """``ravenproxy controller --kubeconfig F --dry-run``."""
    api = await new_api_client(kubeconfig)
    async with api:
        return await dry_run_with(api)
