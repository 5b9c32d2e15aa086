"""``plan(actual, desired) -> ops``: the minimal changes, as data, in a safe order.

Objects are matched by ``key`` (what identifies them in the kernel). Same key, different
content → ``replace``; only in desired → ``add``; only in actual → ``del``. Ops come in
creation order (see :data:`ravenproxy.l3.state.KIND_ORDER`) with every add and replace
before any delete, and deletes in reverse order, so the data path is never torn down before
its replacement exists. Chain contents are replaced whole (one ``iptables-restore`` batch).

Sysctls are never deleted: we set values, we do not own the keys.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal

from ravenproxy.l3.state import KIND_ORDER, Chain, Jump, NodeState, StateObject, Sysctl

Action = Literal["add", "replace", "del"]


@dataclass(frozen=True)
class Op:
    """One change. ``old`` holds what ``replace``/``del`` removes (several jumps may be
    replaced by one: duplicates and a jump pushed down by a foreign rule)."""

    action: Action
    obj: StateObject
    old: tuple[StateObject, ...] = ()

    def __str__(self) -> str:
        sign = {"add": "+", "replace": "~", "del": "-"}[self.action]
        line = f"{sign} {self.obj.describe()}"
        if self.action == "replace":
            for o in self.old:
                line += f"\n    was {o.describe()}"
        if isinstance(self.obj, Chain) and self.action != "del":
            line += "".join(f"\n  {r}" for r in self.obj.describe_rules())
        return line


def plan(actual: NodeState, desired: NodeState) -> tuple[Op, ...]:
    adds: list[Op] = []
    deletes: list[Op] = []
    for kind in KIND_ORDER:
        want = _by_key(desired.of_kind(kind))
        have = _by_key(actual.of_kind(kind))
        kind_deletes: list[Op] = []
        for key in sorted(want, key=repr):
            (new,) = want[key]  # desired state never holds two objects with one key
            olds = have.get(key, [])
            if not olds:
                adds.append(Op("add", new))
            elif olds != [new]:
                adds.append(Op("replace", new, tuple(olds)))
        if kind is Sysctl:
            continue
        for key in sorted(have.keys() - want.keys(), key=repr):
            kind_deletes.extend(Op("del", o) for o in have[key])
        deletes[:0] = kind_deletes  # reverse kind order
    return tuple(adds + deletes)


def cleanup_plan(actual: NodeState) -> tuple[Op, ...]:
    """Remove everything ravenproxy owns (actual state only ever holds owned objects)."""
    return plan(actual, NodeState())


def _by_key(objs: frozenset[Any]) -> dict[tuple[object, ...], list[StateObject]]:
    out: dict[tuple[object, ...], list[StateObject]] = defaultdict(list)
    for o in sorted(objs, key=_position_then_text):
        out[o.key].append(o)
    return dict(out)


def _position_then_text(o: StateObject) -> tuple[int, str]:
    return (o.position if isinstance(o, Jump) else 0, o.describe())
