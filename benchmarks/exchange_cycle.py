"""Instructions per keep-alive request of the server's :class:`Exchange` alone, counted by
valgrind: the request's side of the HTTP front without sockets, the tunnel or the router.

instructions.py counts the whole server (its rounds 0.5-1.5 % apart: a cut of a few hundred
instructions a request is inside that); this counts one exchange in one process, the same
instructions every run (``PYTHONHASHSEED=0``, gc frozen): a cut of 100 shows. A cycle is what
the HTTP callbacks ask of the exchange for a keep-alive request: ``receive_client`` (the
client's read: latency.py's ``GET /ping?n=I`` with its Host and User-Agent), the route given as
``Router.route_again``'s memo would give it (one Route object), ``routed``, then a 2-byte
answer (``receive_upstream``). ``--request same``: the same bytes every time (a scrape, a
probe); ``varied``: each request's target differs (a near request, ``Parsed.again``'s).

The count is callgrind's total over a run of ``--cycles`` + 1 000 cycles minus one of 1 000,
over ``--cycles``: start-up, imports and the requests' making (the same list in both runs)
cancel out. With ``--baseline DIR`` another checkout's code (its ``ravenproxy``, by this
script, from its root) is counted too; both in one run.

    .venv/bin/python benchmarks/exchange_cycle.py --baseline ../base
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARM = 10
BASE_CYCLES = 1_000
REQUEST = b"GET /ping?n=%d HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: latency\r\n\r\n"
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def requests(count: int, request: str) -> list[bytes]:
    """``count`` reads of a client: the same bytes, or each with a target of its own."""
    return [REQUEST % (i if request == "varied" else 1) for i in range(count)]


def cycles(reads: list[bytes], count: int) -> list[bytes]:
    """The first ``count`` of ``reads`` through one exchange, as the callbacks drive it (after
    :data:`WARM` cycles, gc frozen); what went to the target, in order. Imported here: the
    checkout's ``ravenproxy`` (the current directory's, :func:`child`'s)."""
    from ravenproxy.model.objects import Node, NodeAddress
    from ravenproxy.server.exchange import Exchange
    from ravenproxy.server.exchange_actions import OpenUpstream, RouteRequest, WriteUpstream
    from ravenproxy.server.router import Route
    from ravenproxy.wire.frames import Target

    node = Node(name="edge-1", addresses=(NodeAddress("InternalIP", "10.1.0.1"),))
    route = Route(node, Target("edge-1", "10.1.0.1", 9100), None)
    ex = Exchange(via="ravenproxy", max_head=16 * 1024)
    sent: list[bytes] = []
    for i, data in enumerate(reads[: WARM + count]):
        if i == WARM:
            gc.collect()
            gc.freeze()
        actions = ex.receive_client(data)
        while actions:
            action = actions.pop(0)
            if type(action) is RouteRequest:
                actions[:0] = ex.routed(route)
            elif type(action) is OpenUpstream:
                actions[:0] = ex.upstream_opened()
            elif type(action) is WriteUpstream:
                sent.append(action.data)
            else:
                raise AssertionError(f"unexpected {action!r}")
        ex.receive_upstream(ANSWER)
        if ex.phase != "head":
            raise AssertionError(f"the exchange is {ex.phase} after an answer")
    return sent


def child(
    root: str, request: str, count: int, total: int, cycle: Callable[..., object] | None = None
) -> None:
    """Run by valgrind: ``count`` cycles of a list of ``total`` reads, ``root``'s code; by
    :func:`cycles`, or by ``cycle`` (callback_cycle.py's)."""
    sys.path.insert(0, root)
    import ravenproxy

    if not str(ravenproxy.__file__).startswith(root):  # (the editable install's, not root's)
        raise SystemExit(f"ravenproxy from {ravenproxy.__file__}, not {root}")
    reads = requests(WARM + total, request)
    (cycle or cycles)(reads, count)


def counted(
    python: str,
    root: Path,
    request: str,
    count: int,
    total: int,
    out: Path,
    script: str = __file__,
) -> int:
    """callgrind's instruction total for :func:`child`'s run (``script``'s: callback_cycle.py
    counts its own cycle by this)."""
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            python,
            script,
            "--child",
            str(root),
            request,
            str(count),
            str(total),
        ],
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
    )
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals line in {out}")


def run(args: argparse.Namespace, script: str = __file__) -> dict[str, Any]:
    """Count ``script``'s cycle (:func:`counted`) for each checkout and request kind."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    here = Path(__file__).resolve().parents[1]
    checkouts = [("this", sys.executable, here)]
    if args.baseline is not None:
        base = args.baseline.resolve()
        checkouts.insert(0, ("base", str(base / ".venv" / "bin" / "python"), base))
    modes = ["same", "varied"] if args.request == "both" else [args.request]
    total = BASE_CYCLES + args.cycles
    name = Path(script).stem
    out: dict[str, Any] = {"benchmark": name, "cycles": args.cycles, "rows": {}}
    with tempfile.TemporaryDirectory(prefix=f"ravenproxy-{name}-") as tmp:
        for mode in modes:
            for name, python, root in checkouts:
                short = counted(python, root, mode, BASE_CYCLES, total, Path(tmp) / "a", script)
                long = counted(python, root, mode, total, total, Path(tmp) / "b", script)
                per = round((long - short) / args.cycles)
                out["rows"][f"{name} {mode}"] = per
                print(f"{name:5} {mode:7} {per:8d} instructions a cycle", flush=True)
            if args.baseline is not None:
                ratio = out["rows"][f"this {mode}"] / out["rows"][f"base {mode}"]
                out["rows"][f"this/base {mode}"] = round(ratio, 4)
    return out


def main(
    script: str = __file__,
    doc: str = __doc__ or "",
    run_child: Callable[[str, str, int, int], None] = child,
) -> None:
    """The command line of ``script`` (its ``--child`` is ``run_child``): this one's and
    callback_cycle.py's."""
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        run_child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--request", choices=["same", "varied", "both"], default="both")
    parser.add_argument("--cycles", type=int, default=2_000, help="counted cycles")
    parser.add_argument("--baseline", type=Path, help="another checkout (with its .venv)")
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    result = run(args, script)
    if args.output is not None:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
