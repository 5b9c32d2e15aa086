"""Desired state as data: each scenario spells out the objects the node must have."""

from __future__ import annotations

import dataclasses

import pytest

from ravenproxy.l3.desired import desired_state, overlay_address
from ravenproxy.l3.errors import DesiredStateError
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import (
    Address,
    Chain,
    IpSet,
    Jump,
    Link,
    NodeState,
    Route,
    Rule,
    Sysctl,
    VpnConnection,
    XfrmPolicy,
)
from ravenproxy.model.objects import NodeInfo, frozen_map
from ravenproxy.model.snapshot import Model

from .models import cloud_and_edge, gateway, hub_and_two_nated_edges, node

S = L3Settings()
JUMP_SPEC = ("-m", "comment", "--comment", "ravenproxy", "-j")
MARK = ("-m", "set", "--match-set", "ravenproxy-remote-v4", "dst", "-j", "MARK", "--set-xmark")
RP_CNI = Sysctl("net/ipv4/conf/flannel.1/rp_filter", "2")
RP_RAVEN0 = Sysctl("net/ipv4/conf/raven0/rp_filter", "2")


def skip_snat(*pairs: tuple[str, str]) -> tuple[Chain, Jump]:
    rules = tuple(("-s", s, "-d", d, "-j", "ACCEPT") for s, d in pairs)
    return (
        Chain(4, "nat", "RAVEN-POSTROUTING", rules),
        Jump(4, "nat", "POSTROUTING", "RAVEN-POSTROUTING", (*JUMP_SPEC, "RAVEN-POSTROUTING")),
    )


def marking(*subnets: str) -> list[object]:
    rule = (*MARK, "0x40/0x40")
    return [
        IpSet("ravenproxy-remote-v4", 4, tuple(subnets)),
        Chain(4, "mangle", "RAVEN-PREROUTING", (rule,)),
        Chain(4, "mangle", "RAVEN-OUTPUT", (rule,)),
        Jump(4, "mangle", "PREROUTING", "RAVEN-PREROUTING", (*JUMP_SPEC, "RAVEN-PREROUTING")),
        Jump(4, "mangle", "OUTPUT", "RAVEN-OUTPUT", (*JUMP_SPEC, "RAVEN-OUTPUT")),
        Rule(4, 100, 0x40, 0x40, 9027),
    ]


def test_overlay_address_keeps_low_24_bits():
    assert overlay_address("192.168.1.11") == "240.168.1.11"
    with pytest.raises(DesiredStateError):
        overlay_address("fd00::1")


def test_cloud_gateway_node():
    got = desired_state(cloud_and_edge(), "cloud-gw", S)
    assert got == NodeState.of(
        [
            Link("raven0", 1, "10.0.0.1", None, 4478, 1450),
            Address("raven0", "240.0.0.1/8"),
            RP_CNI,
            RP_RAVEN0,
            *skip_snat(("10.16.0.0/23", "10.16.10.0/23"), ("10.16.10.0/23", "10.16.0.0/23")),
            VpnConnection(
                name="raven-gw-cloud-gw-edge",
                kind="ipsec",
                peer_gateway="gw-edge",
                local_addr="10.0.0.1",
                remote_addr=None,  # under NAT: it dials us
                remote_port=4500,
                local_ts=("10.16.0.0/23",),
                remote_ts=("10.16.10.0/23",),
                initiator=False,
                local_gateway="gw-cloud",
            ),
        ]
    )


def test_edge_gateway_under_nat_initiates_to_public_address():
    got = desired_state(cloud_and_edge(), "edge-gw", S)
    (conn,) = got.vpn_connections
    assert conn.initiator
    assert (conn.remote_addr, conn.remote_port) == ("1.2.3.4", 4500)
    assert (conn.local_ts, conn.remote_ts) == (("10.16.10.0/23",), ("10.16.0.0/23",))
    assert not got.routes and not got.rules  # strongSwan routes on the gateway itself


