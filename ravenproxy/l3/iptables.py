"""iptables as text: render ``iptables-restore --noflush`` batches, read ``iptables-save``.

Pure functions; :mod:`ravenproxy.l3.apply_iptables` runs the commands. A batch declares each
chain we own (``:RAVEN-POSTROUTING - [0:0]``), which in ``--noflush`` mode empties only that
chain, and refills it: the kernel swaps the whole batch in at once, so no packet ever sees a
half-written chain, and foreign rules (Flannel, kube-proxy) are never touched.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ravenproxy.l3.errors import ParseError
from ravenproxy.l3.plan import Op
from ravenproxy.l3.state import OWNED_CHAINS, SKIP_SNAT_CHAIN, Chain, Jump, NodeState

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:!,=+@%")
_SNAT_TARGETS = frozenset({"MASQUERADE", "SNAT"})


def quote(token: str) -> str:
    """Quote one argument the way iptables-restore reads it (double quotes only)."""
    if token and all(c in _SAFE for c in token):
        return token
    return '"' + token.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _line(*tokens: str) -> str:
    return " ".join(quote(t) for t in tokens)


def render_restore(ops: Iterable[Op], family: int) -> str:
    """The ``iptables-restore --noflush`` (or ``ip6tables-restore``) input for the chain and
    jump ops of one family, ``""`` when there are none. Ops keep their plan order per table,
    which already puts chain contents before the jumps into them and jump removals before
    chain removals."""
    by_table: dict[str, list[str]] = {}
    for op in ops:
        obj = op.obj
        if not isinstance(obj, Chain | Jump) or obj.family != family:
            continue
        lines = by_table.setdefault(obj.table, [])
        if isinstance(obj, Chain):
            if op.action == "del":
                lines.append(_line("-F", obj.name))
                lines.append(_line("-X", obj.name))
            else:
                lines.append(f":{obj.name} - [0:0]")
                lines.extend(_line("-A", obj.name, *rule) for rule in obj.rules)
        else:
            # -D by spec removes the first match; one -D per old copy removes them all, and
            # the insert comes after so it cannot be the one removed.
            for old in op.old:
                assert isinstance(old, Jump)
                lines.append(_line("-D", old.chain, *old.spec))
            if op.action == "del":
                lines.append(_line("-D", obj.chain, *obj.spec))
            else:
                lines.append(_line("-I", obj.chain, str(obj.position), *obj.spec))
    out: list[str] = []
    for table, lines in by_table.items():
        out.append(f"*{table}")
        out.extend(lines)
        out.append("COMMIT")
    return "\n".join(out) + "\n" if out else ""


@dataclass(frozen=True)
class SavedTable:
    #: Chain name → its rules (arguments after ``-A CHAIN``), in order.
    chains: Mapping[str, tuple[tuple[str, ...], ...]]


@dataclass(frozen=True)
class Saved:
    """What ``iptables-save`` printed, per table."""

    family: int
    tables: Mapping[str, SavedTable]

    def rules(self, table: str, chain: str) -> tuple[tuple[str, ...], ...]:
        t = self.tables.get(table)
        return t.chains.get(chain, ()) if t is not None else ()


def parse_save(text: str, family: int = 4) -> Saved:
    tables: dict[str, dict[str, list[tuple[str, ...]]]] = {}
    current: dict[str, list[tuple[str, ...]]] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("*"):
            current = tables.setdefault(line[1:], {})
        elif line == "COMMIT":
            current = None
        elif current is None:
            raise ParseError(f"iptables-save line {n}: {line!r} outside a table")
        elif line.startswith(":"):
            current.setdefault(line[1:].split()[0], [])
        elif line.startswith("-A "):
            try:
                tokens = shlex.split(line)
            except ValueError as exc:
                raise ParseError(f"iptables-save line {n}: {exc}") from None
            if len(tokens) < 2:
                raise ParseError(f"iptables-save line {n}: -A without a chain")
            current.setdefault(tokens[1], []).append(tuple(tokens[2:]))
        else:
            raise ParseError(f"iptables-save line {n}: cannot read {line!r}")
    return Saved(
        family=family,
        tables=MappingProxyType(
            {
                name: SavedTable(MappingProxyType({c: tuple(r) for c, r in chains.items()}))
                for name, chains in tables.items()
            }
        ),
    )


def target_of(spec: tuple[str, ...]) -> str | None:
    """The ``-j``/``-g`` target of a rule, if any."""
    for i, tok in enumerate(spec[:-1]):
        if tok in ("-j", "--jump", "-g", "--goto"):
            return spec[i + 1]
    return None


def owned_state(saved: Saved) -> NodeState:
    """Our chains with their content and every jump into them; nothing else."""
    chains: list[Chain] = []
    jumps: list[Jump] = []
    owned = {name for _, name in OWNED_CHAINS}
    for (table, name), _parent in OWNED_CHAINS.items():
        t = saved.tables.get(table)
        if t is None:
            continue
        if name in t.chains:
            chains.append(Chain(saved.family, table, name, t.chains[name]))
        for chain, rules in t.chains.items():
            if chain in owned:
                continue
            for pos, spec in enumerate(rules, 1):
                if target_of(spec) == name:
                    jumps.append(Jump(saved.family, table, chain, name, spec, pos))
    return NodeState.of([*chains, *jumps])


def snat_before_jump(saved: Saved) -> tuple[str, ...]:
    """Doctor findings: rules in nat POSTROUTING that would SNAT before our skip-SNAT chain
    runs (all of them when the jump is missing) — the Flannel MASQUERADE bug's signature."""
    post = saved.rules("nat", "POSTROUTING")
    ours = [i for i, spec in enumerate(post) if target_of(spec) == SKIP_SNAT_CHAIN]
    limit = ours[0] if ours else len(post)
    findings: list[str] = []
    for i, spec in enumerate(post[:limit], 1):
        target = target_of(spec)
        if target is None:
            continue
        if target in _SNAT_TARGETS:
            why = target
        elif _reaches_snat(saved, target, set()):
            why = f"{target}, which reaches MASQUERADE/SNAT"
        else:
            continue
        where = "before the jump to" if ours else "and there is no jump to"
        findings.append(
            f"nat POSTROUTING rule {i} ({' '.join(spec)}) → {why}, {where} {SKIP_SNAT_CHAIN}"
        )
    return tuple(findings)


def _reaches_snat(saved: Saved, chain: str, seen: set[str]) -> bool:
    if chain in seen:
        return False
    seen.add(chain)
    for spec in saved.rules("nat", chain):
        target = target_of(spec)
        if target in _SNAT_TARGETS:
            return True
        if target is not None and _reaches_snat(saved, target, seen):
            return True
    return False
