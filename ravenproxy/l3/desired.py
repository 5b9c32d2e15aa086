"""Model → the desired L3 state of one node, as data (no I/O).

Non-gateway node: vxlan ``raven0`` to its gateway node, marked traffic for remote subnets goes
through a separate routing table into ``raven0``. Gateway node: one VPN connection per peer
gateway (relayed through the central gateway when both sides are under NAT). Every node of a
domain: skip-SNAT rules ahead of the CNI's MASQUERADE, rp_filter=2 where asymmetric paths are
expected. Gateway with IPsec and a service CIDR: xfrm policies for IPVS-rewritten replies.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable

from ravenproxy.l3.cidrs import collapse, family_of, of_family, subtract
from ravenproxy.l3.errors import DesiredStateError
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import (
    IPSET_PREFIX,
    MARK_OUTPUT_CHAIN,
    MARK_PREROUTING_CHAIN,
    OWNED_CHAINS,
    SKIP_SNAT_CHAIN,
    VXLAN_DEVICE,
    Address,
    Chain,
    IpSet,
    Jump,
    Link,
    NodeState,
    Route,
    Rule,
    StateObject,
    Sysctl,
    VpnConnection,
    XfrmDir,
    XfrmPolicy,
)
from ravenproxy.l3.topology import Domain, PathKind, Topology, topology
from ravenproxy.log import kv
from ravenproxy.model.snapshot import Model

log = logging.getLogger(__name__)

#: raven0 addresses live in 240.0.0.0/8 (reserved, never routed on the internet or by a CNI);
#: the low 24 bits are the node's InternalIP's, as Raven does.
OVERLAY_PREFIX = 240
JUMP_COMMENT = "ravenproxy"


def overlay_address(internal_ip: str) -> str:
    """``10.0.3.7`` → ``240.0.3.7``: the node's address on raven0."""
    try:
        ip = ipaddress.ip_address(internal_ip)
    except ValueError:
        raise DesiredStateError(f"{internal_ip!r} is not an IP address") from None
    if ip.version != 4:
        raise DesiredStateError(
            f"raven0 needs an IPv4 InternalIP to derive its overlay address, got {internal_ip}"
        )
    return str(ipaddress.IPv4Address((OVERLAY_PREFIX << 24) | (int(ip) & 0xFFFFFF)))


def remote_set_name(family: int) -> str:
    return f"{IPSET_PREFIX}remote-v{family}"


def jump_to(family: int, table: str, target: str) -> Jump:
    parent = OWNED_CHAINS[(table, target)]
    spec = ("-m", "comment", "--comment", JUMP_COMMENT, "-j", target)
    return Jump(family=family, table=table, chain=parent, target=target, spec=spec, position=1)


def desired_state(model: Model, node_name: str, settings: L3Settings) -> NodeState:
    """Everything ravenproxy should have installed on ``node_name``.

    A node in no gateway, or a gateway with no remote domain to reach, wants nothing: the
    planner then removes whatever we had installed before.
    """
    node = model.node(node_name)
    if node is None:
        raise DesiredStateError(f"node {node_name!r} is not in the model")
    if node.gateway is None or node.gateway not in model.gateways:
        return NodeState()
    topo = topology(model, settings.vpn_port)
    local = topo.domains[node.gateway]
    remotes = topo.remotes(local.gateway)
    if not remotes:
        return NodeState()
    is_gateway_node = local.gateway_node == node_name
    objects: list[StateObject] = []
    objects.extend(_skip_snat(topo, local, remotes, is_gateway_node, settings))
    objects.append(Sysctl(f"net/ipv4/conf/{settings.cni_interface}/rp_filter", "2"))
    if not local.has_tunnel:
        return NodeState.of(objects)

    reachable = [r for r in remotes if topo.path(local.gateway, r).kind is not PathKind.UNREACHABLE]
    routed = subtract((s for r in reachable for s in topo.domains[r].subnets), local.subnets)
    node_ip = node.internal_ip
    if node_ip is None:
        raise DesiredStateError(f"node {node_name!r} has no InternalIP for raven0")
    objects.extend(_vxlan(node_ip, local, is_gateway_node, settings))

    if not is_gateway_node:
        assert local.private_ip is not None  # has_tunnel
        via = overlay_address(local.private_ip)
        # The overlay next hop is IPv4, so only IPv4 subnets can be routed over raven0.
        v4 = of_family(routed, 4)
        routes = [Route(d, settings.route_table, VXLAN_DEVICE, via, None, True) for d in v4]
        objects.extend(_policy_routing(routes, v4, settings))
        return NodeState.of(objects)

    connections = _vpn_connections(topo, local, reachable, settings)
    objects.extend(connections)
    if settings.vpn_driver == "wireguard" and connections:
        # Only what a peer accepts: a subnet whose peer has no key yet would be dropped by
        # wireguard ("no peer") instead of taking the main table's path.
        carried = collapse(c for conn in connections for c in conn.remote_ts)
        dev = settings.wireguard_interface
        routes = [Route(d, settings.route_table, dev) for d in carried]
        objects.extend(_policy_routing(routes, carried, settings))
    if settings.vpn_driver == "strongswan" and connections and settings.service_cidr:
        objects.extend(_ipvs_xfrm(settings.service_cidr, local))
    return NodeState.of(objects)


