"""Gateway pickup: elect each gateway's active endpoints and compute its status, as data.

Nothing here does I/O. The caller takes a :class:`Health` snapshot, calls :func:`elect` (or
:func:`elect_with_events`) per gateway and :func:`gateway_status`, and an applier writes the
result. Election is sticky (Raven's rule): a current active endpoint stays while it is healthy, so
repeated reconciles of an unchanged cluster never move an endpoint.

"Healthy" is stricter than Raven, which looks only at the Node's Ready condition: an edge gateway's
endpoint node must also run an agent that the proxy server has seen within a grace period, so a
gateway whose tunnel is dead fails over. Exposed gateways (``exposeType`` set) host the server
rather than dial it, so no agent connection is ever reported for them; Ready alone decides there.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from ravenproxy.controller.settings import DEFAULT_GRACE as DEFAULT_GRACE
from ravenproxy.model.objects import (
    ENDPOINT_PROXY,
    ENDPOINT_TUNNEL,
    EXPOSE_LOAD_BALANCER,
    Endpoint,
    Gateway,
    Node,
    NodeInfo,
)
from ravenproxy.model.snapshot import Model

ENDPOINT_TYPES = (ENDPOINT_PROXY, ENDPOINT_TUNNEL)

# Kubernetes Event reasons (CamelCase, as `kubectl describe gateway` shows them).
REASON_ELECTED = "ActiveEndpointElected"
REASON_FAILOVER = "ActiveEndpointFailover"
LOST_NOT_IN_SPEC = "EndpointRemoved"
LOST_NODE_DELETED = "NodeDeleted"
LOST_LEFT_GATEWAY = "NodeLeftGateway"
LOST_NOT_READY = "NodeNotReady"
LOST_AGENT_GONE = "AgentGone"
LOST_REPLICAS = "ReplicasReduced"

_NO_TIMES: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True)
class Health:
    """Agent liveness as the proxy server reported it, frozen at one moment.

    ``connected``: nodes whose agent holds a tunnel now. ``last_seen``: when a disconnected agent
    was last connected. ``since``: when tracking began; an agent never seen counts as seen then,
    so a freshly started controller gives agents ``grace`` seconds to dial in before it treats
    their gateways as dead. ``tracks_agents=False`` means nobody reports agents (a controller
    without a server): Ready alone decides, as in Raven.
    """

    connected: frozenset[str] = frozenset()
    last_seen: Mapping[str, float] = field(default_factory=lambda: _NO_TIMES)
    since: float = 0.0
    grace: float = DEFAULT_GRACE
    tracks_agents: bool = True

    @classmethod
    def ready_only(cls) -> Health:
        return cls(tracks_agents=False)

    def agent_alive(self, node_name: str, now: float) -> bool:
        if not self.tracks_agents or node_name in self.connected:
            return True
        seen = self.last_seen.get(node_name, self.since)
        return now - seen <= self.grace


@dataclass(frozen=True)
class ElectionEvent:
    """One change of a gateway's active endpoints; becomes a Kubernetes Event on the Gateway."""

    gateway: str
    node_name: str
    endpoint_type: str
    elected: bool
    reason: str
    message: str

    @property
    def event_type(self) -> str:
        return "Normal" if self.elected or self.reason == LOST_REPLICAS else "Warning"


@dataclass(frozen=True)
class Election:
    active: tuple[Endpoint, ...]
    events: tuple[ElectionEvent, ...]


def _unhealthy(
    gateway: Gateway,
    node_name: str,
    spec: Mapping[str, Endpoint],
    model: Model,
    health: Health,
    now: float,
) -> str | None:
    """Why ``node_name`` may not be an active endpoint of ``gateway``; None when it may."""
    if node_name not in spec:
        return LOST_NOT_IN_SPEC
    node = model.node(node_name)
    if node is None:
        return LOST_NODE_DELETED
    if node.gateway != gateway.name:
        return LOST_LEFT_GATEWAY
    if not node.ready:
        return LOST_NOT_READY
    if not gateway.exposed and not health.agent_alive(node_name, now):
        return LOST_AGENT_GONE
    return None


