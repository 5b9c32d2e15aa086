"""Where a small request's time goes, hop by hop: latency.py's paced GETs (its target, start-up
and client, imported) with every read, write and event-loop wait of the client, the relays and
the target recorded for a second by ``perf record`` (the ``raw_syscalls`` tracepoints: no
ptrace stop per call, as strace makes), then each request followed through them.

A keep-alive connection carries one request at a time, so the i-th request of a connection is
its i-th write, its i-th read at the other end, and so on: each request is chained from the
client's write by taking, at every step, the first matching call after the previous step's
(the server's read of it on its front socket, the server's next tunnel write, the agent's next
write to that stream's target socket, ...). The hops are the differences. Which target socket
serves which client connection: the k-th connection opened (local port order, see
:func:`connected`) opened the k-th stream (run_row opens and warms its connections one after the
other), whose target socket is the k-th the agent opened; the floor's relays are paired the
same way.

For the hops where a process takes in a batch (the server reading the clients' requests, the
agent writing a tunnel record's requests to their targets, the server writing an answer record's
answers to their clients), each request's **position** is how many calls of the same kind on
the same sockets the process made before it since its loop last woke (``epoll_pwait``): what it
waited for inside the turn. ``--ways``: ``tunnel`` (Host-routed), ``tunnel-connect``, ``floor``.
``--sched`` also records the whole machine's scheduler events for the same second and cuts the
receiving relay's time at those batched writes into on-CPU work (the interpreter's, each kind of
syscall's) and time off CPU (preempted, asleep, woken but waiting): see sched_split.py.
Needs ``perf`` and the right to trace (root, or ``perf_event_paranoid`` ≤ 1 with tracefs).

    .venv/bin/python benchmarks/hops.py --rates 1000,4000 --output /tmp/hops.json

``--request varied`` sends latency.py's varied requests (``/ping?n=I``: each parsed and routed
anew). The relays are ``python -m ravenproxy`` run in the current directory: to trace another
checkout's, run this script from that checkout (``cd ../other && python /path/to/hops.py``).

Tracing costs every process ~1-2 µs a call: a traced row's latencies read ~5-15 % above an
untraced one's; compare rows of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import latency
import sched_split

# x86-64 numbers: read, readv, recvfrom, recvmsg / write, writev, sendto, sendmsg / the loop's
# epoll_pwait / epoll_wait (the sessions' readiness probe).
KINDS = {0: "r", 19: "r", 45: "r", 47: "r", 1: "w", 20: "w", 44: "w", 46: "w"}
TURN, PROBE = 281, 232
FILTER = " || ".join(f"id == {nr}" for nr in [*KINDS, TURN, PROBE])
WAYS = ("tunnel", "tunnel-connect", "floor")


@dataclass(frozen=True)
class Call:
    start: float  # s, perf's clock
    end: float
    nr: int
    fd: int
    ret: int
    tid: int = 0

    @property
    def kind(self) -> str:
        return KINDS.get(self.nr, "")


def probe_answers(cs: Sequence[Call], n: int) -> dict[str, float]:
    """Per request: the probes that said "more input" (``probes_more``) and "none"
    (``probes_empty``), and of these the ones that followed a "none" in the same loop turn
    (``probes_empty_again``: what keeping a "none" until the turn's end would save)."""
    more = empty = again = 0
    said_empty = False
    for c in cs:
        if c.nr == TURN:
            said_empty = False
        elif c.nr == PROBE:
            if c.ret > 0:
                more += 1
            else:
                empty += 1
                again += said_empty
                said_empty = True
    return {
        "probes_more": round(more / n, 2),
        "probes_empty": round(empty / n, 2),
        "probes_empty_again": round(again / n, 2),
    }


def parse_script(text: str) -> dict[int, list[Call]]:
    """``perf script -F pid,tid,time,event,trace`` of raw_syscalls sys_enter/sys_exit: each
    thread's enter paired with its exit, by process, in order of their exits."""
    entered: dict[str, tuple[int, int, float]] = {}
    calls: dict[int, list[Call]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 7:
            continue
        pid, _, tid = fields[0].partition("/")
        t = float(fields[1].rstrip(":"))
        nr = int(fields[4])
        if fields[2].endswith("sys_enter:"):
            entered[tid] = (nr, int(fields[5].strip("(,"), 16), t)
        elif tid in entered and fields[5] == "=":
            nr0, fd, t0 = entered.pop(tid)
            if nr0 == nr:
                calls.setdefault(int(pid), []).append(Call(t0, t, nr, fd, int(fields[6]), int(tid)))
    return calls


@dataclass(frozen=True)
class Sock:
    local: int  # port
    remote: int


def sockets(pids: Sequence[int]) -> dict[int, dict[int, Sock]]:
    """Each process's TCP sockets by descriptor (IPv4 loopback: latency.py's)."""
    by_inode = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        by_inode[f[9]] = (int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16))
    out: dict[int, dict[int, Sock]] = {}
    for pid in pids:
        out[pid] = {}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = link[8:-1] if link.startswith("socket:[") else ""
            if inode in by_inode:
                out[pid][int(fd)] = Sock(*by_inode[inode])
    return out


def port_range() -> tuple[int, int]:
    """The ephemeral ports Linux picks from."""
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def connected(
    socks: dict[int, dict[int, Sock]], pid: int, pid2: int, ports: tuple[int, int] = (0, 65535)
) -> list[tuple[int, int]]:
    """(fd of pid, fd of pid2) of every connection pid made to pid2, in the order made: by
    pid's local port, which Linux picks for one destination going up by small steps from a
    per-destination offset, so in order once turned at the widest gap (a wrap of ``ports``,
    the ephemeral range). Socket inodes are no clock: they come in per-CPU batches."""
    theirs = {(s.local, s.remote): fd for fd, s in socks[pid2].items() if s.remote}
    pairs = sorted(
        (s.local, fd, theirs[(s.remote, s.local)])
        for fd, s in socks[pid].items()
        if s.remote and (s.remote, s.local) in theirs
    )
    if len(pairs) > 1:
        span = ports[1] - ports[0] + 1
        gaps = [(pairs[i][0] - pairs[i - 1][0]) % span for i in range(len(pairs))]
        start = max(range(len(pairs)), key=gaps.__getitem__)
        pairs = pairs[start:] + pairs[:start]
    return [(fd, fd2) for _, fd, fd2 in pairs]


Step = tuple[int, int, str]  # pid, fd, kind ("r" or "w")


def paths(way: str, socks: dict[int, dict[int, Sock]], pids: dict[str, int]) -> list[list[Step]]:
    """Per client connection, the calls a request and its answer make, in order."""
    client, one, two, target = pids["client"], pids["relay1"], pids["relay2"], pids["target"]
    ports = port_range()
    fronts = connected(socks, client, one, ports)  # (client fd, relay1 fd), in connection order
    outs = connected(socks, two, target, ports)  # relay2's sockets to the target, in order opened
    out: list[list[Step]] = []
    if way == "floor":  # client -> A -(TLS, one per client connection)-> B -> target
        links = connected(socks, one, two, ports)  # (A's out fd, B's in fd), in order opened
        for (c, a_in), (a_out, b_in), (b_out, _) in zip(fronts, links, outs, strict=True):
            out.append([(client, c, "w"), (one, a_in, "r"), (one, a_out, "w"),
                        (two, b_out, "w"), (two, b_out, "r"), (two, b_in, "w"),
                        (one, a_in, "w"), (client, c, "r")])  # fmt: skip
        return out
    [(s_tun, a_tun)] = connected(socks, one, two)  # the tunnel
    for (c, s), (a, _) in zip(fronts, outs, strict=True):
        out.append([(client, c, "w"), (one, s, "r"), (one, s_tun, "w"), (two, a, "w"),
                    (two, a, "r"), (two, a_tun, "w"), (one, s, "w"), (client, c, "r")])  # fmt: skip
    return out


HOPS = {
    "tunnel": ["client write > server read", "server read > tunnel write",
               "> agent's target write", "target (agent write > read)",
               "agent read > tunnel write", "> server's client write", "> client read"],
    "floor": ["client write > A read", "A read > A write", "> B's target write",
              "target (B write > read)", "B read > B write", "> A's client write",
              "> client read"],
}  # fmt: skip
BATCHED = (1, 3, 6)  # steps where a process takes in a batch: the position is counted there


def times(calls: list[Call], fd: int, kind: str) -> list[float]:
    """When this socket's reads (of data) or writes ended."""
    return [c.end for c in calls if c.fd == fd and c.kind == kind and c.ret > 0]


def chain(starts: Sequence[float], steps: Sequence[Sequence[float]]) -> list[list[float]]:
    """From each start, the first time of each step after the previous one; requests whose
    chain runs past the trace are left out."""
    out = []
    for t in starts:
        row = [t]
        for seq in steps:
            i = bisect.bisect_left(seq, row[-1])
            if i == len(seq):
                break
            row.append(seq[i])
        else:
            out.append(row)
    return out


def position(calls: list[Call], ends: list[float], t: float, fds: set[int], kind: str) -> int:
    """How many ``kind`` calls on ``fds`` the process made in its loop turn before the one that
    ended at ``t`` (``ends``: the calls' end times, in order)."""
    n = 0
    for i in range(bisect.bisect_left(ends, t) - 1, -1, -1):
        c = calls[i]
        if c.nr == TURN:
            break
        n += c.fd in fds and c.kind == kind and c.ret > 0
    return n


def _share(v: list[float], n: int) -> dict[str, Any]:
    return {"share": round(len(v) / n, 3), "p50_us": pct(v, 0.5)}


def pct(xs: Sequence[float], p: float) -> float | None:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(len(s) * p))] * 1e6, 1) if s else None


