"""The controller against Kubernetes: reconcile the desired state into the API, under a Lease.

Planning is :mod:`desired` and :mod:`services` (pure); this module is the thin I/O around them:
:class:`KubeWriter` turns each planned write into one API call, :class:`Reconciler` runs the
level-triggered loop (on every model change and at least every ``interval`` seconds, since agent
grace periods expire with time alone), and :func:`run_controller` wires the Kubernetes source, the
leader election and the loop together.

Two replicas never both write: leadership comes from a ``coordination.k8s.io`` Lease through
kubernetes_asyncio's leader election, and every single write checks it is still leading (a
replica that cannot renew stops writing within ``renew_deadline``, before the Lease it held can
expire for the other one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection.electionconfig import Config as ElectionConfig
from kubernetes_asyncio.leaderelection.leaderelection import LeaderElection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from ravenproxy.controller import dnsmap
from ravenproxy.controller.agents import AgentLeases, AgentPoller
from ravenproxy.controller.desired import desired_state
from ravenproxy.controller.dryrun import dry_run_documents, render_documents
from ravenproxy.controller.election import DEFAULT_GRACE, ElectionEvent, Health, event_object
from ravenproxy.controller.kube import (
    GATEWAY_GROUP,
    GATEWAY_PLURAL,
    GATEWAY_VERSION,
    KubeError,
    KubeSource,
    WatchSettings,
    new_api_client,
)
from ravenproxy.controller.services import (
    INTERNAL_SERVICE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    NAMESPACE,
    Op,
    load_balancer_ingress,
    plan_services,
)
from ravenproxy.controller.validation import REASON_INVALID
from ravenproxy.errors import RavenProxyError
from ravenproxy.log import kv
from ravenproxy.model.objects import Gateway
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class NotLeader(RavenProxyError):
    """A write was attempted by a replica that does not hold the Lease."""


def _default_identity() -> str:
    # POD_NAME is set by the Deployment (downward API); the pid tells replicas on one host apart.
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ControllerSettings:
    # Reconcile at least this often even without a model change (agent grace expiry, resync).
    interval: float = 5.0
    lease_name: str = "ravenproxy-controller"
    lease_namespace: str = "kube-system"
    # client-go's defaults; lease_duration > renew_deadline > 1.2 * retry_period >= 1.2.
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    identity: str = field(default_factory=_default_identity)
    # Gateways are cluster-scoped; Kubernetes puts Events about such objects in "default".
    event_namespace: str = "default"
    watch: WatchSettings = field(default_factory=WatchSettings)
    # An edge gateway's agent not reported (Lease renewal observed) for this long is gone.
    agent_grace: float = DEFAULT_GRACE
    # Watch the servers' agent-liveness Leases (ravenproxy.server.liveness) into Health.
    agent_leases: bool = True
    # Poll these servers' GET /agents instead of watching Leases (servers without API access).
    agents_urls: tuple[str, ...] = ()


@dataclass
class ReconcileReport:
    ops: list[Op] = field(default_factory=list)
    conflicts: list[tuple[str, str, str]] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    events: int = 0
    configmap_written: bool = False

    @property
    def wrote(self) -> bool:
        return bool(self.ops or self.statuses or self.events or self.configmap_written)


class KubeWriter:
    """One API call per write, raw JSON both ways; refuses every write while not leading."""

    def __init__(self, api: k8s_client.ApiClient, leading: Callable[[], bool]) -> None:
        self._core = k8s_client.CoreV1Api(api)
        self._custom = k8s_client.CustomObjectsApi(api)
        self._leading = leading

    async def _call(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, write: bool = True, **kwargs: Any
    ) -> tuple[int, dict[str, Any]]:
        if write and not self._leading():
            raise NotLeader("not the leader: refusing to write")
        resp: aiohttp.ClientResponse = await fn(*args, **kwargs, _preload_content=False)
        try:
            body = await resp.json(content_type=None) if resp.status != 204 else {}
        except ValueError:
            body = {}
        finally:
            resp.release()
        return resp.status, body if isinstance(body, dict) else {}

    @staticmethod
    def _check(status: int, body: Mapping[str, Any], what: str) -> None:
        if status >= 300:
            raise KubeError(status, f"{what}: {body.get('message', body.get('reason', ''))}")

    async def list_owned(self) -> list[dict[str, Any]]:
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        out: list[dict[str, Any]] = []
        for fn, kind in (
            (self._core.list_namespaced_service, "Service"),
            (self._core.list_namespaced_endpoints, "Endpoints"),
        ):
            status, body = await self._call(fn, NAMESPACE, label_selector=selector, write=False)
            self._check(status, body, f"list {kind}")
            for item in body.get("items") or []:
                # List items carry no kind; the planner keys objects by it.
                out.append({"kind": kind, **item})
        return out

    async def apply(self, op: Op) -> tuple[int, dict[str, Any]]:
        """Perform one op; returns the API's (status, object). 409 on create and 404 on
        delete are returned, not raised: the caller decides what they mean."""
        calls: dict[str, tuple[Callable[..., Awaitable[Any]], ...]] = {
            "Service": (
                self._core.create_namespaced_service,
                self._core.patch_namespaced_service,
                self._core.delete_namespaced_service,
            ),
            "Endpoints": (
                self._core.create_namespaced_endpoints,
                self._core.patch_namespaced_endpoints,
                self._core.delete_namespaced_endpoints,
            ),
        }
        create, patch, delete = calls[op.kind]
        what = f"{op.action} {op.kind} {op.namespace}/{op.name}"
        if op.action == "create":
            status, body = await self._call(create, op.namespace, dict(op.body or {}))
            if status != 409:
                self._check(status, body, what)
        elif op.action == "update":
            patch_body = {
                k: v for k, v in (op.body or {}).items() if k not in ("apiVersion", "kind")
            }
            meta = dict(patch_body.get("metadata") or {})
            # A merge patch carrying the resourceVersion fails with 409 if someone wrote in
            # between, instead of silently overwriting what we did not see.
            meta["resourceVersion"] = op.resource_version
            patch_body["metadata"] = meta
            status, body = await self._call(
                patch, op.name, op.namespace, patch_body, _content_type=MERGE_PATCH
            )
            self._check(status, body, what)
        else:
            status, body = await self._call(delete, op.name, op.namespace)
            if status != 404:
                self._check(status, body, what)
        return status, body

    async def patch_status(self, name: str, status_body: Mapping[str, Any]) -> dict[str, Any]:
        status, body = await self._call(
            self._custom.patch_cluster_custom_object_status,
            GATEWAY_GROUP,
            GATEWAY_VERSION,
            GATEWAY_PLURAL,
            name,
            {"status": dict(status_body)},
            _content_type=MERGE_PATCH,
        )
        self._check(status, body, f"patch Gateway {name} status")
        return body

    async def create_event(self, event: Mapping[str, Any]) -> None:
        ns = event["metadata"]["namespace"]
        status, body = await self._call(self._core.create_namespaced_event, ns, dict(event))
        if status >= 300:
            # An event that cannot be recorded must not stop reconciliation.
            log.warning("controller: event not recorded", extra=kv(status=status, body=body))

    async def read_configmap(self) -> dict[str, Any] | None:
        status, body = await self._call(
            self._core.read_namespaced_config_map,
            dnsmap.CONFIGMAP_NAME,
            dnsmap.NAMESPACE,
            write=False,
        )
        if status == 404:
            return None
        self._check(status, body, "read ConfigMap")
        return body

    async def write_configmap(self, exists: bool, desired: Mapping[str, Any]) -> None:
        if exists:
            # Patch only our key: other keys someone keeps in the ConfigMap survive.
            status, body = await self._call(
                self._core.patch_namespaced_config_map,
                dnsmap.CONFIGMAP_NAME,
                dnsmap.NAMESPACE,
                {"data": dict(desired["data"])},
                _content_type=MERGE_PATCH,
            )
        else:
            status, body = await self._call(
                self._core.create_namespaced_config_map, dnsmap.NAMESPACE, dict(desired)
            )
        self._check(status, body, "write ConfigMap")


def _internal_cluster_ip(objs: list[dict[str, Any]]) -> str | None:
    for obj in objs:
        if obj.get("kind") == "Service" and obj["metadata"].get("name") == INTERNAL_SERVICE:
            ip = (obj.get("spec") or {}).get("clusterIP")
            if ip and ip != "None":
                return str(ip)
    return None


class Reconciler:
    def __init__(
        self,
        writer: KubeWriter,
        store: ModelStore,
        health: Callable[[], Health],
        event_namespace: str = "default",
        clock: Callable[[], float] = time.time,
        block_affinities: Callable[[], Mapping[str, list[str]] | None] = lambda: None,
    ) -> None:
        self.writer = writer
        self.block_affinities = block_affinities
        self.store = store
        self.health = health
        self.event_namespace = event_namespace
        self.clock = clock
        # Status we wrote, until the watch brings the Gateway back: (resourceVersion we wrote
        # over, gateway as we wrote it). Without it a reconcile that runs before the watch event
        # would see the old status, elect again and emit every election event twice.
        self._written: dict[str, tuple[str, Gateway]] = {}
        # Refused gateways and the resourceVersion we reported: one Event per bad edit, not
        # one per round.
        self._refused: dict[str, str] = {}

    def _current_model(self) -> Model:
        model = self.store.model
        gateways = dict(model.gateways)
        for name, (old_rv, written) in list(self._written.items()):
            gw = gateways.get(name)
            if gw is not None and gw.resource_version == old_rv:
                gateways[name] = replace(
                    gw,
                    active_endpoints=written.active_endpoints,
                    status_nodes=written.status_nodes,
                )
            else:
                del self._written[name]
        return Model.build(model.nodes.values(), gateways.values(), model.pods.values())

    async def reconcile(self) -> ReconcileReport:
        report = ReconcileReport()
        now = self.clock()
        model = self._current_model()
        existing = await self.writer.list_owned()
        cluster_ip = _internal_cluster_ip(existing)
        desired = desired_state(
            model,
            self.health(),
            now,
            cluster_ip,
            load_balancer_ingress(existing),
            self.block_affinities(),
        )

        for name in desired.status_changed:
            await self.writer.patch_status(name, desired.statuses[name])
            self._written[name] = (
                model.gateways[name].resource_version,
                desired.model.gateways[name],
            )
            report.statuses.append(name)
        for event in desired.events:
            if event.gateway in desired.status_changed:
                await self.writer.create_event(event_object(event, now, self.event_namespace))
                report.events += 1
                log.info(
                    "controller: " + ("elected" if event.elected else "lost"),
                    extra=kv(gateway=event.gateway, node=event.node_name, reason=event.reason),
                )

        await self._report_refused(desired.refused, model, now, report)

        plan = plan_services(existing, desired.services)
        for key in plan.conflicts:
            log.warning("controller: name taken by an object we do not own", extra=kv(key=key))
            report.conflicts.append(key)
        for op in plan.ops:
            status, body = await self.writer.apply(op)
            if op.action == "create" and status == 409:
                report.conflicts.append((op.kind, op.namespace, op.name))
                log.warning("controller: create conflicts", extra=kv(kind=op.kind, name=op.name))
                continue
            report.ops.append(op)
            if op.kind == "Service" and op.name == INTERNAL_SERVICE and op.action != "delete":
                cluster_ip = _internal_cluster_ip([{"kind": "Service", **body}]) or cluster_ip

        # Recomputed after the ops: a just-created internal Service's ClusterIP goes straight
        # into the map instead of a round of InternalIPs first.
        cm = dnsmap.configmap(desired.model, cluster_ip)
        current = await self.writer.read_configmap()
        if dnsmap.needs_write(None if current is None else current.get("data") or {}, cm["data"]):
            await self.writer.write_configmap(current is not None, cm)
            report.configmap_written = True
        if report.wrote:
            log.info(
                "controller: reconciled",
                extra=kv(
                    ops=len(report.ops),
                    statuses=len(report.statuses),
                    events=report.events,
                    configmap=report.configmap_written,
                ),
            )
        return report

    async def _report_refused(
        self,
        refused: tuple[tuple[str, str], ...],
        model: Model,
        now: float,
        report: ReconcileReport,
    ) -> None:
        names = {name for name, _why in refused}
        for name in list(self._refused):
            if name not in names:
                del self._refused[name]
        for name, why in refused:
            rv = model.gateways[name].resource_version
            if self._refused.get(name) == rv:
                continue
            log.warning("controller: gateway refused", extra=kv(gateway=name, error=why))
            event = ElectionEvent(name, "", "", False, REASON_INVALID, f"spec refused: {why}")
            await self.writer.create_event(event_object(event, now, self.event_namespace))
            self._refused[name] = rv
            report.events += 1

    async def run(self, interval: float, active: asyncio.Event | None = None) -> None:
        """Reconcile on every model change and at least every ``interval`` seconds, while
        ``active`` is set (always, if None). Failures are logged and retried next round:
        reconciliation is level-triggered, so a missed round loses nothing."""
        while True:
            if active is not None:
                await active.wait()
            seen = self.store.version
            try:
                await self.reconcile()
            except NotLeader:
                log.info("controller: leadership lost mid-reconcile, stopping writes")
            except (KubeError, ApiException, aiohttp.ClientError, TimeoutError) as exc:
                log.warning("controller: reconcile failed, will retry", extra=kv(error=exc))
            with suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.store.wait_changed(seen)


async def lead(
    api: k8s_client.ApiClient, settings: ControllerSettings, leading: asyncio.Event
) -> None:
    """Hold ``leading`` set exactly while this replica holds the Lease; campaign forever.

    The work itself is not run by the library's callback (its task would outlive a cancelled
    election); the callbacks only flip ``leading``, which the reconciler and every write check.
    """

    async def started() -> None:
        log.info("controller: became leader", extra=kv(identity=settings.identity))
        leading.set()

    async def stopped() -> None:
        leading.clear()
        log.warning("controller: lost leadership", extra=kv(identity=settings.identity))

    while True:
        lock = LeaseLock(settings.lease_name, settings.lease_namespace, settings.identity, api)
        config = ElectionConfig(
            lock,
            settings.lease_duration,
            settings.renew_deadline,
            settings.retry_period,
            started,
            stopped,
        )
        try:
            await LeaderElection(config).run()
        except (ApiException, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            log.warning("controller: leader election failed, retrying", extra=kv(error=exc))
        finally:
            leading.clear()
        await asyncio.sleep(settings.retry_period)


async def run_controller_with(
    api: k8s_client.ApiClient,
    settings: ControllerSettings | None = None,
    health: Callable[[], Health] | None = None,
    store: ModelStore | None = None,
) -> None:
    """Source, leader election and reconcile loop on an existing API client, until cancelled."""
    settings = settings or ControllerSettings()
    store = store or ModelStore()
    source = KubeSource(api, store, settings.watch)
    leading = asyncio.Event()
    writer = KubeWriter(api, leading.is_set)
    agents: AgentLeases | AgentPoller | None = None
    if health is None and settings.agents_urls:
        agents = AgentPoller(settings.agents_urls, settings.agent_grace)
        health = agents.health
    elif health is None and settings.agent_leases:
        agents = AgentLeases(api, settings.agent_grace, settings.watch)
        health = agents.health
    reconciler = Reconciler(
        writer,
        store,
        health or Health.ready_only,
        settings.event_namespace,
        block_affinities=source.block_affinities,
    )

    async def reconcile_when_synced() -> None:
        await source.synced.wait()
        await reconciler.run(settings.interval, leading)

    async with asyncio.TaskGroup() as tg:
        if agents is not None:
            tg.create_task(agents.run(), name="controller-agent-liveness")
        tg.create_task(source.run(), name="controller-source")
        tg.create_task(lead(api, settings, leading), name="controller-leader-election")
        tg.create_task(reconcile_when_synced(), name="controller-reconciler")


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
    source = KubeSource(api, ModelStore())
    model = await source.list_once()
    existing = await KubeWriter(api, lambda: False).list_owned()
    desired = desired_state(
        model,
        health or Health.ready_only(),
        time.time(),
        _internal_cluster_ip(existing),
        load_balancer_ingress(existing),
        source.block_affinities(),
    )
    return render_documents(dry_run_documents(desired))


async def dry_run_kube(kubeconfig: Path | None) -> str:
    """``ravenproxy controller --kubeconfig F --dry-run``."""
    api = await new_api_client(kubeconfig)
    async with api:
        return await dry_run_with(api)
