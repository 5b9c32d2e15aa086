"""Netlink adapter and the whole driver against the real kernel, inside a private netns."""

from __future__ import annotations

import dataclasses
import io

import pytest

from ravenproxy.l3 import apply_netlink, driver
from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.plan import cleanup_plan, plan
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import (
    Address,
    Link,
    NodeState,
    Route,
    Rule,
    Sysctl,
    XfrmPolicy,
)
from ravenproxy.model.snapshot import Model

from ...unit.l3.models import cloud_and_edge, node
from .conftest import add_bridge, sh

pytestmark = pytest.mark.root

S = L3Settings()
NETLINK = (Link, Address, Route, Rule, Sysctl, XfrmPolicy)


def member_netns_setup(netns: str) -> None:
    # edge-2's underlay address and a CNI device, so every sysctl key exists.
    add_bridge(netns, "eth0", "192.168.1.11/24")
    add_bridge(netns, "flannel.1", "10.16.11.0/32")


async def read(netns: str, desired: NodeState) -> NodeState:
    return await apply_netlink.read_actual(S.route_table, [s.path for s in desired.sysctls], netns)


async def test_member_node_apply_read_back_and_repair(netns: str):
    member_netns_setup(netns)
    desired = desired_state(cloud_and_edge(), "edge-2", S).only(*NETLINK)

    await apply_netlink.apply(plan(await read(netns, desired), desired), netns)
    actual = await read(netns, desired)
    assert actual == desired
    assert plan(actual, desired) == ()
    assert "fwmark 0x40/0x40 lookup 9027" in sh("ip", "rule", netns=netns)
    assert "10.16.0.0/23 via 240.168.1.10 dev raven0" in sh(
        "ip", "route", "show", "table", "9027", netns=netns
    )

    # A route and a rule removed by hand: the plan re-adds exactly those.
    sh("ip", "route", "del", "10.16.0.0/23", "table", "9027", netns=netns)
    sh("ip", "rule", "del", "fwmark", "0x40/0x40", "lookup", "9027", netns=netns)
    ops = plan(await read(netns, desired), desired)
    assert [(op.action, type(op.obj)) for op in ops] == [("add", Route), ("add", Rule)]
    await apply_netlink.apply(ops, netns)
    assert await read(netns, desired) == desired

    # rp_filter reset by hand on raven0 comes back; eth0's is never touched.
    sh("sysctl", "-w", "net.ipv4.conf.raven0.rp_filter=1", netns=netns)
    sh("sysctl", "-w", "net.ipv4.conf.eth0.rp_filter=1", netns=netns)
    ops = plan(await read(netns, desired), desired)
    assert [(op.action, op.obj) for op in ops] == [
        ("replace", Sysctl("net/ipv4/conf/raven0/rp_filter", "2"))
    ]
    await apply_netlink.apply(ops, netns)
    assert sh("sysctl", "-n", "net.ipv4.conf.eth0.rp_filter", netns=netns).strip() == "1"

    # Cleanup: link, address, route and rule go; sysctls are ours to set, not to remove.
    await apply_netlink.apply(cleanup_plan(await read(netns, desired)), netns)
    assert await read(netns, NodeState()) == NodeState()
    assert "raven0" not in sh("ip", "link", netns=netns)
    assert "eth0" in sh("ip", "link", netns=netns)


async def test_gateway_moves_remote_changes_in_place(netns: str):
    member_netns_setup(netns)
    model = cloud_and_edge()
    before = desired_state(model, "edge-2", S).only(*NETLINK)
    await apply_netlink.apply(plan(NodeState(), before), netns)
    index_before = sh("cat", "/sys/class/net/raven0/ifindex", netns=netns)

    # The edge gateway's tunnel endpoint moves to a third node.
    gw = model.gateways["gw-edge"]
    ep = dataclasses.replace(gw.active_endpoints[0], node_name="edge-3")
    moved = Model.build(
        [*model.nodes.values(), node("edge-3", "192.168.1.12", "gw-edge", "10.16.12.0/24")],
        [
            model.gateways["gw-cloud"],
            dataclasses.replace(gw, endpoints=(ep,), active_endpoints=(ep,)),
        ],
    )
    after = desired_state(moved, "edge-2", S).only(*NETLINK)
    ops = plan(await read(netns, after), after)
    assert {(op.action, type(op.obj)) for op in ops} == {("replace", Link), ("replace", Route)}
    await apply_netlink.apply(ops, netns)
    assert await read(netns, after) == after
    assert sh("cat", "/sys/class/net/raven0/ifindex", netns=netns) == index_before


