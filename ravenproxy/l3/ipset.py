"""ipsets as text: render ``ipset restore`` batches, read ``ipset save``.

A changed set is refilled under a temporary name and swapped in, so the iptables rules that
match it never see it half-filled.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ravenproxy.l3.cidrs import parse_network
from ravenproxy.l3.errors import CidrError, ParseError
from ravenproxy.l3.plan import Op
from ravenproxy.l3.state import IPSET_PREFIX, IpSet, NodeState

TMP_SUFFIX = "-tmp"


def _create(name: str, s: IpSet) -> str:
    fam = "inet6" if s.family == 6 else "inet"
    return f"create {name} {s.set_type} family {fam}"


def render_restore(ops: Iterable[Op]) -> str:
    """``ipset restore`` input for the ipset ops, ``""`` when there are none."""
    lines: list[str] = []
    for op in ops:
        s = op.obj
        if not isinstance(s, IpSet):
            continue
        if op.action == "add":
            lines.append(_create(s.name, s))
            lines.extend(f"add {s.name} {m}" for m in s.members)
        elif op.action == "replace":
            (old,) = op.old
            assert isinstance(old, IpSet)
            if (old.set_type, old.family) == (s.set_type, s.family):
                tmp = s.name + TMP_SUFFIX
                lines.append(_create(tmp, s) + " -exist")
                lines.append(f"flush {tmp}")
                lines.extend(f"add {tmp} {m}" for m in s.members)
                lines.append(f"swap {tmp} {s.name}")
                lines.append(f"destroy {tmp}")
            else:
                # swap needs compatible sets; a type change cannot be atomic.
                lines.append(f"destroy {s.name}")
                lines.append(_create(s.name, s))
                lines.extend(f"add {s.name} {m}" for m in s.members)
        else:
            lines.append(f"destroy {s.name}")
    return "\n".join(lines) + "\n" if lines else ""


def _member(text: str) -> str:
    try:
        return str(parse_network(text))
    except CidrError as exc:
        raise ParseError(f"ipset member {text!r}: {exc}") from None


def _order(cidr: str) -> tuple[int, int, int]:
    n = ipaddress.ip_network(cidr)
    return (n.version, int(n.network_address), n.prefixlen)


def parse_save(text: str) -> NodeState:
    """Our sets (name prefix ``ravenproxy-``) from ``ipset save`` output; others ignored."""
    meta: dict[str, tuple[str, int]] = {}
    members: dict[str, list[str]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split()
        if not words:
            continue
        if words[0] == "create" and len(words) >= 3:
            name, set_type = words[1], words[2]
            family = 6 if "inet6" in words[3:] else 4
            meta[name] = (set_type, family)
            members.setdefault(name, [])
        elif words[0] == "add" and len(words) >= 3:
            if words[1].startswith(IPSET_PREFIX):
                members.setdefault(words[1], []).append(_member(words[2]))
        else:
            raise ParseError(f"ipset save line {n}: cannot read {raw!r}")
    sets = []
    for name, (set_type, family) in meta.items():
        if not name.startswith(IPSET_PREFIX):
            continue
        ms = tuple(sorted(set(members.get(name, [])), key=_order))
        sets.append(IpSet(name, family, ms, set_type))
    return NodeState.of(sets)