def followed(
    calls: dict[int, list[Call]], walks: list[list[Step]]
) -> list[tuple[int, list[float]]]:
    """Each request chained through its connection's path: (the path's index, its times)."""
    out = []
    for k, walk in enumerate(walks):
        seqs = [times(calls.get(pid, []), fd, kind) for pid, fd, kind in walk]
        out += [(k, r) for r in chain(seqs[0], seqs[1:])]
    return out


def analyse(
    way: str, calls: dict[int, list[Call]], walks: list[list[Step]], sched: str | None = None,
    roles: dict[int, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Each request chained through its path: per-hop p50/p90 (µs), the positions at the
    batched steps, and per process the calls per request and its share of time awake; with
    ``sched`` (perf script of the scheduler's events, ``roles``: tid → name), each receiving
    relay's batch stretches cut by :mod:`sched_split`."""
    for cs in calls.values():
        cs.sort(key=lambda c: c.end)
    walked = followed(calls, walks)
    rows = [r for _, r in walked]
    names = HOPS["floor" if way == "floor" else "tunnel"]
    out: dict[str, Any] = {"requests": len(rows)}
    total = [r[-1] - r[0] for r in rows]
    out["end_to_end_us"] = {"p50": pct(total, 0.5), "p90": pct(total, 0.9)}
    out["hops_us"] = {
        name: {"p50": pct(d, 0.5), "p90": pct(d, 0.9)}
        for i, name in enumerate(names)
        for d in [[r[i + 1] - r[i] for r in rows]]
    }
    ends = {pid: [c.end for c in cs] for pid, cs in calls.items()}
    batched = {}
    for step in BATCHED:
        pid, _, kind = walks[0][step]
        fds = {walk[step][1] for walk in walks}
        by: dict[int, list[float]] = {}
        for r in rows:
            p = position(calls[pid], ends[pid], r[step], fds, kind)
            by.setdefault(min(p, 5), []).append(r[step] - r[step - 1])
        n = max(len(rows), 1)
        batched[names[step - 1]] = {
            "mean_position": round(sum(k * len(v) for k, v in by.items()) / n, 2),
            "by_position": {
                f"{k}{'+' if k == 5 else ''}": _share(v, n) for k, v in sorted(by.items())
            },
        }
    out["batched"] = batched
    procs = {}
    for role, pid in {"relay1": walks[0][1][0], "relay2": walks[0][3][0]}.items():
        cs = calls.get(pid, [])
        count = Counter(c.kind or c.nr for c in cs)
        waits = [c for c in cs if c.nr == TURN]
        span = (cs[-1].end - cs[0].start) if cs else 0.0
        awake = span - sum(c.end - c.start for c in waits)
        n = max(len(rows), 1)
        procs[role] = {
            "reads": round(count["r"] / n, 2),
            "writes": round(count["w"] / n, 2),
            "loop_turns": round(count[TURN] / n, 2),
            "probes": round(count[PROBE] / n, 2),
            **probe_answers(cs, n),
            "awake_share": round(awake / span, 3) if span else None,
        }
    out["per_request"] = procs
    if sched is not None:
        out["sched"] = sched_cuts(way, calls, walks, walked, sched, roles or {})
    return out


# The batched steps whose receiver writes the batch out, with the step of the write that sent
# it there (the same socket, seen from the receiver: the agent's end of the tunnel, B's link).
RECEIVED = {3: 5, 6: 2}


def kinder(batch: set[int], inbound: set[int]) -> Callable[[Call], str]:
    """A relay's syscall named for sched_split: the loop's wait, the probe, or the socket group
    (``batch``: the sockets the batch is written to; ``inbound``: the one it came in on) and
    r/w, ``(nothing)`` when it moved no data."""

    def kind(c: Call) -> str:
        if c.nr in (TURN, PROBE):
            return "loop wait" if c.nr == TURN else "probe"
        where = "batch" if c.fd in batch else "inbound" if c.fd in inbound else "other"
        return f"{where} {c.kind}" + ("" if c.ret > 0 else " (nothing)")

    return kind


def sched_cuts(
    way: str, calls: dict[int, list[Call]], walks: list[list[Step]],
    walked: list[tuple[int, list[float]]], sched: str, roles: dict[int, str],
) -> dict[str, Any]:  # fmt: skip
    """At each step where a relay writes out a batch, its main thread's time cut: the batch's
    arrival, its first write, each next write (:func:`sched_split.batch_split`)."""
    switches, wakeups = sched_split.parse_sched(sched)
    names = HOPS["floor" if way == "floor" else "tunnel"]

    def role(tid: int) -> str:
        return roles.get(tid, "other")

    out = {}
    for step, came in RECEIVED.items():
        pid = walks[0][step][0]
        mine = [c for c in calls.get(pid, []) if c.tid in (0, pid)]  # the event loop's thread
        ends = [c.end for c in mine]
        batch = {w[step][1] for w in walks}
        inbound = {w[came][1] for w in walks}
        line = sched_split.Timeline(
            sched_split.offs(switches, wakeups, pid), mine, kinder(batch, inbound)
        )
        items = [
            (r[step - 1], r[step], position(mine, ends, r[step], batch, "w"), walks[k][came][1])
            for k, r in walked
        ]
        reads = {fd: times(mine, fd, "r") for fd in inbound}
        out[names[step - 1]] = sched_split.batch_split(line, items, reads, role)
    ours = {tid: name for tid, name in roles.items() if tid != 0}
    out["cpu_share"] = sched_split.placement(switches, ours)
    return out


Traced = tuple[
    str, int, dict[str, Any], Path, dict[int, dict[int, Sock]], dict[str, int], dict[int, str]
]


async def _run(args: argparse.Namespace, base: Path) -> list[Traced]:
    """Every row, traced: (way, rate, the row's summary, perf's data, the sockets, the PIDs,
    with ``--sched`` the threads' names by tid)."""
    procs = latency.Procs(base)
    results: list[Traced] = []
    try:
        tport = latency.start_target(base, procs, args.answer)
        tpid = procs.procs[-1].pid
        host = f"edge-1:{tport}"
        direct = f"127.0.0.1:{tport}"
        ways: dict[str, tuple[int, str, list[int], str | None]] = {}
        if "tunnel" in args.ways or "tunnel-connect" in args.ways:
            t = latency.start_tunnel(base, procs, tport, "new", sys.executable, None)
            await latency._wait_routable(t.http, host)
            if "tunnel" in args.ways:
                ways["tunnel"] = (t.http, host, t.pids, None)
            if "tunnel-connect" in args.ways:
                ways["tunnel-connect"] = (t.http, direct, t.pids, host)
        if "floor" in args.ways:
            fport, fpids = latency.start_floor(base, procs, tport)
            ways["floor"] = (fport, direct, fpids, None)
        for rate in args.rates:
            for way, (port, host_header, relays, connect) in ways.items():
                pids = {"client": os.getpid(), "relay1": relays[0], "relay2": relays[1],
                        "target": tpid}  # fmt: skip
                data = base / f"{way}-{rate}.data"
                seen: dict[str, Any] = {}

                def on_start(pids: dict[str, int] = pids, data: Path = data,
                             seen: dict[str, Any] = seen) -> None:  # fmt: skip
                    seen["socks"] = sockets(list(pids.values()))
                    if args.sched:
                        seen["sched"] = subprocess.Popen(
                            ["perf", "record", "-q", "-a", "-m", "1024",
                             "-e", "sched:sched_switch", "-e", "sched:sched_wakeup",
                             "-o", f"{data}.sched", "--", "sleep", str(args.trace)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        )  # fmt: skip
                    seen["perf"] = subprocess.Popen(
                        ["perf", "record", "-q", "-m", "1024",
                         "-e", "raw_syscalls:sys_enter", "--filter", FILTER,
                         "-e", "raw_syscalls:sys_exit", "--filter", FILTER,
                         "-p", ",".join(map(str, pids.values())), "-o", str(data),
                         "--", "sleep", str(args.trace)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )  # fmt: skip

                row = await latency.run_row(
                    way, port, host_header, rate, args.seconds, args.connections,
                    latency._pids(relays, False), connect, on_start=on_start, warmup=args.warmup,
                    vary=args.request == "varied",
                )  # fmt: skip
                await asyncio.to_thread(seen["perf"].wait)
                roles = {0: "idle"}
                if args.sched:
                    await asyncio.to_thread(seen["sched"].wait)
                    roles |= {seen["perf"].pid: "perf", seen["sched"].pid: "perf"}
                    roles |= threads(pids)
                results.append((way, rate, row.summary(), data, seen["socks"], pids, roles))
    finally:
        procs.stop()
    return results


def threads(pids: dict[str, int]) -> dict[int, str]:
    """Every thread of these processes, named by its process's role."""
    out = {}
    for role, pid in pids.items():
        for tid in os.listdir(f"/proc/{pid}/task"):
            out[int(tid)] = role
    return out


def _script(data: Path, fields: str) -> str:
    return subprocess.run(
        ["perf", "script", "-i", str(data), "-F", fields],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def report(
    way: str, rate: int, row: dict[str, Any], data: Path,
    socks: dict[int, dict[int, Sock]], pids: dict[str, int], roles: dict[int, str],
) -> dict[str, Any]:  # fmt: skip
    """One traced row's figures (perf's data read back, the requests followed)."""
    script = _script(data, "pid,tid,time,event,trace")
    sched_data = data.with_name(data.name + ".sched")
    sched = _script(sched_data, "tid,cpu,time,event,trace") if sched_data.exists() else None
    result = {"way": way, "rate": rate, "row": row}
    calls = parse_script(script)
    result.update(analyse(way, calls, paths(way, socks, pids), sched, roles))
    shown = ("way", "rate", "requests", "end_to_end_us", "hops_us")
    print(json.dumps({k: result[k] for k in shown}), file=sys.stderr)
    return result


def parser() -> argparse.ArgumentParser:
    """The command line (a function: the tests read it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1000, 4000])  # fmt: skip
    parser.add_argument("--ways", type=lambda s: s.split(","), default=list(WAYS))
    parser.add_argument("--seconds", type=float, default=4.0, help="per row (4)")
    parser.add_argument("--trace", type=float, default=1.0, help="seconds traced per row (1)")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--output", default="-", help="file, or - for stdout")
    parser.add_argument(
        "--sched", action="store_true",
        help="also record the scheduler (whole machine) and cut each relay's batch stretches"
        " into on-CPU, preempted, asleep and woken-waiting time (sched_split.py)",
    )  # fmt: skip
    latency.add_answer_argument(parser)
    latency.add_request_argument(parser)
    return parser


def main() -> None:
    cli = parser()
    args = cli.parse_args()
    if unknown := set(args.ways) - set(WAYS):
        cli.error(f"unknown ways: {sorted(unknown)}")
    if shutil.which("perf") is None:
        cli.error("perf is not installed")
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-hops-"))
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            traced = runner.run(_run(args, base))
        results = [report(*t) for t in traced]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    text = json.dumps(
        {"benchmark": "hops", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
         "settings": vars(args), "rows": results}, indent=1,
    )  # fmt: skip
    if args.output == "-":
        print(text)
    else:
        Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
