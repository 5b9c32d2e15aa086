"""xfrm policies as ``ip xfrm policy`` commands and output (pyroute2 has no xfrm support).

Only policies with :data:`~ravenproxy.l3.state.XFRM_PRIORITY` are ours; strongSwan's and
anyone else's are never read into actual state, so never planned or removed.
"""

from __future__ import annotations

from ravenproxy.l3.errors import ParseError
from ravenproxy.l3.plan import Op
from ravenproxy.l3.state import XFRM_PRIORITY, NodeState, XfrmDir, XfrmPolicy

_ANY = ("0.0.0.0", "::")
_DIRS: dict[str, XfrmDir] = {"in": "in", "fwd": "fwd", "out": "out"}


def _selector(p: XfrmPolicy) -> list[str]:
    return ["src", p.src, "dst", p.dst, "dir", p.dir]


def commands(ops: list[Op] | tuple[Op, ...]) -> list[list[str]]:
    """argv lists for the xfrm ops, in order."""
    out: list[list[str]] = []
    for op in ops:
        p = op.obj
        if not isinstance(p, XfrmPolicy):
            continue
        if op.action == "del":
            out.append(["ip", "xfrm", "policy", "delete", *_selector(p)])
            continue
        tmpl = ["tmpl"]
        if p.tmpl_src is not None:
            tmpl += ["src", p.tmpl_src]
        tmpl += ["dst", p.tmpl_dst, "proto", "esp", "mode", "tunnel"]
        if p.optional:
            tmpl += ["level", "use"]
        # update also creates: a replace needs no delete, and no window without a policy.
        verb = "add" if op.action == "add" else "update"
        out.append(
            ["ip", "xfrm", "policy", verb, *_selector(p), "priority", str(p.priority), *tmpl]
        )
    return out


def parse_policies(text: str) -> NodeState:
    """Our policies from ``ip -o xfrm policy list`` (one policy per line, ``\\`` separated)."""
    found: list[XfrmPolicy] = []
    for n, line in enumerate(text.splitlines(), 1):
        words = line.replace("\\", " ").split()
        if not words:
            continue
        head: dict[str, str] = {}
        tmpl: dict[str, str] = {}
        target = head
        i = 0
        while i < len(words):
            w = words[i]
            if w == "tmpl":
                target = tmpl
                i += 1
                continue
            if i + 1 < len(words):
                target.setdefault(w, words[i + 1])
            i += 2
        if "src" not in head or "dst" not in head or "dir" not in head:
            # Socket policies and the like have no selector we could have written.
            if "priority" in head and head.get("priority") == str(XFRM_PRIORITY):
                raise ParseError(f"ip xfrm policy line {n}: cannot read {line!r}")
            continue
        if head.get("priority") != str(XFRM_PRIORITY):
            continue
        direction = _DIRS.get(head["dir"])
        if direction is None or "dst" not in tmpl:
            raise ParseError(f"ip xfrm policy line {n}: cannot read {line!r}")
        tsrc = tmpl.get("src")
        found.append(
            XfrmPolicy(
                src=head["src"],
                dst=head["dst"],
                dir=direction,
                tmpl_dst=tmpl["dst"],
                tmpl_src=None if tsrc is None or tsrc in _ANY else tsrc,
                priority=XFRM_PRIORITY,
                optional=tmpl.get("level") == "use",
            )
        )
    return NodeState.of(found)
