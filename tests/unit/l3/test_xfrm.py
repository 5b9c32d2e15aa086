from __future__ import annotations

import pytest

from ravenproxy.l3.errors import ParseError
from ravenproxy.l3.plan import Op, cleanup_plan, plan
from ravenproxy.l3.state import NodeState, XfrmPolicy
from ravenproxy.l3.xfrm import commands, parse_policies

IN = XfrmPolicy("10.96.0.0/12", "10.16.0.0/23", "in", tmpl_dst="10.0.0.1")
FWD = XfrmPolicy("10.96.0.0/12", "10.16.0.0/23", "fwd", tmpl_dst="10.0.0.1")

# ``ip -o xfrm policy list`` with strongSwan's policy and ours (taken from the test bed).
LISTED = (
    "src 10.1.0.0/16 dst 10.2.0.0/16 \\\tdir out priority 5 ptype main \\\t"
    "tmpl src 1.2.3.4 dst 10.0.0.2\\\t\\proto esp reqid 0 mode tunnel\\\n"
    "src 10.96.0.0/12 dst 10.16.0.0/23 \\\tdir fwd priority 1000099 ptype main \\\t"
    "tmpl src 0.0.0.0 dst 10.0.0.1\\\t\\proto esp reqid 0 mode tunnel\\\t\\level use \\\n"
    "src 10.96.0.0/12 dst 10.16.0.0/23 \\\tdir in priority 1000099 ptype main \\\t"
    "tmpl src 0.0.0.0 dst 10.0.0.1\\\t\\proto esp reqid 0 mode tunnel\\\t\\level use \\\n"
    "src 0.0.0.0/0 dst 0.0.0.0/0 \\\tsocket in priority 0 ptype main \\\n"
)


def test_parse_keeps_only_our_priority():
    assert parse_policies(LISTED) == NodeState.of([IN, FWD])


def test_commands_add_update_delete():
    assert commands(plan(NodeState(), NodeState.of([IN]))) == [
        [
            "ip", "xfrm", "policy", "add", "src", "10.96.0.0/12", "dst", "10.16.0.0/23",
            "dir", "in", "priority", "1000099",
            "tmpl", "dst", "10.0.0.1", "proto", "esp", "mode", "tunnel", "level", "use",
        ]
    ]  # fmt: skip
    pinned = XfrmPolicy("10.96.0.0/12", "10.16.0.0/23", "in", "10.0.0.1", tmpl_src="1.2.3.4")
    (argv,) = commands([Op("replace", pinned, (IN,))])
    assert argv[3] == "update" and argv[argv.index("tmpl") + 1 : argv.index("tmpl") + 3] == [
        "src",
        "1.2.3.4",
    ]
    assert commands(cleanup_plan(NodeState.of([IN]))) == [
        [
            "ip",
            "xfrm",
            "policy",
            "delete",
            "src",
            "10.96.0.0/12",
            "dst",
            "10.16.0.0/23",
            "dir",
            "in",
        ]
    ]


def test_rendered_policy_parses_back():
    (argv,) = commands([Op("add", FWD)])
    line = " ".join(argv[4:]).replace("dir fwd priority 1000099", "dir fwd priority 1000099 \\")
    assert parse_policies(line) == NodeState.of([FWD])


def test_our_priority_without_a_template_is_an_error():
    with pytest.raises(ParseError):
        parse_policies("src 10.96.0.0/12 dst 10.16.0.0/23 \\\tdir in priority 1000099 ptype main")
