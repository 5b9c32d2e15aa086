"""Everything the controller wants to exist, computed from one model snapshot as data.

Both the dry run and the Kubernetes applier start here, so what ``--dry-run`` prints is exactly
what a real run would write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from ravenproxy.controller.dnsmap import configmap
from ravenproxy.controller.election import (
    ElectionEvent,
    Health,
    current_status,
    elect_with_events,
    gateway_status,
    node_infos,
    with_public_ips,
)
from ravenproxy.controller.services import desired_services
from ravenproxy.controller.validation import describe, validate_gateway
from ravenproxy.model.objects import Gateway
from ravenproxy.model.snapshot import Model


@dataclass(frozen=True)
class Desired:
    # The input model with every gateway's status replaced by the elected one: later planners
    # (services, DNS) read it, so they never see a stale election.
    model: Model
    statuses: Mapping[str, Mapping[str, Any]]
    # Gateways whose status differs from what they carry now: the only status writes needed.
    status_changed: tuple[str, ...]
    events: tuple[ElectionEvent, ...]
    services: tuple[Mapping[str, Any], ...]
    configmap: Mapping[str, Any]
    # Gateways that break Raven's admission rules, with why: not elected, status left alone.
    refused: tuple[tuple[str, str], ...] = ()


def desired_state(
    model: Model,
    health: Health,
    now: float,
    cluster_ip: str | None = None,
    lb_ingress: Mapping[tuple[str, str], str] | None = None,
    block_affinities: Mapping[str, Sequence[str]] | None = None,
) -> Desired:
    """``cluster_ip`` is the internal Service's ClusterIP once the API has assigned one; it is
    used for the DNS map only while that Service is desired (L7 on), otherwise nodes map to their
    InternalIPs."""
    gateways: list[Gateway] = []
    statuses: dict[str, Mapping[str, Any]] = {}
    changed: list[str] = []
    events: list[ElectionEvent] = []
    refused: list[tuple[str, str]] = []
    for name in sorted(model.gateways):
        gw = model.gateways[name]
        violations = validate_gateway(gw)
        if violations:
            # No webhook stood between the user and us (inventory, or Raven's CRD without its
            # webhook): act on none of an invalid spec rather than on part of it.
            refused.append((name, describe(violations)))
            gateways.append(gw)
            continue
        election = elect_with_events(gw, model, health, now)
        events.extend(election.events)
        status = gateway_status(gw, model, election.active, lb_ingress, block_affinities)
        statuses[name] = status
        if status != current_status(gw):
            changed.append(name)
        gateways.append(
            replace(
                gw,
                active_endpoints=with_public_ips(gw, election.active, model, lb_ingress),
                status_nodes=node_infos(name, model, block_affinities),
            )
        )
    elected = Model(
        nodes=model.nodes, gateways=MappingProxyType({g.name: g for g in gateways}), pods=model.pods
    )
    return Desired(
        model=elected,
        statuses=MappingProxyType(statuses),
        status_changed=tuple(changed),
        events=tuple(events),
        services=tuple(desired_services(elected)),
        configmap=configmap(elected, cluster_ip),
        refused=tuple(refused),
    )