def _vxlan(node_ip: str, local: Domain, is_gateway_node: bool, s: L3Settings) -> list[StateObject]:
    # The gateway end has no fixed remote: it learns each member from the packets it receives
    # and answers ARP for its overlay address to that member.
    remote = None if is_gateway_node else local.private_ip
    return [
        Link(VXLAN_DEVICE, s.vxlan_vni, node_ip, remote, s.vxlan_port, s.vxlan_mtu),
        Address(VXLAN_DEVICE, f"{overlay_address(node_ip)}/8"),
        # Replies from remote domains reach a member through the CNI while its own packets
        # for them left through raven0 (and the reverse on the gateway): strict rp_filter
        # would drop them.
        Sysctl(f"net/ipv4/conf/{VXLAN_DEVICE}/rp_filter", "2"),
    ]


def _policy_routing(
    routes: list[Route], subnets: Iterable[str], s: L3Settings
) -> list[StateObject]:
    """Mark traffic for remote subnets, look marked traffic up in our table."""
    out: list[StateObject] = list(routes)
    by_family = {f: of_family(tuple(subnets), f) for f in (4, 6)}
    mark = f"{s.fwmark:#x}/{s.fwmark:#x}"
    for family, members in by_family.items():
        if not members:
            continue
        name = remote_set_name(family)
        out.append(IpSet(name, family, members))
        rule = ("-m", "set", "--match-set", name, "dst", "-j", "MARK", "--set-xmark", mark)
        for chain in (MARK_PREROUTING_CHAIN, MARK_OUTPUT_CHAIN):
            out.append(Chain(family, "mangle", chain, (rule,)))
            out.append(jump_to(family, "mangle", chain))
        out.append(Rule(family, s.rule_priority, s.fwmark, s.fwmark, s.route_table))
    return out


def _skip_snat(
    topo: Topology, local: Domain, remotes: tuple[str, ...], is_gateway_node: bool, s: L3Settings
) -> list[StateObject]:
    pairs: set[tuple[str, str]] = set()
    if s.skip_nat_cidrs:
        fixed = collapse(s.skip_nat_cidrs)
        pairs.update((a, b) for a in fixed for b in fixed if family_of(a) == family_of(b))
    else:
        remote_all = subtract((x for r in remotes for x in topo.domains[r].subnets), local.subnets)
        pairs.update(_both_ways(local.subnets, remote_all))
        if is_gateway_node and topo.central == local.gateway:
            # Traffic relayed between two NATed domains passes through this node's
            # POSTROUTING too, and must keep its pod source address.
            for r in remotes:
                own = topo.domains[r].subnets
                others = subtract(_subnets_of(topo, (o for o in remotes if o != r)), own)
                pairs.update(_both_ways(own, others))
    out: list[StateObject] = []
    for family in (4, 6):
        rules = tuple(
            ("-s", a, "-d", b, "-j", "ACCEPT")
            for a, b in sorted(pairs, key=_pair_key)
            if family_of(a) == family
        )
        if rules:
            out.append(Chain(family, "nat", SKIP_SNAT_CHAIN, rules))
            out.append(jump_to(family, "nat", SKIP_SNAT_CHAIN))
    return out