async def test_ipvs_xfrm_policies_on_gateway(netns: str):
    add_bridge(netns, "eth0", "10.0.0.1/24")
    settings = L3Settings(service_cidr="10.96.0.0/12")
    desired = desired_state(cloud_and_edge(), "cloud-gw", settings).only(XfrmPolicy)
    assert len(desired.xfrm_policies) == 2
    # strongSwan's own policy must survive everything we do.
    sh(
        "ip", "xfrm", "policy", "add", "src", "10.16.0.0/23", "dst", "10.16.10.0/23",
        "dir", "out", "priority", "1757392", "tmpl", "src", "10.0.0.1", "dst", "1.2.3.4",
        "proto", "esp", "mode", "tunnel", netns=netns,
    )  # fmt: skip

    await apply_netlink.apply(plan(await read(netns, desired), desired), netns)
    assert await read(netns, desired) == desired
    sh("ip", "xfrm", "policy", "delete", "src", "10.96.0.0/12", "dst", "10.16.0.0/23",
       "dir", "in", netns=netns)  # fmt: skip
    ops = plan(await read(netns, desired), desired)
    assert [(op.action, op.obj.dir) for op in ops] == [("add", "in")]  # type: ignore[union-attr]
    await apply_netlink.apply(ops, netns)
    assert await read(netns, desired) == desired

    await apply_netlink.apply(cleanup_plan(await read(netns, desired)), netns)
    assert await read(netns, NodeState()) == NodeState()
    assert "priority 1757392" in sh("ip", "xfrm", "policy", netns=netns)


async def test_driver_reconciles_idempotently_and_cleans_up(netns: str, tmp_path):
    member_netns_setup(netns)
    model = cloud_and_edge()
    desired = desired_state(model, "edge-2", S)

    first = await driver.reconcile_once(model, "edge-2", S, netns)
    assert {op.obj for op in first.applied} == set(desired.objects())
    assert first.skipped == ()
    # A restart: the next pass reads the kernel and finds nothing to do.
    again = await driver.reconcile_once(model, "edge-2", S, netns)
    assert again.applied == () and again.skipped == ()
    actual = await driver.read_actual(S, [s.path for s in desired.sysctls], netns)
    assert actual == desired

    done = await driver.cleanup(S, netns)
    assert {op.obj for op in done.applied} == set(desired.objects()) - desired.sysctls
    assert await driver.read_actual(S, (), netns) == NodeState()


async def test_driver_recreates_raven0_when_this_node_becomes_the_gateway(netns: str):
    member_netns_setup(netns)
    model = cloud_and_edge()
    await driver.reconcile_once(model, "edge-2", S, netns)
    gw = model.gateways["gw-edge"]
    ep = dataclasses.replace(gw.active_endpoints[0], node_name="edge-2")
    promoted = Model.build(
        model.nodes.values(),
        [
            model.gateways["gw-cloud"],
            dataclasses.replace(gw, endpoints=(ep,), active_endpoints=(ep,)),
        ],
    )
    desired = desired_state(promoted, "edge-2", S)
    (link,) = desired.links
    assert link.remote is None  # the gateway end of the vxlan has no fixed remote

    report = await driver.reconcile_once(promoted, "edge-2", S, netns)
    assert [op.obj.kind_name for op, _ in report.skipped] == ["vpn"]
    # Recreating raven0 dropped its address; the same pass put it back.
    actual = await driver.read_actual(S, [s.path for s in desired.sysctls], netns)
    assert actual == dataclasses.replace(desired, vpn_connections=frozenset())
    assert "240.168.1.11/8" in sh("ip", "addr", "show", "raven0", netns=netns)


async def test_driver_reports_vpn_connections_it_cannot_apply(netns: str, tmp_path):
    add_bridge(netns, "eth0", "192.168.1.10/24")
    add_bridge(netns, "flannel.1", "10.16.10.0/32")
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(INVENTORY)
    out = io.StringIO()
    status = await driver.routes_command(
        "apply", str(inventory), "edge-gw", S, netns=netns, out=out
    )
    assert status == 3
    text = out.getvalue()
    assert "+ chain iptables -t nat RAVEN-POSTROUTING" in text
    assert "! not applied: vpn raven-gw-edge-gw-cloud ipsec" in text
    out = io.StringIO()
    assert (
        await driver.routes_command("plan", str(inventory), "edge-gw", S, netns=netns, out=out) == 0
    )
    # Only the VPN connection is still planned: everything else is in place.
    assert out.getvalue().splitlines()[0].startswith("+ vpn raven-gw-edge-gw-cloud")
    assert len(out.getvalue().splitlines()) == 1
    out = io.StringIO()
    assert (
        await driver.routes_command("cleanup", str(inventory), "edge-gw", S, netns=netns, out=out)
        == 0
    )
    assert "- link raven0" in out.getvalue()
    assert await driver.read_actual(S, (), netns) == NodeState()


INVENTORY = """\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {name: gw-cloud}
spec:
  exposeType: PublicIP
  endpoints:
  - {nodeName: cloud-gw, type: tunnel, port: 4500, publicIP: 1.2.3.4}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {name: gw-edge}
spec:
  endpoints:
  - {nodeName: edge-gw, type: tunnel, underNAT: true}
---
kind: Node
metadata: {name: cloud-gw, labels: {raven.openyurt.io/gateway: gw-cloud}}
spec: {podCIDRs: [10.16.0.0/24]}
status: {addresses: [{type: InternalIP, address: 10.0.0.1}]}
---
kind: Node
metadata: {name: edge-gw, labels: {raven.openyurt.io/gateway: gw-edge}}
spec: {podCIDRs: [10.16.10.0/24]}
status: {addresses: [{type: InternalIP, address: 192.168.1.10}]}
"""