def _replicas(gateway: Gateway, type_: str) -> int:
    if type_ == ENDPOINT_PROXY:
        return gateway.proxy_config.replicas
    return gateway.tunnel_config.replicas


def _elect_type(
    gateway: Gateway, type_: str, model: Model, health: Health, now: float
) -> tuple[list[Endpoint], list[ElectionEvent]]:
    replicas = _replicas(gateway, type_)
    spec: dict[str, Endpoint] = {}
    for ep in gateway.endpoints_of(type_):
        # A node listed twice for one type is one candidate; the first entry's settings win.
        spec.setdefault(ep.node_name, ep)
    events: list[ElectionEvent] = []

    def lost(node_name: str, reason: str) -> None:
        events.append(
            ElectionEvent(
                gateway.name,
                node_name,
                type_,
                elected=False,
                reason=reason,
                message=f"{type_} endpoint {node_name} is no longer active: {reason}",
            )
        )

    chosen: list[str] = []
    for current in dict.fromkeys(e.node_name for e in gateway.active_of(type_)):
        reason = _unhealthy(gateway, current, spec, model, health, now)
        if reason is not None:
            lost(current, reason)
        elif len(chosen) >= replicas:
            lost(current, LOST_REPLICAS)
        else:
            chosen.append(current)
    failover = bool(events) and any(e.reason != LOST_REPLICAS for e in events)
    for name in sorted(spec):
        if len(chosen) >= replicas:
            break
        if name in chosen or _unhealthy(gateway, name, spec, model, health, now) is not None:
            continue
        chosen.append(name)
        events.append(
            ElectionEvent(
                gateway.name,
                name,
                type_,
                elected=True,
                reason=REASON_FAILOVER if failover else REASON_ELECTED,
                message=f"{type_} endpoint {name} elected"
                + (" after failover" if failover else ""),
            )
        )
    # The active endpoint is re-read from the spec so an edit (port, publicIP, config) reaches
    # the status without an election.
    return [spec[name] for name in chosen], events


def elect_with_events(gateway: Gateway, model: Model, health: Health, now: float) -> Election:
    active: list[Endpoint] = []
    events: list[ElectionEvent] = []
    for type_ in ENDPOINT_TYPES:
        eps, evs = _elect_type(gateway, type_, model, health, now)
        active.extend(eps)
        events.extend(evs)
    return Election(tuple(active), tuple(events))


def elect(gateway: Gateway, model: Model, health: Health, now: float) -> tuple[Endpoint, ...]:
    """The gateway's active endpoints: proxy ones first, then tunnel ones.

    Current active endpoints stay (in their current order) while healthy and within Replicas;
    free slots are filled from healthy candidates sorted by node name. A candidate is an entry of
    ``spec.endpoints`` whose node exists and carries this gateway's label.
    """
    return elect_with_events(gateway, model, health, now).active


def resolve_public_ip(
    endpoint: Endpoint,
    node: Node | None,
    lb_ingress: Mapping[tuple[str, str], str] | None = None,
    gateway: str = "",
) -> str:
    """The endpoint's public address: ``spec.endpoints[].publicIP``, else the node's
    ``raven.openyurt.io/public-ip`` annotation, else its LoadBalancer Service's ingress IP
    (``lb_ingress`` keyed by (gateway, node)); "" when none is known yet."""
    if endpoint.public_ip:
        return endpoint.public_ip
    if node is not None and node.public_ip_annotation:
        return node.public_ip_annotation
    if lb_ingress:
        return lb_ingress.get((gateway, endpoint.node_name), "")
    return ""