def _subnets_of(topo: Topology, gateways: Iterable[str]) -> tuple[str, ...]:
    return collapse(c for g in gateways for c in topo.domains[g].subnets)


def _both_ways(xs: Iterable[str], ys: Iterable[str]) -> set[tuple[str, str]]:
    ys = tuple(ys)
    out: set[tuple[str, str]] = set()
    for x in xs:
        for y in ys:
            if family_of(x) == family_of(y):
                out.add((x, y))
                out.add((y, x))
    return out


def _pair_key(pair: tuple[str, str]) -> tuple[int, int, int, int, int]:
    a, b = (ipaddress.ip_network(p) for p in pair)
    return (a.version, int(a.network_address), a.prefixlen, int(b.network_address), b.prefixlen)


def _vpn_connections(
    topo: Topology, local: Domain, reachable: list[str], s: L3Settings
) -> list[VpnConnection]:
    assert local.private_ip is not None
    # Group remote domains by the peer that carries their traffic: itself, or the relay.
    carried: dict[str, list[str]] = {}
    for r in reachable:
        via = topo.path(local.gateway, r).peer
        assert via is not None
        carried.setdefault(via, []).append(r)
    out: list[VpnConnection] = []
    for peer_name in sorted(carried):
        peer = topo.domains[peer_name]
        # On the central gateway, the peer's connection also carries the domains we relay
        # to it, as our side of its traffic selectors.
        relayed_here = [
            x
            for x in topo.remotes(local.gateway)
            if x != peer_name and topo.path(peer_name, x).via == local.gateway
        ]
        local_ts = collapse(
            [*local.subnets, *(c for x in relayed_here for c in topo.domains[x].subnets)]
        )
        remote_ts = subtract(
            (c for r in carried[peer_name] for c in topo.domains[r].subnets), local_ts
        )
        if not remote_ts:
            continue
        if local.under_nat != peer.under_nat:
            initiator = local.under_nat
        else:
            # Neither is under NAT (both-NAT pairs are relayed): one fixed side dials, so the
            # two ends do not race to create duplicate SAs.
            initiator = local.gateway < peer_name
        key = ""
        if s.vpn_driver == "wireguard":
            key = peer.public_key
            if not key:
                log.warning(
                    "peer gateway publishes no WireGuard key yet; no tunnel to it",
                    extra=kv(local=local.gateway, peer=peer_name),
                )
                continue
        relayed = sorted({*carried[peer_name], *relayed_here} - {peer_name})
        out.append(
            VpnConnection(
                name=f"raven-{local.gateway}-{peer_name}",
                kind="wireguard" if s.vpn_driver == "wireguard" else "ipsec",
                peer_gateway=peer_name,
                local_addr=local.private_ip,
                remote_addr=None if peer.under_nat else peer.public_addr,
                remote_port=peer.port,
                local_ts=local_ts,
                remote_ts=remote_ts,
                initiator=initiator,
                relayed=tuple(relayed),
                remote_public_key=key,
                local_gateway=local.gateway,
            )
        )
    return out


_INBOUND: tuple[XfrmDir, ...] = ("in", "fwd")


def _ipvs_xfrm(service_cidr: str, local: Domain) -> list[XfrmPolicy]:
    """IPVS rewrites a reply's source back to the ClusterIP before the xfrm input check, so
    the check looks for service CIDR → local pods and, finding no policy, drops the packet
    (XfrmInNoPols). One optional policy per direction lets those replies in; its template has
    no source so it matches the SA from whichever peer carried the reply."""
    assert local.private_ip is not None
    family = family_of(service_cidr)
    out: list[XfrmPolicy] = []
    for dst in of_family(local.subnets, family):
        for direction in _INBOUND:
            out.append(
                XfrmPolicy(src=service_cidr, dst=dst, dir=direction, tmpl_dst=local.private_ip)
            )
    return out
