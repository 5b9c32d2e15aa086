"""iptables/ipset adapter against the real nf_tables backend, inside a private netns."""

from __future__ import annotations

import pytest

from ravenproxy.l3 import apply_iptables
from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.errors import ApplyError
from ravenproxy.l3.iptables import snat_before_jump
from ravenproxy.l3.plan import Op, cleanup_plan, plan
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import Chain, IpSet, Jump, NodeState

from ...unit.l3.models import cloud_and_edge
from .conftest import sh

pytestmark = pytest.mark.root

FLANNEL_MASQ = ("-s", "10.16.0.0/12", "!", "-d", "224.0.0.0/4", "-j", "MASQUERADE")


def wanted() -> NodeState:
    # edge-2 is a member node: it has the skip-SNAT chain, the marking chains and the ipset.
    return desired_state(cloud_and_edge(), "edge-2", L3Settings()).only(IpSet, Chain, Jump)


async def test_apply_read_back_repair_and_cleanup(netns: str):
    # A CNI was here first: its MASQUERADE sits in nat POSTROUTING before we arrive.
    sh("iptables", "-t", "nat", "-A", "POSTROUTING", *FLANNEL_MASQ, netns=netns)
    desired = wanted()

    await apply_iptables.apply(plan(await apply_iptables.read_actual(netns), desired), netns)
    actual = await apply_iptables.read_actual(netns)
    assert actual == desired
    assert plan(actual, desired) == ()
    post = sh("iptables", "-t", "nat", "-S", "POSTROUTING", netns=netns).splitlines()
    assert "RAVEN-POSTROUTING" in post[1] and "MASQUERADE" in post[2]  # post[0] is -P
    assert snat_before_jump(await apply_iptables.save(4, netns)) == ()

    # A rule removed by hand: the plan replaces that one chain, nothing else.
    sh("iptables", "-t", "nat", "-D", "RAVEN-POSTROUTING", "1", netns=netns)
    ops = plan(await apply_iptables.read_actual(netns), desired)
    assert [(op.action, type(op.obj)) for op in ops] == [("replace", Chain)]
    assert ops[0].obj.key == (4, "nat", "RAVEN-POSTROUTING")
    await apply_iptables.apply(ops, netns)
    assert await apply_iptables.read_actual(netns) == desired

    # A foreign MASQUERADE inserted in front of our jump: doctor sees it, the plan moves us.
    sh("iptables", "-t", "nat", "-I", "POSTROUTING", "1", *FLANNEL_MASQ, netns=netns)
    assert len(snat_before_jump(await apply_iptables.save(4, netns))) == 1
    ops = plan(await apply_iptables.read_actual(netns), desired)
    assert [(op.action, type(op.obj)) for op in ops] == [("replace", Jump)]
    await apply_iptables.apply(ops, netns)
    post = sh("iptables", "-t", "nat", "-S", "POSTROUTING", netns=netns).splitlines()
    assert "RAVEN-POSTROUTING" in post[1]
    assert sum("MASQUERADE" in line for line in post) == 2  # foreign rules untouched

    # An ipset member removed by hand comes back through a swap.
    sh("ipset", "del", "ravenproxy-remote-v4", "10.16.0.0/23", netns=netns)
    ops = plan(await apply_iptables.read_actual(netns), desired)
    assert [(op.action, type(op.obj)) for op in ops] == [("replace", IpSet)]
    await apply_iptables.apply(ops, netns)
    assert await apply_iptables.read_actual(netns) == desired

    # Cleanup removes exactly ours.
    await apply_iptables.apply(cleanup_plan(await apply_iptables.read_actual(netns)), netns)
    assert await apply_iptables.read_actual(netns) == NodeState()
    saved = sh("iptables-save", netns=netns)
    assert "RAVEN" not in saved and saved.count("MASQUERADE") == 2
    assert "ravenproxy" not in sh("ipset", "list", "-n", netns=netns)


async def test_ipv6_chains_round_trip(netns: str):
    desired = NodeState.of(
        [
            Chain(
                6,
                "nat",
                "RAVEN-POSTROUTING",
                (("-s", "fd00:16::/64", "-d", "fd00:16:10::/64", "-j", "ACCEPT"),),
            ),
            Jump(
                6,
                "nat",
                "POSTROUTING",
                "RAVEN-POSTROUTING",
                ("-m", "comment", "--comment", "ravenproxy", "-j", "RAVEN-POSTROUTING"),
            ),
        ]
    )
    await apply_iptables.apply(plan(NodeState(), desired), netns)
    assert await apply_iptables.read_actual(netns) == desired
    await apply_iptables.apply(cleanup_plan(desired), netns)
    assert await apply_iptables.read_actual(netns) == NodeState()


async def test_a_bad_batch_applies_nothing(netns: str):
    good = wanted()
    await apply_iptables.apply(plan(NodeState(), good), netns)
    broken = Chain(4, "nat", "RAVEN-POSTROUTING", (("-s", "10.16.0.0/23", "-j", "NOPE"),))
    with pytest.raises(ApplyError):
        await apply_iptables.apply([Op("replace", broken, ())], netns)
    assert await apply_iptables.read_actual(netns) == good
