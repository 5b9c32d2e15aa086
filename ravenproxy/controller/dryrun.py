"""``ravenproxy controller --dry-run``, and ``--inventory``: the objects the controller would
write, as YAML.

Without a cluster the controller writes nothing: ``--inventory`` prints what it would write, at
start and on every change, from a model that ``model_source`` keeps current as for every other
command. A one-shot dry run of an inventory reads it once (``model_once``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import yaml

from ravenproxy.controller.agents import AgentPoller
from ravenproxy.controller.desired import Desired, desired_state
from ravenproxy.controller.election import DEFAULT_GRACE, Health
from ravenproxy.kube.sources import model_once, model_source
from ravenproxy.log import kv
from ravenproxy.model.objects import Gateway
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)

GATEWAY_API_VERSION = "raven.openyurt.io/v1beta1"


def dry_run_documents(desired: Desired) -> list[dict[str, Any]]:
    """Gateway statuses (sorted by name), then Services/Endpoints, then the DNS ConfigMap."""
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": GATEWAY_API_VERSION,
            "kind": "Gateway",
            "metadata": {"name": name},
            "status": _plain(status),
        }
        for name, status in desired.statuses.items()
    ]
    docs.extend(_plain(obj) for obj in desired.services)
    docs.append(_plain(desired.configmap))
    return docs


def _plain(obj: Any) -> Any:
    # safe_dump refuses MappingProxyType and tuples would print as Python tags elsewhere.
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def render_dry_run(
    model: Model,
    health: Health,
    now: float,
    cluster_ip: str | None = None,
    block_affinities: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """Multi-document YAML of every object the controller would write for ``model``.

    A dry run sees no existing LoadBalancer Services, so public addresses come only from
    ``spec.endpoints[].publicIP`` and the node annotation.
    """
    desired = desired_state(model, health, now, cluster_ip, None, block_affinities)
    log_refused(desired)
    return render_documents(dry_run_documents(desired))


def log_refused(desired: Desired) -> None:
    for name, why in desired.refused:
        log.warning("controller: gateway refused", extra=kv(gateway=name, error=why))


def render_documents(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, explicit_start=True)


async def dry_run_inventory(
    path: str | os.PathLike[str], now: float | None = None, cluster_ip: str | None = None
) -> str:
    """``ravenproxy controller --inventory FILE --dry-run``. No server reports agents to a dry
    run, so Ready alone decides the election (as in Raven). Raises InventoryError."""
    model = await model_once(path)
    return render_dry_run(
        model, Health.ready_only(), time.time() if now is None else now, cluster_ip
    )


async def run_inventory_controller(
    path: str | os.PathLike[str],
    write: Callable[[str], None],
    interval: float = 1.0,
    cluster_ip: str | None = None,
    agents_urls: Sequence[str] = (),
    agent_grace: float = DEFAULT_GRACE,
) -> None:
    """``ravenproxy controller --inventory FILE`` (no cluster to write to): hand the rendered
    objects to ``write`` at start and again whenever they change, until cancelled. The election
    result is fed back into the next round, as the Gateway status would be in a cluster, so
    the output stays stable while nothing changes. With ``agents_urls`` (servers' ``/agents``)
    an edge gateway whose agent is gone for ``agent_grace`` seconds fails over; without them
    Ready alone decides, as in Raven."""
    store = ModelStore()
    async with model_source(store, inventory=path, interval=interval) as feed:
        poller = AgentPoller(agents_urls, agent_grace) if agents_urls else None
        health = poller.health if poller is not None else Health.ready_only
        async with asyncio.TaskGroup() as tg:
            tg.create_task(feed.wait(), name="controller-model-feed")
            if poller is not None:
                tg.create_task(poller.run(), name="controller-agent-poller")
            tg.create_task(
                _inventory_loop(store, write, interval, cluster_ip, health),
                name="controller-inventory-loop",
            )


async def _inventory_loop(
    store: ModelStore,
    write: Callable[[str], None],
    interval: float,
    cluster_ip: str | None,
    health: Callable[[], Health],
) -> None:
    written: dict[str, Gateway] = {}
    last = ""
    while True:
        model = store.model
        gateways = [
            written.get(name, gw) if _same_spec(written.get(name), gw) else gw
            for name, gw in model.gateways.items()
        ]
        model = Model(
            nodes=model.nodes,
            gateways=MappingProxyType({g.name: g for g in gateways}),
            pods=model.pods,
        )
        desired = desired_state(model, health(), time.time(), cluster_ip)
        written = dict(desired.model.gateways)
        text = render_documents(dry_run_documents(desired))
        if text != last:
            log_refused(desired)
            write(text)
            last = text
        version = store.version
        with suppress(TimeoutError):
            async with asyncio.timeout(interval):
                await store.wait_changed(version)


def _same_spec(a: Gateway | None, b: Gateway) -> bool:
    if a is None:
        return False
    return replace(a, active_endpoints=(), status_nodes=(), resource_version="") == replace(
        b, active_endpoints=(), status_nodes=(), resource_version=""
    )
