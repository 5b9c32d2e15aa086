from __future__ import annotations

import pytest

from ravenproxy.l3.errors import ParseError
from ravenproxy.l3.ipset import parse_save, render_restore
from ravenproxy.l3.plan import cleanup_plan, plan
from ravenproxy.l3.state import IpSet, NodeState

SET = IpSet("ravenproxy-remote-v4", 4, ("10.16.0.0/23", "10.16.20.0/24"))

SAVED = """\
create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 bucketsize 12
add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
create ravenproxy-remote-v4 hash:net family inet hashsize 1024 maxelem 65536 bucketsize 12
add ravenproxy-remote-v4 10.16.20.0/24
add ravenproxy-remote-v4 10.16.0.0/23
create ravenproxy-remote-v6 hash:net family inet6 hashsize 1024 maxelem 65536
add ravenproxy-remote-v6 fd00::1
"""


def test_parse_keeps_only_ours_normalised_and_sorted():
    got = parse_save(SAVED)
    assert got.ipsets == {
        SET,
        IpSet("ravenproxy-remote-v6", 6, ("fd00::1/128",)),
    }


def test_render_create_then_swap_then_destroy():
    assert render_restore(plan(NodeState(), NodeState.of([SET]))) == (
        "create ravenproxy-remote-v4 hash:net family inet\n"
        "add ravenproxy-remote-v4 10.16.0.0/23\n"
        "add ravenproxy-remote-v4 10.16.20.0/24\n"
    )
    smaller = IpSet(SET.name, 4, ("10.16.0.0/23",))
    assert render_restore(plan(NodeState.of([SET]), NodeState.of([smaller]))) == (
        "create ravenproxy-remote-v4-tmp hash:net family inet -exist\n"
        "flush ravenproxy-remote-v4-tmp\n"
        "add ravenproxy-remote-v4-tmp 10.16.0.0/23\n"
        "swap ravenproxy-remote-v4-tmp ravenproxy-remote-v4\n"
        "destroy ravenproxy-remote-v4-tmp\n"
    )
    assert render_restore(cleanup_plan(NodeState.of([SET]))) == "destroy ravenproxy-remote-v4\n"


def test_parse_of_rendered_is_the_same_set():
    assert parse_save(render_restore(plan(NodeState(), NodeState.of([SET])))).ipsets == {SET}


def test_garbage_is_a_typed_error():
    with pytest.raises(ParseError):
        parse_save("flush everything\n")
    with pytest.raises(ParseError):
        parse_save("create ravenproxy-x hash:net family inet\nadd ravenproxy-x banana\n")
