"""plan(actual, desired) as data."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.plan import Op, cleanup_plan, plan
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import (
    KIND_ORDER,
    Address,
    Chain,
    Jump,
    Link,
    NodeState,
    Route,
    Rule,
    Sysctl,
)
from ravenproxy.model.snapshot import Model

from .models import cloud_and_edge, hub_and_two_nated_edges

S = L3Settings()
SPEC = ("-m", "comment", "--comment", "ravenproxy", "-j", "RAVEN-POSTROUTING")
JUMP = Jump(4, "nat", "POSTROUTING", "RAVEN-POSTROUTING", SPEC, 1)
CHAIN = Chain(
    4, "nat", "RAVEN-POSTROUTING", (("-s", "10.16.0.0/24", "-d", "10.17.0.0/24", "-j", "ACCEPT"),)
)


def all_states() -> list[NodeState]:
    out = []
    for model in (cloud_and_edge(), hub_and_two_nated_edges()):
        for name in model.nodes:
            for s in (S, L3Settings(vpn_driver="wireguard", service_cidr="10.96.0.0/12")):
                out.append(desired_state(model, name, s))
    return out


def test_plan_of_a_no_op_is_empty():
    for state in all_states():
        assert plan(state, state) == ()


def test_from_nothing_everything_is_added_in_dependency_order():
    state = desired_state(cloud_and_edge(), "edge-2", S)
    ops = plan(NodeState(), state)
    assert all(op.action == "add" for op in ops)
    assert {op.obj for op in ops} == set(state.objects())
    kinds = [KIND_ORDER.index(type(op.obj)) for op in ops]
    assert kinds == sorted(kinds)


def test_cleanup_deletes_everything_owned_in_reverse_order_but_no_sysctl():
    state = desired_state(cloud_and_edge(), "edge-2", S)
    ops = cleanup_plan(state)
    assert all(op.action == "del" for op in ops)
    assert {op.obj for op in ops} == set(state.objects()) - set(state.sysctls)
    kinds = [KIND_ORDER.index(type(op.obj)) for op in ops]
    assert kinds == sorted(kinds, reverse=True)
    assert type(ops[0].obj) is Rule and type(ops[-1].obj) is Link


def test_changed_route_is_one_replace():
    old = Route("10.16.0.0/23", 9027, "raven0", "240.0.0.1", None, True)
    new = dataclasses.replace(old, gateway="240.0.0.2")
    assert plan(NodeState.of([old]), NodeState.of([new])) == (Op("replace", new, (old,)),)


def test_adds_come_before_deletes():
    old_rule = Rule(4, 100, 0x40, 0x40, 9027)
    new_rule = Rule(4, 100, 0x80, 0x80, 9027)
    route = Route("10.16.0.0/23", 9027, "raven0", "240.0.0.1", None, True)
    ops = plan(NodeState.of([old_rule]), NodeState.of([new_rule, route]))
    assert [(op.action, op.obj) for op in ops] == [
        ("add", route),
        ("add", new_rule),
        ("del", old_rule),
    ]


def test_chain_content_change_is_one_atomic_replace():
    new = dataclasses.replace(CHAIN, rules=(*CHAIN.rules, ("-s", "a", "-j", "ACCEPT")))
    ops = plan(NodeState.of([CHAIN, JUMP]), NodeState.of([new, JUMP]))
    assert ops == (Op("replace", new, (CHAIN,)),)


def test_jump_pushed_down_by_a_foreign_rule_is_moved_back():
    pushed = dataclasses.replace(JUMP, position=2)
    ops = plan(NodeState.of([CHAIN, pushed]), NodeState.of([CHAIN, JUMP]))
    assert ops == (Op("replace", JUMP, (pushed,)),)


def test_duplicate_jumps_collapse_into_one():
    dups = [dataclasses.replace(JUMP, position=p) for p in (1, 4)]
    ops = plan(NodeState.of([CHAIN, *dups]), NodeState.of([CHAIN, JUMP]))
    assert ops == (Op("replace", JUMP, tuple(dups)),)


def test_sysctl_is_set_but_never_deleted():
    want = Sysctl("net/ipv4/conf/raven0/rp_filter", "2")
    have = Sysctl("net/ipv4/conf/raven0/rp_filter", "1")
    stray = Sysctl("net/ipv4/conf/eth0/rp_filter", "1")
    assert plan(NodeState.of([have, stray]), NodeState.of([want])) == (
        Op("replace", want, (have,)),
    )


def test_gateway_moves_to_another_node():
    m = cloud_and_edge()
    gw = m.gateways["gw-edge"]
    ep = dataclasses.replace(gw.active_endpoints[0], node_name="edge-2")
    moved = Model.build(
        m.nodes.values(),
        [m.gateways["gw-cloud"], dataclasses.replace(gw, endpoints=(ep,), active_endpoints=(ep,))],
    )
    before = desired_state(m, "edge-2", S)
    after = desired_state(moved, "edge-2", S)
    ops = plan(before, after)
    by_kind = {(op.action, type(op.obj)) for op in ops}
    # edge-2 becomes the gateway: raven0 loses its fixed remote, the VPN appears, the
    # member's policy routing goes; its address and skip-SNAT rules stay as they were.
    assert ("replace", Link) in by_kind
    assert ("add", type(next(iter(after.vpn_connections)))) in by_kind
    assert ("del", Route) in by_kind and ("del", Rule) in by_kind
    assert not any(isinstance(op.obj, Address) for op in ops)
    assert not any(isinstance(op.obj, Chain) and op.obj.table == "nat" for op in ops)
    assert plan(after, after) == ()


def test_op_str_is_readable():
    route = Route("10.16.0.0/23", 9027, "raven0", "240.0.0.1", None, True)
    assert (
        str(Op("add", route)) == "+ route 10.16.0.0/23 table 9027 via 240.0.0.1 dev raven0 onlink"
    )
    text = str(Op("replace", JUMP, (dataclasses.replace(JUMP, position=3),)))
    assert text.startswith("~ jump iptables -t nat POSTROUTING #1")
    assert "was jump iptables -t nat POSTROUTING #3" in text
    chain_text = str(Op("add", CHAIN))
    assert "-A RAVEN-POSTROUTING -s 10.16.0.0/24 -d 10.17.0.0/24 -j ACCEPT" in chain_text


@given(st.sampled_from(all_states()), st.sampled_from(all_states()))
def test_applying_the_plan_reaches_the_desired_state(actual: NodeState, desired: NodeState):
    """Simulate the ops on a set of objects: the result is the desired state (sysctls aside),
    and planning again from there is empty."""
    objs = {(type(o), o.key): o for o in actual.objects()}
    for op in plan(actual, desired):
        for old in op.old:
            objs.pop((type(old), old.key), None)
        if op.action == "del":
            objs.pop((type(op.obj), op.obj.key))
        else:
            objs[(type(op.obj), op.obj.key)] = op.obj
    reached = NodeState.of(objs.values())
    assert dataclasses.replace(reached, sysctls=frozenset()) == dataclasses.replace(
        desired, sysctls=frozenset()
    )
    assert desired.sysctls <= reached.sysctls
    assert plan(reached, desired) == ()
