"""Syscalls, context switches and user/system CPU per small request, per relaying process.

benchmarks/instructions.py counts user-space instructions; the kernel's share of a relay's CPU
(syscalls, wake-ups) is not in them. This drives latency.py's small keep-alive GETs (its target,
start-up and client, imported) at a fixed rate through each way to the target and, per relaying
process, reports per request served:

- ``syscalls``: ``strace -c -f -p PID`` attached for the round (every thread; an sshd's
  per-connection children included), by kind, and the ``errors`` strace counted (EAGAIN reads);
- ``ctxt``: voluntary and involuntary context switches (``/proc/PID/status``, threads summed);
- ``utime_us`` / ``stime_us``: user and system CPU (``/proc/PID/stat``).

strace stops the process at every syscall, so the CPU and context switches are taken in a
separate round of the same requests with no strace attached (``--rounds`` of each).

Ways (``--ways``, default all): ``tunnel`` (Host-routed: client → server front → mTLS WebSocket
→ agent → target), ``tunnel-connect`` (CONNECT once per connection, then bytes), ``base`` and
``base-connect`` (the same through ``--baseline DIR``'s checkout), ``ssh`` (sshd's
per-connection processes + ``ssh -R``), ``floor`` (benchmarks/floor_relay.py's two relays).

    .venv/bin/python benchmarks/syscalls.py --baseline ../base --output /tmp/s.json
    .venv/bin/python benchmarks/syscalls.py --ways tunnel,ssh --requests 1000 --output -
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import (
    CLK_TCK,
    Procs,
    _commit,
    _interpreter,
    _machine,
    _pids,
    _wait_routable,
    add_answer_argument,
    run_row,
    start_floor,
    start_ssh,
    start_target,
    start_tunnel,
    write_result,
)

RESULTS = Path(__file__).resolve().parent / "results" / "syscalls.json"
V = TypeVar("V")
_ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(\d+)?\s*(\w+)\s*$")


class Traced:
    """``strace -c -f`` attached to some processes for one round."""

    def __init__(self, base: Path, pids: list[int]) -> None:
        self.files = {pid: base / f"strace-{pid}-{time.monotonic_ns()}.txt" for pid in pids}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for pid, out in self.files.items():
            self.procs.append(
                subprocess.Popen(
                    ["strace", "-c", "-f", "-qq", "-o", str(out), "-p", str(pid)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
        time.sleep(0.5)  # attached to every thread before the first timed request

    def stop(self) -> dict[int, dict[str, list[int]]]:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            proc.wait(30)
        return {pid: _parse(out.read_text()) for pid, out in self.files.items()}


def _parse(text: str) -> dict[str, list[int]]:
    """strace -c's table: {syscall: [calls, errors]}."""
    out: dict[str, list[int]] = {}
    for line in text.splitlines():
        m = _ROW.match(line)
        if m and m.group(3) != "total":
            out[m.group(3)] = [int(m.group(1)), int(m.group(2) or 0)]
    return out


def _threads(pid: int) -> list[Path]:
    try:
        return list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []


def sample(pids: list[int]) -> dict[int, list[int]]:
    """Per process: [voluntary ctxt, involuntary ctxt, utime ticks, stime ticks]."""
    out = {}
    for pid in pids:
        vol = invol = 0
        for task in _threads(pid):
            try:
                status = (task / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            utime, stime = int(fields[11]), int(fields[12])
        except (OSError, IndexError, ValueError):
            utime = stime = 0
        out[pid] = [vol, invol, utime, stime]
    return out


def _update(into: dict[int, V], source: Callable[[], dict[int, V]]) -> None:
    """``into`` updated with what ``source`` answers when called (a round's start or end)."""
    into.update(source())


class Way:
    def __init__(
        self, name: str, port: int, host: str, pids: Callable[[], list[int]], roles: list[str]
    ) -> None:
        self.name, self.port, self.host, self.pids, self.roles = name, port, host, pids, roles
        self.connect = host if name.endswith("connect") else None


def _role(way: Way, pid: int, index: int) -> str:
    if way.name == "ssh":  # sshd's listener, its per-connection children, ssh: by name
        try:
            return f"{Path(f'/proc/{pid}/comm').read_text().strip()}-{pid}"
        except OSError:
            return f"ssh-{pid}"
    return way.roles[index] if index < len(way.roles) else f"{way.roles[-1]}-{pid}"


async def measure(args: argparse.Namespace, ways: list[Way], base: Path) -> list[dict[str, Any]]:
    for way in ways:
        if way.name.startswith(("tunnel", "base")):
            await _wait_routable(way.port, way.host)
    rows = []
    for r in range(args.rounds):
        order = ways if r % 2 == 0 else ways[::-1]
        for way in order:
            # Pass 1: syscalls under strace.
            pids = way.pids()
            traced = Traced(base, pids)
            counts: dict[int, dict[str, list[int]]] = {}
            row = await run_row(
                way.name, way.port, way.host, args.rate, args.requests / args.rate,
                args.connections, connect=way.connect, on_start=traced.start,
                on_stop=functools.partial(_update, counts, traced.stop),
            )  # fmt: skip
            served = len(row.latencies)
            # Pass 2: CPU and context switches, nothing attached.
            before: dict[int, list[int]] = {}
            after: dict[int, list[int]] = {}
            row2 = await run_row(
                way.name, way.port, way.host, args.rate, args.requests / args.rate,
                args.connections, connect=way.connect,
                on_start=functools.partial(_update, before, functools.partial(sample, pids)),
                on_stop=functools.partial(_update, after, functools.partial(sample, pids)),
            )  # fmt: skip
            served2 = len(row2.latencies)
            entry: dict[str, Any] = {
                "round": r + 1,
                "way": way.name,
                "requests": [served, served2],
                "errors": (row.errors + row2.errors)[:3],
                "per_request": {},
            }
            for i, pid in enumerate(pids):
                calls = counts.get(pid, {})
                zero = [0, 0, 0, 0]
                d = [
                    a - b for a, b in zip(after.get(pid, zero), before.get(pid, zero), strict=True)
                ]
                per: dict[str, Any] = {
                    "syscalls": round(sum(c for c, _ in calls.values()) / max(served, 1), 2),
                    "by_kind": {
                        k: round(c / max(served, 1), 2)
                        for k, (c, _) in sorted(calls.items(), key=lambda kv: -kv[1][0])
                        if c / max(served, 1) >= 0.01
                    },
                    "errors": {k: round(e / max(served, 1), 2) for k, (_, e) in calls.items() if e},
                    "ctxt_voluntary": round(d[0] / max(served2, 1), 2),
                    "ctxt_involuntary": round(d[1] / max(served2, 1), 2),
                    "utime_us": round(d[2] / CLK_TCK / max(served2, 1) * 1e6, 1),
                    "stime_us": round(d[3] / CLK_TCK / max(served2, 1) * 1e6, 1),
                }
                entry["per_request"][_role(way, pid, i)] = per
            rows.append(entry)
            brief = {
                role: (p["syscalls"], p["ctxt_voluntary"], p["utime_us"], p["stime_us"])
                for role, p in entry["per_request"].items()
            }
            print(f"round {r + 1} {way.name}: {brief}", file=sys.stderr)
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("strace") is None:
        raise SystemExit("strace is not installed")
    machine = _machine()
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-syscalls-"))
    procs = Procs(base)
    wanted = args.ways.split(",")
    ways: list[Way] = []
    try:
        target_port = start_target(base, procs, args.answer)
        host = f"edge-1:{target_port}"
        checkouts: list[tuple[str, str, Path | None]] = [("tunnel", sys.executable, None)]
        if args.baseline is not None:
            python = str(args.baseline / ".venv" / "bin" / "python")
            checkouts.append(("base", python, args.baseline))
            machine["baseline"] = str(args.baseline)
            machine["baseline_commit"] = _commit(args.baseline)
            machine["baseline_python"] = _interpreter(python)
        for name, python, cwd in checkouts:
            if name not in wanted and f"{name}-connect" not in wanted:
                continue
            tunnel = start_tunnel(base, procs, target_port, name, python, cwd)
            for way in (name, f"{name}-connect"):
                if way in wanted:
                    ways.append(
                        Way(way, tunnel.http, host, _pids(tunnel.pids, False), ["server", "agent"])
                    )
        if "ssh" in wanted:
            rports, ssh_pids, version = start_ssh(base, procs, target_port)
            machine["openssh"] = version
            # sshd's listener, its per-connection children (they relay) and ssh.
            ways.append(Way("ssh", rports[0], host, _pids(ssh_pids, True), ["sshd", "ssh"]))
        if "floor" in wanted:
            fport, floor_pids = start_floor(base, procs, target_port)
            ways.append(Way("floor", fport, host, _pids(floor_pids, False), ["relay-a", "relay-b"]))
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rows = runner.run(measure(args, ways, base))
    finally:
        procs.stop()
        shutil.rmtree(base, ignore_errors=True)
    machine["loadavg_at_end"] = list(os.getloadavg())
    return {
        "benchmark": "syscalls",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "settings": {
            "requests_per_round": args.requests,
            "rate": args.rate,
            "connections": args.connections,
            "answer": args.answer,
            "rounds": args.rounds,
            "request": "GET /ping (keep-alive) (the answers: see answer)",
        },
        "rounds": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="per round, way and pass")
    parser.add_argument("--rate", type=int, default=500, help="req/s")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--ways", default="tunnel,tunnel-connect,base,base-connect,ssh,floor", help="subset"
    )
    parser.add_argument("--baseline", type=Path, help="another checkout (with its .venv)")
    parser.add_argument("--output", default=str(RESULTS), help="file, or - for stdout")
    add_answer_argument(parser)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run()'s cleanup still runs
    write_result(run(args), args.output)


if __name__ == "__main__":
    main()