def test_non_gateway_node_gets_vxlan_and_policy_routing():
    got = desired_state(cloud_and_edge(), "edge-2", S)
    assert got == NodeState.of(
        [
            Link("raven0", 1, "192.168.1.11", "192.168.1.10", 4478, 1450),
            Address("raven0", "240.168.1.11/8"),
            RP_CNI,
            RP_RAVEN0,
            *skip_snat(("10.16.0.0/23", "10.16.10.0/23"), ("10.16.10.0/23", "10.16.0.0/23")),
            *marking("10.16.0.0/23"),  # type: ignore[list-item]
            Route("10.16.0.0/23", 9027, "raven0", "240.168.1.10", None, True),
        ]
    )
    assert not got.vpn_connections


def test_mtu_follows_underlay():
    got = desired_state(cloud_and_edge(), "edge-2", L3Settings(underlay_mtu=9000))
    (link,) = got.links
    assert link.mtu == 8950


def test_node_in_no_gateway_wants_nothing():
    assert desired_state(cloud_and_edge(), "solo", S) == NodeState()


def test_unknown_node_is_an_error():
    with pytest.raises(DesiredStateError, match="ghost"):
        desired_state(cloud_and_edge(), "ghost", S)


def test_no_remote_domain_wants_nothing():
    m = Model.build(
        nodes=[node("a", "10.0.0.1", "gw", "10.16.0.0/24")], gateways=[gateway("gw", "a")]
    )
    assert desired_state(m, "a", S) == NodeState()


# --- central gateway and relay ------------------------------------------------------------


def test_central_gateway_relays_and_skips_snat_remote_to_remote():
    got = desired_state(hub_and_two_nated_edges(), "cloud-gw", S)
    (chain,) = got.chains
    pairs = {(r[1], r[3]) for r in chain.rules}
    assert pairs == {
        ("10.16.0.0/23", "10.16.10.0/23"),
        ("10.16.10.0/23", "10.16.0.0/23"),
        ("10.16.0.0/23", "10.16.20.0/24"),
        ("10.16.20.0/24", "10.16.0.0/23"),
        # remote x remote, both ways
        ("10.16.10.0/23", "10.16.20.0/24"),
        ("10.16.20.0/24", "10.16.10.0/23"),
    }
    conns = {c.peer_gateway: c for c in got.vpn_connections}
    assert conns["gw-a"].local_ts == ("10.16.0.0/23", "10.16.20.0/24")
    assert conns["gw-a"].remote_ts == ("10.16.10.0/23",)
    assert conns["gw-a"].relayed == ("gw-b",)
    assert conns["gw-b"].local_ts == ("10.16.0.0/23", "10.16.10.0/23")
    assert conns["gw-b"].remote_ts == ("10.16.20.0/24",)
    assert not any(c.initiator for c in conns.values())


def test_member_of_central_domain_has_no_remote_to_remote_rules():
    got = desired_state(hub_and_two_nated_edges(), "cloud-2", S)
    (chain,) = [c for c in got.chains if c.table == "nat"]
    pairs = {(r[1], r[3]) for r in chain.rules}
    assert ("10.16.10.0/23", "10.16.20.0/24") not in pairs
    (route_set,) = got.ipsets
    assert route_set.members == ("10.16.10.0/23", "10.16.20.0/24")


def test_nated_edge_reaches_the_other_nated_edge_through_the_relay():
    got = desired_state(hub_and_two_nated_edges(), "a-gw", S)
    (conn,) = got.vpn_connections
    assert conn.peer_gateway == "gw-cloud"
    assert conn.initiator and conn.remote_addr == "1.2.3.4"
    assert conn.remote_ts == ("10.16.0.0/23", "10.16.20.0/24")
    assert conn.relayed == ("gw-b",)


def test_single_node_gateway_keeps_its_skip_snat_rules():
    got = desired_state(hub_and_two_nated_edges(), "b-gw", S)
    assert got.of_kind(Chain) == {
        skip_snat(
            ("10.16.0.0/23", "10.16.20.0/24"),
            ("10.16.10.0/23", "10.16.20.0/24"),
            ("10.16.20.0/24", "10.16.0.0/23"),
            ("10.16.20.0/24", "10.16.10.0/23"),
        )[0]
    }
    assert len(got.jumps) == 1


