"""Thin adapter: iptables/ip6tables and ipset, through their save/restore tools.

Reads only what ravenproxy owns (see :func:`ravenproxy.l3.iptables.owned_state`) and writes
one atomic ``--noflush`` batch per family, never a flush of a table.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ravenproxy.l3 import conntrack, ipset, iptables
from ravenproxy.l3.commands import run
from ravenproxy.l3.errors import ApplyError
from ravenproxy.l3.plan import Op
from ravenproxy.l3.state import Chain, IpSet, Jump, NodeState
from ravenproxy.log import kv

log = logging.getLogger(__name__)

FAMILIES = (4, 6)


def _tool(family: int, verb: str) -> str:
    return f"{'ip6tables' if family == 6 else 'iptables'}-{verb}"


async def save(family: int, netns: str | None = None) -> iptables.Saved:
    """The whole ruleset of one family, parsed (doctor reads foreign rules from it)."""
    return iptables.parse_save(await run([_tool(family, "save")], netns=netns), family)


async def read_actual(netns: str | None = None) -> NodeState:
    """Our chains, the jumps into them (both families) and our ipsets."""
    state = NodeState()
    for family in FAMILIES:
        state = state.merge(iptables.owned_state(await save(family, netns)))
    return state.merge(ipset.parse_save(await run(["ipset", "save"], netns=netns)))


async def apply(ops: Sequence[Op], netns: str | None = None) -> None:
    """Apply the ipset, chain and jump ops among ``ops`` (others are ignored).

    Consecutive ops of one tool go in one batch; the batches keep the plan's order, so sets
    exist before rules match them and outlive the rules that match them.
    """
    for batch in _batches(ops):
        if isinstance(batch[0].obj, IpSet):
            payload = ipset.render_restore(batch)
            log.info("ipset restore", extra=kv(ops=len(batch), netns=netns or ""))
            await run(["ipset", "restore"], stdin=payload, netns=netns)
            continue
        for family in FAMILIES:
            payload = iptables.render_restore(batch, family)
            if payload:
                log.info("iptables restore", extra=kv(family=family, ops=len(batch)))
                await run(
                    [_tool(family, "restore"), "--noflush", "--wait"],
                    stdin=payload,
                    netns=netns,
                )
        await _forget_snat(batch, netns)


async def _forget_snat(batch: Sequence[Op], netns: str | None) -> None:
    """After new skip-SNAT rules exist, drop the SNATed conntrack entries they cover."""
    for argv in conntrack.flush_commands(list(batch)):
        try:
            await run(argv, netns=netns)
        except ApplyError as exc:
            if conntrack.deleted_count(exc.detail) != 0:
                raise


def _batches(ops: Sequence[Op]) -> list[list[Op]]:
    out: list[list[Op]] = []
    for op in ops:
        if not isinstance(op.obj, IpSet | Chain | Jump):
            continue
        is_set = isinstance(op.obj, IpSet)
        if out and isinstance(out[-1][0].obj, IpSet) == is_set:
            out[-1].append(op)
        else:
            out.append([op])
    return out
