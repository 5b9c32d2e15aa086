"""Who talks to whom: network domains (one per Gateway), the central gateway, relay paths.

Pure functions of the model. :mod:`ravenproxy.l3.desired` turns them into kernel objects;
``ravenproxy doctor`` can print them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from ravenproxy.l3.cidrs import collapse
from ravenproxy.model.objects import ENDPOINT_TUNNEL, Endpoint, Gateway
from ravenproxy.model.snapshot import Model


@dataclass(frozen=True)
class Domain:
    """One Gateway's network: its subnets and the node that carries its tunnel."""

    gateway: str
    #: Merged pod subnets of every member node.
    subnets: tuple[str, ...]
    #: The node holding the active tunnel endpoint, if any.
    gateway_node: str | None = None
    #: That node's InternalIP (the vxlan target of its members, the VPN's local address).
    private_ip: str | None = None
    #: Where a peer dials this domain's VPN: the public IP, or the private IP when not under
    #: NAT; ``None`` when it cannot be dialled.
    public_addr: str | None = None
    port: int = 0
    under_nat: bool = True
    #: The gateway is exposed and its endpoint is dialable: it can relay for NATed domains.
    can_relay: bool = False
    #: WireGuard public key published in the endpoint's ``config.publicKey``.
    public_key: str = ""

    @property
    def has_tunnel(self) -> bool:
        return self.gateway_node is not None and self.private_ip is not None


class PathKind(Enum):
    DIRECT = "direct"
    RELAY = "relay"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Path:
    """How traffic from domain ``src`` reaches domain ``dst``; ``via`` is the relay."""

    src: str
    dst: str
    kind: PathKind
    via: str | None = None

    @property
    def peer(self) -> str | None:
        """The gateway ``src`` holds the VPN connection with for this traffic."""
        if self.kind is PathKind.DIRECT:
            return self.dst
        if self.kind is PathKind.RELAY:
            return self.via
        return None


@dataclass(frozen=True)
class Topology:
    domains: Mapping[str, Domain]
    central: str | None

    def path(self, src: str, dst: str) -> Path:
        a, b = self.domains[src], self.domains[dst]
        if not (a.has_tunnel and b.has_tunnel):
            return Path(src, dst, PathKind.UNREACHABLE)
        # A side that is not under NAT always has a dialable address (public or private).
        if not (a.under_nat and b.under_nat):
            return Path(src, dst, PathKind.DIRECT)
        c = self.central
        if c is not None and c not in (src, dst) and self.domains[c].has_tunnel:
            return Path(src, dst, PathKind.RELAY, via=c)
        return Path(src, dst, PathKind.UNREACHABLE)

    def remotes(self, local: str) -> tuple[str, ...]:
        """Every other domain that has subnets, sorted."""
        return tuple(n for n in sorted(self.domains) if n != local and self.domains[n].subnets)


def gateway_subnets(model: Model, gw: Gateway) -> tuple[str, ...]:
    """The gateway's status lists each node's subnets; before the controller has written a
    status, the members' podCIDRs are the same information."""
    from_status = [s for info in gw.status_nodes for s in info.subnets]
    if from_status:
        return collapse(from_status)
    return collapse(c for n in model.members(gw.name) for c in n.pod_cidrs)


def tunnel_endpoint(gw: Gateway) -> Endpoint | None:
    """The elected tunnel endpoint; before an election, the first one in the spec."""
    active = gw.active_of(ENDPOINT_TUNNEL)
    if active:
        return active[0]
    spec = gw.endpoints_of(ENDPOINT_TUNNEL)
    return spec[0] if spec else None


def domain_of(model: Model, gw: Gateway, default_port: int) -> Domain:
    subnets = gateway_subnets(model, gw)
    ep = tunnel_endpoint(gw)
    if ep is None:
        return Domain(gateway=gw.name, subnets=subnets)
    node = model.node(ep.node_name)
    private_ip = node.internal_ip if node is not None else None
    if private_ip is None:
        for info in gw.status_nodes:
            if info.node_name == ep.node_name and info.private_ip:
                private_ip = info.private_ip
    if ep.public_ip:
        public: str | None = ep.public_ip
    elif not ep.under_nat:
        public = private_ip
    else:
        public = None
    port = ep.public_port or ep.port or default_port
    return Domain(
        gateway=gw.name,
        subnets=subnets,
        gateway_node=ep.node_name,
        private_ip=private_ip,
        public_addr=public,
        port=port,
        under_nat=ep.under_nat,
        can_relay=(not ep.under_nat and public is not None and (gw.exposed or bool(ep.public_ip))),
        public_key=ep.config.get("publicKey", ""),
    )


def topology(model: Model, default_port: int = 4500) -> Topology:
    domains = {name: domain_of(model, gw, default_port) for name, gw in model.gateways.items()}
    relays = sorted(n for n, d in domains.items() if d.can_relay and d.has_tunnel)
    # Several candidates: the first by name, so every node computes the same central gateway.
    return Topology(domains=MappingProxyType(domains), central=relays[0] if relays else None)
