"""Which conntrack entries to forget after the skip-SNAT chain gains a rule.

NAT is decided on a flow's first packet and kept in its conntrack entry: a pod-to-pod flow
that started while the CNI's MASQUERADE still applied stays SNATed after our rule exists,
and keeps failing the xfrm policy. Deleting the SNATed entries of the newly exempted pairs
makes their next packet take the new path.
"""

from __future__ import annotations

import ipaddress
import re

from ravenproxy.l3.plan import Op
from ravenproxy.l3.state import SKIP_SNAT_CHAIN, Chain

_DELETED = re.compile(r"(\d+) flow entries have been deleted")


def _pair(rule: tuple[str, ...]) -> tuple[str, str] | None:
    try:
        return rule[rule.index("-s") + 1], rule[rule.index("-d") + 1]
    except (ValueError, IndexError):
        return None


def _addr_mask(cidr: str) -> tuple[str, str]:
    net = ipaddress.ip_network(cidr)
    return str(net.network_address), str(net.netmask)


def flush_commands(ops: list[Op] | tuple[Op, ...]) -> list[list[str]]:
    """``conntrack -D`` argv lists for the pairs a skip-SNAT chain op newly exempts."""
    out: list[list[str]] = []
    for op in ops:
        chain = op.obj
        if not isinstance(chain, Chain) or chain.name != SKIP_SNAT_CHAIN or op.action == "del":
            continue
        before = {r for old in op.old if isinstance(old, Chain) for r in old.rules}
        for rule in chain.rules:
            pair = _pair(rule)
            if rule in before or pair is None:
                continue
            (src, smask), (dst, dmask) = _addr_mask(pair[0]), _addr_mask(pair[1])
            family = "ipv6" if chain.family == 6 else "ipv4"
            out.append(
                ["conntrack", "-D", "-f", family, "-s", src, "--mask-src", smask,
                 "-d", dst, "--mask-dst", dmask, "--src-nat"]
            )  # fmt: skip
    return out


def deleted_count(stderr: str) -> int | None:
    """conntrack exits 1 when nothing matched; its message says how many were deleted."""
    m = _DELETED.search(stderr)
    return int(m.group(1)) if m else None
