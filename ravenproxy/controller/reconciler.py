"""The controller's level-triggered loop: plan from the model, write the difference.

Planning is :mod:`desired` and :mod:`services` (pure); :class:`Reconciler` is the thin I/O around
them. It runs on every model change and at least every ``interval`` seconds, since agent grace
periods expire with time alone; a failed round is logged and the next one starts over, so a
missed round loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from ravenproxy.controller import dnsmap
from ravenproxy.controller.desired import desired_state
from ravenproxy.controller.election import ElectionEvent, Health, event_object
from ravenproxy.controller.services import (
    INTERNAL_SERVICE,
    Op,
    load_balancer_ingress,
    plan_services,
)
from ravenproxy.controller.validation import REASON_INVALID
from ravenproxy.controller.writer import KubeWriter, NotLeader, internal_cluster_ip
from ravenproxy.kube.client import KubeError
from ravenproxy.log import kv
from ravenproxy.metrics import ControllerMetrics
from ravenproxy.model.objects import Gateway
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)


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


class Reconciler:
    def __init__(
        self,
        writer: KubeWriter,
        store: ModelStore,
        health: Callable[[], Health],
        event_namespace: str = "default",
        clock: Callable[[], float] = time.time,
        block_affinities: Callable[[], Mapping[str, list[str]] | None] = lambda: None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.writer = writer
        self.metrics = metrics
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
        cluster_ip = internal_cluster_ip(existing)
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
                cluster_ip = internal_cluster_ip([{"kind": "Service", **body}]) or cluster_ip

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
            started = time.monotonic()
            result, kind = "ok", ""
            try:
                await self.reconcile()
            except NotLeader:
                result = "not_leader"
                log.info("controller: leadership lost mid-reconcile, stopping writes")
            except (KubeError, ApiException, aiohttp.ClientError, TimeoutError) as exc:
                result, kind = "error", error_kind(exc)
                log.warning("controller: reconcile failed, will retry", extra=kv(error=exc))
            if self.metrics is not None:
                self.metrics.reconciles.labels(result=result).inc()
                self.metrics.reconcile_duration.observe(time.monotonic() - started)
                if kind:
                    self.metrics.reconcile_errors.labels(kind=kind).inc()
            with suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.store.wait_changed(seen)


def error_kind(exc: BaseException) -> str:
    """The ``kind`` label of a failed round: ``api`` (the API answered with an error),
    ``http`` (no answer: connection), ``timeout``."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientError):
        return "http"
    return "api"
