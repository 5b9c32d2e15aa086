"""One immutable snapshot of the model, with the lookups every component needs.

A source builds a new :class:`Model` for every change; nobody mutates one in place, so a
component may keep the snapshot it planned from and compare it with the next.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ravenproxy.model.objects import ENDPOINT_PROXY, Gateway, Node, Pod


@dataclass(frozen=True)
class Model:
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