def test_two_nated_edges_without_a_central_cannot_tunnel_but_still_skip_snat():
    m = Model.build(
        nodes=[
            node("a-gw", "192.168.1.10", "gw-a", "10.16.10.0/24"),
            node("a-2", "192.168.1.11", "gw-a", "10.16.11.0/24"),
            node("b-gw", "192.168.2.10", "gw-b", "10.16.20.0/24"),
        ],
        gateways=[gateway("gw-a", "a-gw", under_nat=True), gateway("gw-b", "b-gw", under_nat=True)],
    )
    gw = desired_state(m, "a-gw", S)
    assert not gw.vpn_connections
    assert len(gw.chains) == 1
    member = desired_state(m, "a-2", S)
    assert not member.routes and not member.rules and not member.ipsets


def test_two_public_gateways_one_fixed_side_initiates():
    m = Model.build(
        nodes=[
            node("x-gw", "10.1.0.1", "gw-x", "10.16.0.0/24"),
            node("y-gw", "10.2.0.1", "gw-y", "10.17.0.0/24"),
        ],
        gateways=[gateway("gw-x", "x-gw"), gateway("gw-y", "y-gw")],
    )
    (x,) = desired_state(m, "x-gw", S).vpn_connections
    (y,) = desired_state(m, "y-gw", S).vpn_connections
    assert (x.initiator, y.initiator) == (True, False)
    assert x.remote_addr == "10.2.0.1"  # no publicIP, not under NAT: the private address


# --- subnets ------------------------------------------------------------------------------


def test_status_subnets_win_over_pod_cidrs():
    m = hub_and_two_nated_edges()
    gw_b = dataclasses.replace(
        m.gateways["gw-b"], status_nodes=(NodeInfo("b-gw", "192.168.2.10", ("10.18.0.0/16",)),)
    )
    m2 = Model.build(
        m.nodes.values(), [*(g for g in m.gateways.values() if g.name != "gw-b"), gw_b]
    )
    got = desired_state(m2, "a-gw", S)
    (conn,) = got.vpn_connections
    assert conn.remote_ts == ("10.16.0.0/23", "10.18.0.0/16")


def test_fixed_skip_nat_cidrs_replace_computed_pairs():
    got = desired_state(cloud_and_edge(), "edge-2", L3Settings(skip_nat_cidrs=("10.16.0.0/12",)))
    (chain,) = [c for c in got.chains if c.table == "nat"]
    assert chain.rules == (("-s", "10.16.0.0/12", "-d", "10.16.0.0/12", "-j", "ACCEPT"),)


def test_ipv6_subnets_get_ip6tables_rules():
    m = Model.build(
        nodes=[
            node("c", "10.0.0.1", "gw-c", "10.16.0.0/24", "fd00:16::/64"),
            node("e", "192.168.1.10", "gw-e", "10.16.10.0/24", "fd00:16:10::/64"),
        ],
        gateways=[
            gateway("gw-c", "c", public_ip="1.2.3.4", exposed=True),
            gateway("gw-e", "e", under_nat=True),
        ],
    )
    got = desired_state(m, "c", S)
    v6 = [c for c in got.chains if c.family == 6]
    assert [c.rules for c in v6] == [
        (
            ("-s", "fd00:16::/64", "-d", "fd00:16:10::/64", "-j", "ACCEPT"),
            ("-s", "fd00:16:10::/64", "-d", "fd00:16::/64", "-j", "ACCEPT"),
        )
    ]
    assert {j.family for j in got.jumps} == {4, 6}
    (conn,) = got.vpn_connections
    assert conn.remote_ts == ("10.16.10.0/24", "fd00:16:10::/64")


# --- IPVS xfrm, WireGuard, rp_filter ------------------------------------------------------


def test_service_cidr_adds_inbound_and_forward_policies_on_ipsec_gateway():
    s = L3Settings(service_cidr="10.96.0.0/12")
    got = desired_state(cloud_and_edge(), "cloud-gw", s)
    assert got.xfrm_policies == {
        XfrmPolicy("10.96.0.0/12", "10.16.0.0/23", "in", tmpl_dst="10.0.0.1"),
        XfrmPolicy("10.96.0.0/12", "10.16.0.0/23", "fwd", tmpl_dst="10.0.0.1"),
    }
    assert all(p.optional and p.tmpl_src is None for p in got.xfrm_policies)
    assert not desired_state(cloud_and_edge(), "cloud-2", s).xfrm_policies
    wg = dataclasses.replace(s, vpn_driver="wireguard")
    assert not desired_state(cloud_and_edge(), "cloud-gw", wg).xfrm_policies