def node_infos(
    gateway: str,
    model: Model,
    block_affinities: Mapping[str, Sequence[str]] | None = None,
) -> tuple[NodeInfo, ...]:
    """``status.nodes``: every node labelled with the gateway, sorted by name.

    Subnets are all of ``spec.podCIDRs`` (IPv4 and IPv6; Raven keeps only the first). On Calico
    clusters the pod CIDRs are not what routes pods, so the caller passes each node's confirmed
    BlockAffinity CIDRs as ``block_affinities`` and those are used instead.
    """
    infos = []
    for node in model.members(gateway):
        if block_affinities is not None:
            subnets = tuple(_sorted_cidrs(block_affinities.get(node.name, ())))
        else:
            subnets = node.pod_cidrs
        infos.append(NodeInfo(node.name, node.internal_ip or "", subnets))
    return tuple(infos)


def _sorted_cidrs(cidrs: Iterable[str]) -> list[str]:
    def key(text: str) -> tuple[int, int, str]:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            return (9, 0, text)
        return (net.version, int(net.network_address), text)

    return sorted(dict.fromkeys(cidrs), key=key)


def endpoint_dict(ep: Endpoint) -> dict[str, Any]:
    """Raven's JSON for an Endpoint (omitempty fields left out)."""
    out: dict[str, Any] = {"nodeName": ep.node_name, "type": ep.type}
    if ep.port:
        out["port"] = ep.port
    if ep.under_nat:
        out["underNAT"] = True
    if ep.nat_type:
        out["natType"] = ep.nat_type
    if ep.public_ip:
        out["publicIP"] = ep.public_ip
    if ep.public_port:
        out["publicPort"] = ep.public_port
    if ep.config:
        out["config"] = dict(sorted(ep.config.items()))
    return out


def node_info_dict(info: NodeInfo) -> dict[str, Any]:
    return {"nodeName": info.node_name, "privateIP": info.private_ip, "subnets": list(info.subnets)}


def with_public_ips(
    gateway: Gateway,
    active: Iterable[Endpoint],
    model: Model,
    lb_ingress: Mapping[tuple[str, str], str] | None = None,
) -> tuple[Endpoint, ...]:
    """Fill each active endpoint's ``publicIP`` by :func:`resolve_public_ip`; only a
    LoadBalancer gateway consults the LoadBalancer ingress."""
    ingress = lb_ingress if gateway.expose_type == EXPOSE_LOAD_BALANCER else None
    return tuple(
        replace(
            ep, public_ip=resolve_public_ip(ep, model.node(ep.node_name), ingress, gateway.name)
        )
        for ep in active
    )


def gateway_status(
    gateway: Gateway,
    model: Model,
    active: Sequence[Endpoint],
    lb_ingress: Mapping[tuple[str, str], str] | None = None,
    block_affinities: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The Gateway's ``status`` as written to the API (Raven v1beta1 JSON)."""
    return {
        "nodes": [node_info_dict(i) for i in node_infos(gateway.name, model, block_affinities)],
        "activeEndpoints": [
            endpoint_dict(e) for e in with_public_ips(gateway, active, model, lb_ingress)
        ],
    }


def current_status(gateway: Gateway) -> dict[str, Any]:
    """The status the Gateway carries now, in the same shape, to decide whether to write."""
    return {
        "nodes": [node_info_dict(i) for i in gateway.status_nodes],
        "activeEndpoints": [endpoint_dict(e) for e in gateway.active_endpoints],
    }


def event_object(event: ElectionEvent, now: float, namespace: str = "default") -> dict[str, Any]:
    """A core/v1 Event about the (cluster-scoped) Gateway, as the applier would create it."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    digest = hashlib.sha256(
        f"{event.gateway}/{event.endpoint_type}/{event.node_name}/{event.reason}/{now}".encode()
    ).hexdigest()[:10]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{event.gateway[:240]}.{digest}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "raven.openyurt.io/v1beta1",
            "kind": "Gateway",
            "name": event.gateway,
        },
        "type": event.event_type,
        "reason": event.reason,
        "message": event.message,
        "source": {"component": "ravenproxy-controller"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
