"""One immutable snapshot of the model, with the lookups every component needs.

A source builds a new :class:`Model` for every change; nobody mutates one in place, so a
component may keep the snapshot it planned from and compare it with the next.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ravenproxy.model.objects import ENDPOINT_PROXY, Gateway, Node, Pod

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Model:
    """The cluster objects the tunnel routes by, at one moment."""

    nodes: Mapping[str, Node] = field(default_factory=lambda: MappingProxyType({}))
    gateways: Mapping[str, Gateway] = field(default_factory=lambda: MappingProxyType({}))
    pods: Mapping[tuple[str, str], Pod] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def build(
        cls,
        nodes: Iterable[Node] = (),
        gateways: Iterable[Gateway] = (),
        pods: Iterable[Pod] = (),
    ) -> Model:
        return cls(
            nodes=MappingProxyType({n.name: n for n in nodes}),
            gateways=MappingProxyType({g.name: g for g in gateways}),
            pods=MappingProxyType({(p.namespace, p.name): p for p in pods}),
        )

    def node(self, name: str) -> Node | None:
        return self.nodes.get(name)

    def node_by_ip(self, ip: str) -> Node | None:
        try:
            wanted = ipaddress.ip_address(ip)
        except ValueError:
            return None
        for node in self.nodes.values():
            for address in node.internal_ips:
                try:
                    if ipaddress.ip_address(address) == wanted:
                        return node
                except ValueError:
                    continue
        return None

    def pod_cidrs_of(self, node_name: str) -> tuple[IPNetwork, ...]:
        """The pod CIDRs of a node: its ``spec.podCIDRs`` and the subnets its gateway's status
        lists for it (where the controller puts the Calico blocks it confirmed), without
        duplicates; text that is no CIDR is skipped. The one statement of "a node's pods": the
        router's pod-IP routing and the ``--allow-pods`` policy both ask here."""
        node = self.nodes.get(node_name)
        if node is None:
            return ()
        texts = list(node.pod_cidrs)
        gateway = self.gateways.get(node.gateway) if node.gateway is not None else None
        if gateway is not None:
            for info in gateway.status_nodes:
                if info.node_name == node_name:
                    texts.extend(info.subnets)
        cidrs: dict[IPNetwork, None] = {}
        for text in texts:
            try:
                cidrs[ipaddress.ip_network(text, strict=False)] = None
            except ValueError:
                continue
        return tuple(cidrs)

    def node_by_pod_ip(self, ip: str) -> Node | None:
        """The node whose pod CIDRs (:meth:`pod_cidrs_of`) contain ``ip``; the most specific
        CIDR wins where two overlap (a Calico block inside a wider podCIDR); None for no match
        or no IP."""
        try:
            wanted = ipaddress.ip_address(ip)
        except ValueError:
            return None
        if isinstance(wanted, ipaddress.IPv6Address) and wanted.ipv4_mapped is not None:
            wanted = wanted.ipv4_mapped
        for net, name in self._pod_index:
            if wanted.version == net.version and wanted in net:
                return self.nodes[name]
        return None

    @functools.cached_property
    def _pod_index(self) -> tuple[tuple[IPNetwork, str], ...]:
        """Every node's pod CIDRs, most specific first (built once per snapshot: the model is
        immutable, and a CONNECT to a pod IP looks here)."""
        pairs = [(net, name) for name in self.nodes for net in self.pod_cidrs_of(name)]
        pairs.sort(key=lambda p: (-p[0].prefixlen, p[1]))
        return tuple(pairs)

    def pod(self, namespace: str, name: str) -> Pod | None:
        return self.pods.get((namespace, name))

    def members(self, gateway: str) -> tuple[Node, ...]:
        """Nodes of a gateway: membership comes from the node label alone."""
        return tuple(
            sorted((n for n in self.nodes.values() if n.gateway == gateway), key=lambda n: n.name)
        )

    def peers_of(self, node_name: str) -> tuple[Node, ...]:
        """The nodes an agent on ``node_name`` may serve: its gateway's members, or only itself.
        The one statement of that rule: the agent's default allowlist and the server's choice
        of agent both ask here (peers are symmetric: ``b in peers_of(a)`` iff ``a in
        peers_of(b)``)."""
        node = self.nodes.get(node_name)
        if node is None:
            return ()
        if node.gateway is None:
            return (node,)
        return self.members(node.gateway)

    def proxy_nodes(self, gateway: str) -> tuple[str, ...]:
        """Node names that act as proxy endpoints of a gateway: the elected ones when the
        status says, otherwise every proxy endpoint in the spec."""
        gw = self.gateways.get(gateway)
        if gw is None:
            return ()
        active = gw.active_of(ENDPOINT_PROXY)
        chosen = active if active else gw.endpoints_of(ENDPOINT_PROXY)
        return tuple(dict.fromkeys(e.node_name for e in chosen))
