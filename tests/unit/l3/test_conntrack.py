from __future__ import annotations

from ravenproxy.l3.conntrack import deleted_count, flush_commands
from ravenproxy.l3.plan import Op
from ravenproxy.l3.state import Chain

A = ("-s", "10.16.11.0/24", "-d", "10.16.0.0/23", "-j", "ACCEPT")
B = ("-s", "10.16.0.0/23", "-d", "10.16.11.0/24", "-j", "ACCEPT")
OLD = Chain(4, "nat", "RAVEN-POSTROUTING", (A,))
NEW = Chain(4, "nat", "RAVEN-POSTROUTING", (A, B))


def test_only_newly_exempted_pairs_are_flushed():
    assert flush_commands([Op("replace", NEW, (OLD,))]) == [
        ["conntrack", "-D", "-f", "ipv4", "-s", "10.16.0.0", "--mask-src", "255.255.254.0",
         "-d", "10.16.11.0", "--mask-dst", "255.255.255.0", "--src-nat"]
    ]  # fmt: skip
    assert len(flush_commands([Op("add", NEW)])) == 2
    assert flush_commands([Op("del", NEW)]) == []


def test_other_chains_and_ipv6():
    mark = Chain(4, "mangle", "RAVEN-PREROUTING", (("-j", "MARK", "--set-xmark", "0x40/0x40"),))
    assert flush_commands([Op("add", mark)]) == []
    v6 = Chain(6, "nat", "RAVEN-POSTROUTING", (("-s", "fd00::/64", "-d", "fd01::/64"),))
    (argv,) = flush_commands([Op("add", v6)])
    assert argv[3] == "ipv6" and argv[7] == "ffff:ffff:ffff:ffff::"


def test_deleted_count_reads_the_message():
    msg = "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n"
    assert deleted_count(msg) == 0
    assert deleted_count("conntrack v1.4.7: Operation failed: invalid parameters") is None
