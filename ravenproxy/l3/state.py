"""The node's L3 state as immutable data: what ravenproxy wants, or what the kernel has.

Desired and actual state share these types so that :func:`ravenproxy.l3.plan.plan` can compare
them. Every object has a ``key`` (its identity in the kernel: two objects with one key cannot
coexist) and ``describe()`` (one line for ``ravenproxy routes plan`` and logs).

Everything is frozen and made of tuples/frozensets: a state, once built, cannot change, so a
reconciler may keep the last state it applied while building the next one (Raven's
``lastSeenNetwork = network`` aliasing bug cannot happen here).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

VXLAN_DEVICE = "raven0"

#: Chains ravenproxy owns, per (table, chain), and the built-in chain each is jumped to from.
SKIP_SNAT_CHAIN = "RAVEN-POSTROUTING"
MARK_PREROUTING_CHAIN = "RAVEN-PREROUTING"
MARK_OUTPUT_CHAIN = "RAVEN-OUTPUT"
OWNED_CHAINS: dict[tuple[str, str], str] = {
    ("nat", SKIP_SNAT_CHAIN): "POSTROUTING",
    ("mangle", MARK_PREROUTING_CHAIN): "PREROUTING",
    ("mangle", MARK_OUTPUT_CHAIN): "OUTPUT",
}

#: ipsets ravenproxy owns start with this prefix (not "raven-": OpenYurt Raven may run here).
IPSET_PREFIX = "ravenproxy-"

#: xfrm policies carry no owner tag; ours are recognised by this exact priority. strongSwan
#: computes its priorities around 1.7 to 2.9 million, so this value never collides with them.
XFRM_PRIORITY = 1_000_099

XfrmDir = Literal["in", "fwd", "out"]
VpnKind = Literal["ipsec", "wireguard"]


@dataclass(frozen=True)
class Link:
    """A vxlan device. ``remote=None``: the gateway end, which learns its peers."""

    kind_name: ClassVar[str] = "link"
    name: str
    vni: int
    local: str
    remote: str | None
    port: int
    mtu: int

    @property
    def key(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        peer = f" remote {self.remote}" if self.remote else ""
        return (
            f"link {self.name} vxlan id {self.vni} local {self.local}{peer} "
            f"dstport {self.port} mtu {self.mtu}"
        )


@dataclass(frozen=True)
class Address:
    kind_name: ClassVar[str] = "address"
    dev: str
    cidr: str

    @property
    def key(self) -> tuple[str, ...]:
        return (self.dev, self.cidr)

    def describe(self) -> str:
        return f"address {self.cidr} dev {self.dev}"


@dataclass(frozen=True)
class Route:
    kind_name: ClassVar[str] = "route"
    dst: str
    table: int
    dev: str
    gateway: str | None = None
    src: str | None = None
    #: The gateway is reachable on ``dev`` even though no connected route says so.
    onlink: bool = False

    @property
    def key(self) -> tuple[object, ...]:
        return (self.table, self.dst)

    def describe(self) -> str:
        via = f" via {self.gateway}" if self.gateway else ""
        src = f" src {self.src}" if self.src else ""
        onlink = " onlink" if self.onlink else ""
        return f"route {self.dst} table {self.table}{via} dev {self.dev}{src}{onlink}"


@dataclass(frozen=True)
class Rule:
    kind_name: ClassVar[str] = "rule"
    family: int
    priority: int
    fwmark: int
    mask: int
    table: int

    @property
    def key(self) -> tuple[object, ...]:
        return (self.family, self.priority, self.fwmark, self.mask, self.table)

    def describe(self) -> str:
        fam = "-6 " if self.family == 6 else ""
        return (
            f"rule {fam}priority {self.priority} fwmark {self.fwmark:#x}/{self.mask:#x} "
            f"lookup {self.table}"
        )


@dataclass(frozen=True)
class IpSet:
    kind_name: ClassVar[str] = "ipset"
    name: str
    family: int
    members: tuple[str, ...]
    set_type: str = "hash:net"

    @property
    def key(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        fam = "inet6" if self.family == 6 else "inet"
        return f"ipset {self.name} {self.set_type} family {fam} [{' '.join(self.members)}]"


@dataclass(frozen=True)
class Chain:
    """One iptables chain we own, with its full content (rule specs after ``-A CHAIN``)."""

    kind_name: ClassVar[str] = "chain"
    family: int
    table: str
    name: str
    rules: tuple[tuple[str, ...], ...]

    @property
    def key(self) -> tuple[object, ...]:
        return (self.family, self.table, self.name)

    def describe(self) -> str:
        cmd = "ip6tables" if self.family == 6 else "iptables"
        return f"chain {cmd} -t {self.table} {self.name} ({len(self.rules)} rules)"

    def describe_rules(self) -> tuple[str, ...]:
        return tuple(f"  -A {self.name} {' '.join(r)}" for r in self.rules)


@dataclass(frozen=True)
class Jump:
    """The rule in a built-in chain that enters one of our chains.

    ``position`` is 1-based. Desired jumps are always at 1: a CNI MASQUERADE in front of ours
    would SNAT before our chain can exempt the traffic.
    """

    kind_name: ClassVar[str] = "jump"
    family: int
    table: str
    chain: str
    target: str
    spec: tuple[str, ...]
    position: int = 1

    @property
    def key(self) -> tuple[object, ...]:
        return (self.family, self.table, self.chain, self.target)

    def describe(self) -> str:
        cmd = "ip6tables" if self.family == 6 else "iptables"
        return f"jump {cmd} -t {self.table} {self.chain} #{self.position}: {' '.join(self.spec)}"


@dataclass(frozen=True)
class XfrmPolicy:
    """An xfrm policy with one ESP tunnel-mode template; ``tmpl_src=None`` matches any peer."""

    kind_name: ClassVar[str] = "xfrm"
    src: str
    dst: str
    dir: XfrmDir
    tmpl_dst: str
    tmpl_src: str | None = None
    priority: int = XFRM_PRIORITY
    #: ``level use``: packets that came in clear still pass (local IPVS replies would be
    #: dropped otherwise); decapsulated ones must match the template.
    optional: bool = True

    @property
    def key(self) -> tuple[str, ...]:
        return (self.src, self.dst, self.dir)

    def describe(self) -> str:
        tsrc = self.tmpl_src or "any"
        level = " level use" if self.optional else ""
        return (
            f"xfrm policy src {self.src} dst {self.dst} dir {self.dir} priority {self.priority}"
            f" tmpl src {tsrc} dst {self.tmpl_dst} proto esp mode tunnel{level}"
        )


@dataclass(frozen=True)
class Sysctl:
    """A value under /proc/sys, ``path`` relative to it (``net/ipv4/conf/raven0/rp_filter``)."""

    kind_name: ClassVar[str] = "sysctl"
    path: str
    value: str

    @property
    def key(self) -> tuple[str, ...]:
        return (self.path,)

    def describe(self) -> str:
        return f"sysctl {self.path.replace('/', '.')}={self.value}"


@dataclass(frozen=True)
class VpnConnection:
    """One encrypted tunnel from the local gateway node to a peer gateway.

    ``remote_addr=None``: the peer is under NAT and we cannot dial it, we only answer.
    ``relayed``: other gateways whose subnets ride along because this peer relays them.
    """

    kind_name: ClassVar[str] = "vpn"
    name: str
    kind: VpnKind
    peer_gateway: str
    local_addr: str
    remote_addr: str | None
    remote_port: int
    local_ts: tuple[str, ...]
    remote_ts: tuple[str, ...]
    initiator: bool
    relayed: tuple[str, ...] = ()
    #: WireGuard only: the peer's public key from its endpoint's ``config.publicKey``.
    remote_public_key: str = ""
    #: The local gateway's name (the IKE identity, with ``peer_gateway`` as the peer's).
    local_gateway: str = ""
    #: Actual state only: why what the VPN daemon holds is not this connection as desired
    #: (``"sa down"``, ``"config differs"``, ``"unknown peer"``); desired objects have ``""``.
    problem: str = ""

    @property
    def key(self) -> tuple[str, ...]:
        return (self.name,)

    def describe(self) -> str:
        remote = f"{self.remote_addr}:{self.remote_port}" if self.remote_addr else "%any"
        role = "initiator" if self.initiator else "responder"
        via = f" relaying {','.join(self.relayed)}" if self.relayed else ""
        problem = f" [{self.problem}]" if self.problem else ""
        return (
            f"vpn {self.name} {self.kind} {self.local_addr} <-> {remote} ({role}) "
            f"{','.join(self.local_ts)} === {','.join(self.remote_ts)}{via}{problem}"
        )


StateObject = (
    Link | Address | Route | Rule | IpSet | Chain | Jump | XfrmPolicy | Sysctl | VpnConnection
)

#: Order in which kinds are created: each only depends on kinds before it (addresses need the
#: link, sysctls under conf/<dev> need the device, rules matching an ipset need the set, routes
#: into the WireGuard device need the tunnel). Skip-SNAT comes before the tunnel: a flow that
#: starts while it is missing is MASQUERADEd and conntrack keeps that mapping for its life.
#: Deletion runs in the reverse order.
KIND_ORDER: tuple[type[Any], ...] = (
    Link,
    Address,
    Sysctl,
    IpSet,
    Chain,
    Jump,
    VpnConnection,
    Route,
    Rule,
    XfrmPolicy,
)


@dataclass(frozen=True)
class NodeState:
    """All of one node's L3 objects. Field order follows :data:`KIND_ORDER`."""

    links: frozenset[Link] = field(default_factory=frozenset)
    addresses: frozenset[Address] = field(default_factory=frozenset)
    sysctls: frozenset[Sysctl] = field(default_factory=frozenset)
    ipsets: frozenset[IpSet] = field(default_factory=frozenset)
    chains: frozenset[Chain] = field(default_factory=frozenset)
    jumps: frozenset[Jump] = field(default_factory=frozenset)
    vpn_connections: frozenset[VpnConnection] = field(default_factory=frozenset)
    routes: frozenset[Route] = field(default_factory=frozenset)
    rules: frozenset[Rule] = field(default_factory=frozenset)
    xfrm_policies: frozenset[XfrmPolicy] = field(default_factory=frozenset)

    @classmethod
    def of(cls, objects: Iterable[StateObject]) -> NodeState:
        """Sort loose objects into their fields."""
        buckets: dict[str, set[Any]] = {f.name: set() for f in fields(cls)}
        for obj in objects:
            buckets[_FIELD_OF[type(obj)]].add(obj)
        return cls(**{name: frozenset(objs) for name, objs in buckets.items()})

    def objects(self) -> tuple[StateObject, ...]:
        """Every object, in creation order, each kind sorted."""
        out: list[StateObject] = []
        for f in fields(self):
            out.extend(sorted(getattr(self, f.name), key=_sort_key))
        return tuple(out)

    def of_kind(self, kind: type[Any]) -> frozenset[Any]:
        value: frozenset[Any] = getattr(self, _FIELD_OF[kind])
        return value

    def merge(self, other: NodeState) -> NodeState:
        """Both states' objects together (e.g. actual netlink state + actual iptables state)."""
        return NodeState(
            **{f.name: getattr(self, f.name) | getattr(other, f.name) for f in fields(self)}
        )

    def only(self, *kinds: type[Any]) -> NodeState:
        """This state restricted to some kinds (what one applier reads and writes)."""
        return NodeState.of(o for o in self.objects() if type(o) in kinds)

    def describe(self) -> tuple[str, ...]:
        return tuple(o.describe() for o in self.objects())


_FIELD_OF: dict[type[Any], str] = {
    Link: "links",
    Address: "addresses",
    Sysctl: "sysctls",
    IpSet: "ipsets",
    Chain: "chains",
    Jump: "jumps",
    Route: "routes",
    Rule: "rules",
    XfrmPolicy: "xfrm_policies",
    VpnConnection: "vpn_connections",
}


def _sort_key(obj: StateObject) -> str:
    # Fields mix None and str, so dataclass ordering would raise; the description is total.
    return obj.describe()