def test_wireguard_gateway_routes_remote_subnets_into_its_device():
    m = cloud_and_edge()
    keyed = dataclasses.replace(
        m.gateways["gw-edge"],
        active_endpoints=(
            dataclasses.replace(
                m.gateways["gw-edge"].active_endpoints[0],
                config=frozen_map({"publicKey": "EDGEKEY="}),
            ),
        ),
    )
    m2 = Model.build(m.nodes.values(), [m.gateways["gw-cloud"], keyed])
    s = L3Settings(vpn_driver="wireguard")
    got = desired_state(m2, "cloud-gw", s)
    (conn,) = got.vpn_connections
    assert conn.kind == "wireguard" and conn.remote_public_key == "EDGEKEY="
    assert got.routes == {Route("10.16.10.0/23", 9027, "raven-wg0")}
    assert Rule(4, 100, 0x40, 0x40, 9027) in got.rules
    # The edge has not published a key: no tunnel and no routes into nowhere.
    bare = desired_state(m, "cloud-gw", s)
    assert not bare.vpn_connections and not bare.routes


def test_rp_filter_only_on_raven0_and_the_cni_interface():
    for name in ("cloud-gw", "cloud-2", "edge-gw", "edge-2"):
        got = desired_state(cloud_and_edge(), name, L3Settings(cni_interface="cni0"))
        assert {s.path for s in got.sysctls} == {
            "net/ipv4/conf/raven0/rp_filter",
            "net/ipv4/conf/cni0/rp_filter",
        }
        assert {s.value for s in got.sysctls} == {"2"}


def test_ipv6_underlay_is_refused_for_raven0():
    m = Model.build(
        nodes=[
            node("c", "10.0.0.1", "gw-c", "10.16.0.0/24"),
            node("e", "fd00::10", "gw-e", "10.16.10.0/24"),
            node("e2", "fd00::11", "gw-e", "10.16.11.0/24"),
        ],
        gateways=[gateway("gw-c", "c", public_ip="1.2.3.4"), gateway("gw-e", "e", under_nat=True)],
    )
    with pytest.raises(DesiredStateError, match="IPv4"):
        desired_state(m, "e2", S)


# --- immutability -------------------------------------------------------------------------


def test_new_state_from_changed_model_leaves_the_previous_one_alone():
    m1 = cloud_and_edge()
    before = desired_state(m1, "edge-2", S)
    snapshot = desired_state(m1, "edge-2", S)
    m2 = Model.build(
        [*m1.nodes.values(), node("cloud-3", "10.0.0.3", "gw-cloud", "10.16.7.0/24")],
        m1.gateways.values(),
    )
    after = desired_state(m2, "edge-2", S)
    assert after != before
    assert before == snapshot
    assert hash(before) == hash(snapshot)
    assert {r.dst for r in before.routes} == {"10.16.0.0/23"}
    assert {r.dst for r in after.routes} == {"10.16.0.0/23", "10.16.7.0/24"}


def test_state_cannot_be_mutated():
    got = desired_state(cloud_and_edge(), "edge-2", S)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.routes = frozenset()  # type: ignore[misc]
    assert isinstance(got.routes, frozenset)
    with pytest.raises(AttributeError):
        got.routes.add(Route("10.0.0.0/8", 1, "x"))  # type: ignore[attr-defined]
    (chain,) = [c for c in got.chains if c.name == "RAVEN-POSTROUTING"]
    assert isinstance(chain.rules, tuple) and all(isinstance(r, tuple) for r in chain.rules)


def test_wireguard_routes_only_what_a_keyed_peer_carries():
    m = Model.build(
        nodes=[
            node("c", "10.0.0.1", "gw-c", "10.16.0.0/24"),
            node("x", "10.1.0.1", "gw-x", "10.17.0.0/24"),
            node("y", "10.2.0.1", "gw-y", "10.18.0.0/24"),
        ],
        gateways=[
            gateway("gw-c", "c"),
            gateway("gw-x", "x", public_key="XKEY="),
            gateway("gw-y", "y"),  # no key published yet
        ],
    )
    got = desired_state(m, "c", L3Settings(vpn_driver="wireguard"))
    assert {c.peer_gateway for c in got.vpn_connections} == {"gw-x"}
    assert {r.dst for r in got.routes} == {"10.17.0.0/24"}
