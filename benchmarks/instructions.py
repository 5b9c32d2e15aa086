"""Instructions per request of ``ravenproxy server`` and ``ravenproxy agent``, counted by valgrind.

benchmarks/latency.py's CPU per request moves by ±10 % from run to run (row order, the host), too
much to see a change of a few Python calls per request. Instructions executed in user space are
repeatable: this runs the tunnel's two processes under ``valgrind --tool=callgrind``, drives small
keep-alive GETs over latency.py's ``tunnel`` path (client → server HTTP front, ``Host:
edge-1:PORT`` → mTLS WebSocket tunnel → agent → target; latency.py's target, start-up and client,
imported) at a low fixed rate, and divides the instructions (callgrind's ``Ir``) each process
executed while they were served by the requests served.

- Both processes start with instrumentation off (``--instr-atstart=no``: start-up, imports,
  the tunnel's handshake and the connections' warm-up are not counted, and run ~4x faster than
  instrumented); each round is ``callgrind_control -i on`` (server, agent), the requests,
  ``-i off``, ``-d`` (a dump: the counts since the last one), read back from the dump's
  ``totals:`` line.
- With ``--baseline DIR`` another checkout's pair (run by ``DIR/.venv/bin/python``) is measured
  in the same run, round by round in alternating order: before/after in one run.
- ``PYTHONHASHSEED=0`` for every process it starts (set iteration orders then repeat).
- With ``--floor`` latency.py's ``floor`` row is counted too (``floor_relay.py``: two bare
  uvloop relays with mTLS between them), relay A as the server, relay B as the agent: the same
  requests, so ``tunnel-floor`` is what the tunnel executes above a minimal TLS relay.

    .venv/bin/python benchmarks/instructions.py --baseline ../base
    .venv/bin/python benchmarks/instructions.py --requests 200 --rounds 2 --output -   # quick

What it counts: user-space instructions of the two processes (Python, OpenSSL, uvloop/libuv,
libc), every thread, over the round: the requests and whatever else ran meanwhile (timers, the
tunnel's keepalive pings), hence a low rate and the same schedule for both checkouts. What it
does not: kernel time (syscalls are counted by ``strace -c``), cache misses, cycles, branch
mispredictions; batching (at 50 req/s under valgrind requests do not overlap: this is the cost
of a request alone, not under load). valgrind's synthetic CPUID hides AVX-512 and VAES, so
OpenSSL runs its AES-GCM over AVX2 code here, not what it runs natively on such a host.
valgrind must be installed (Debian's ``valgrind``: ``make bench-tools``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import (
    Procs,
    _commit,
    _interpreter,
    _machine,
    _wait_routable,
    add_answer_argument,
    add_request_argument,
    request_setting,
    run_row,
    start_floor,
    start_target,
    start_tunnel,
    write_result,
)

RESULTS = Path(__file__).resolve().parent / "results" / "instructions.json"
ROLES = ("server", "agent")


class Counted:
    """One checkout's server and agent under callgrind: switch counting on and off, read what
    each round counted."""

    def __init__(self, name: str, base: Path) -> None:
        self.name = name
        self.out = {role: base / f"callgrind-{name}-{role}.out" for role in ROLES}
        self.pids: dict[str, int] = {}
        self.dumps = 0

    def wrap(self, role: str) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={self.out[role]}",
        ]

    def control(self, *args: str) -> None:
        for role in ROLES:
            done = subprocess.run(
                ["callgrind_control", *args, str(self.pids[role])],
                capture_output=True,
                text=True,
                check=False,
                timeout=120,
            )
            if done.returncode:
                raise RuntimeError(f"callgrind_control {args} {role}: {done.stderr.strip()}")

    def on(self) -> None:
        self.control("-i", "on")

    def off_and_read(self) -> dict[str, int]:
        """Counting off, a dump; the instructions each process executed since the last."""
        self.control("-i", "off")
        self.control("-d")
        self.dumps += 1
        return {role: _totals(Path(f"{self.out[role]}.{self.dumps}")) for role in ROLES}


def _totals(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


async def measure(
    args: argparse.Namespace, pairs: list[tuple[Counted, int, str]]
) -> list[dict[str, Any]]:
    started = time.monotonic()
    for _, http, host in pairs:
        # Under valgrind a start takes ~10 s here and once took over 20 (2026-12-05 16:36).
        await _wait_routable(http, host, seconds=120.0)
    print(f"routable after {time.monotonic() - started:.0f} s", file=sys.stderr)
    rounds = []
    for r in range(args.rounds):
        order = pairs if r % 2 == 0 else pairs[::-1]
        for counted, http, host in order:
            counts: dict[str, int] = {}

            def stop(counted: Counted = counted, counts: dict[str, int] = counts) -> None:
                counts.update(counted.off_and_read())

            row = await run_row(
                counted.name,
                http,
                host,
                args.rate,
                args.requests / args.rate,
                args.connections,
                connect=host if args.connect else None,
                on_start=counted.on,
                on_stop=stop,
                vary=args.request == "varied",
            )
            served = len(row.latencies)
            entry: dict[str, Any] = {
                "round": r + 1,
                "checkout": counted.name,
                "requests": served,
                "seconds": round(row.elapsed, 2),
                "errors": len(row.errors),
                "error_samples": row.errors[:3],
                "instructions": counts,
            }
            if served:
                per = {role: round(counts[role] / served) for role in ROLES}
                per["sum"] = per["server"] + per["agent"]
                entry["per_request"] = per
            rounds.append(entry)
            print(json.dumps(entry), file=sys.stderr)
    return rounds


def summarize(rounds: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        mine = [r["per_request"] for r in rounds if r["checkout"] == name and "per_request" in r]
        if not mine:
            continue
        out[name] = {}
        for key in (*ROLES, "sum"):
            values = [m[key] for m in mine]
            med = statistics.median(values)
            out[name][key] = {
                "median": round(med),
                "spread_pct": round((max(values) - min(values)) / med * 100, 2) if med else None,
            }
    if "tunnel" in out and "floor" in out:  # what the tunnel does above two bare relays
        out["tunnel-floor"] = {
            key: out["tunnel"][key]["median"] - out["floor"][key]["median"]
            for key in (*ROLES, "sum")
        }
    if "tunnel" in out and "base" in out:
        out["tunnel/base"] = {
            key: round(out["tunnel"][key]["median"] / out["base"][key]["median"], 4)
            for key in (*ROLES, "sum")
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is not installed")
    os.environ["PYTHONHASHSEED"] = "0"
    machine = _machine()
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-instructions-"))
    procs = Procs(base)
    try:
        target_port = start_target(base, procs, args.answer)
        host = f"edge-1:{target_port}"
        pairs = []
        checkouts: list[tuple[str, str, Path | None]] = []
        if args.baseline is not None:
            python = str(args.baseline / ".venv" / "bin" / "python")
            checkouts.append(("base", python, args.baseline))
            machine["baseline"] = str(args.baseline)
            machine["baseline_commit"] = _commit(args.baseline)
            machine["baseline_python"] = _interpreter(python)
        checkouts.append(("tunnel", sys.executable, None))
        for name, python, cwd in checkouts:
            counted = Counted(name, base)
            tunnel = start_tunnel(base, procs, target_port, name, python, cwd, wrap=counted.wrap)
            counted.pids = dict(zip(ROLES, tunnel.pids, strict=True))
            pairs.append((counted, tunnel.http, host))
        if args.floor:  # relay A counted as the server, relay B as the agent
            counted = Counted("floor", base)
            port, pids = start_floor(base, procs, target_port, wrap=counted.wrap, seconds=120.0)
            counted.pids = dict(zip(ROLES, pids, strict=True))
            pairs.append((counted, port, host))
            checkouts.append(("floor", sys.executable, None))
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rounds = runner.run(measure(args, pairs))
    finally:
        procs.stop()
        if args.dumps is not None:  # for callgrind_annotate: where the instructions went
            args.dumps.mkdir(parents=True, exist_ok=True)
            for dump in base.glob("callgrind-*.out.*"):
                shutil.copy(dump, args.dumps / dump.name)
        shutil.rmtree(base, ignore_errors=True)
    machine["loadavg_at_end"] = list(os.getloadavg())
    return {
        "benchmark": "instructions",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "valgrind": subprocess.run(
            ["valgrind", "--version"], capture_output=True, text=True, check=False
        ).stdout.strip(),
        "settings": {
            "requests_per_round": args.requests,
            "rate": args.rate,
            "connections": args.connections,
            "answer": args.answer,
            "rounds": args.rounds,
            "floor": "relay A as server, relay B as agent (floor_relay.py)" if args.floor else None,
            "request": request_setting(
                args.request, "(keep-alive), Host: edge-1:PORT (the answers: see answer)"
            ),
            "path": "tunnel-connect (CONNECT edge-1:PORT once per connection)"
            if args.connect
            else "tunnel (each request routed by its Host)",
            "counted": "callgrind Ir (user-space instructions) of server and agent from "
            "callgrind_control -i on to -i off around the requests, / requests served",
        },
        "rounds": rounds,
        "per_request": summarize(rounds, [name for name, _, _ in checkouts]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1000, help="per round and checkout")
    parser.add_argument("--rate", type=int, default=50, help="req/s (valgrind is ~50x slower)")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another checkout (with its .venv)")
    parser.add_argument(
        "--connect",
        action="store_true",
        help="latency.py's tunnel-connect path: CONNECT once per connection, then the GETs as "
        "bytes (nothing parsed per request); without it, the tunnel path (Host: routing)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="count latency.py's floor row too: two floor_relay.py processes over mTLS, relay "
        "A as the server, relay B as the agent (not with --connect: the relays parse nothing)",
    )
    parser.add_argument(
        "--dumps", type=Path, help="keep the dumps here: callgrind-NAME-ROLE.out.ROUND"
    )
    parser.add_argument("--output", default=str(RESULTS), help="file, or - for stdout")
    add_answer_argument(parser)
    add_request_argument(parser)
    args = parser.parse_args()
    if args.floor and args.connect:
        parser.error("--floor counts the tunnel path's requests: not with --connect")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run()'s cleanup still runs
    write_result(run(args), args.output)


if __name__ == "__main__":
    main()
