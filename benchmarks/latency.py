"""Added latency of the L7 path: small GETs at fixed rates, direct vs the tunnel vs ``ssh -R``.

One run starts a tiny HTTP target (its own process: asyncio + uvloop, keep-alive, small answers
that differ as a metrics endpoint's do unless ``--answer same``), ``ravenproxy server`` and
``ravenproxy agent`` through the CLI, a private ``sshd`` with an ``ssh -R`` forward to the same
target, and then, for each rate, sends GETs on an *open-loop*
schedule (request i is due at ``t0 + i / rate``; its latency is measured from when it was due,
so a stall is charged to every request it delays — no coordinated omission) over a pool of
keep-alive connections:

- ``direct``: client → target;
- ``ssh``: client → sshd's remote-forwarded port → ssh client → target (aes128-gcm), the ssh
  client running a remote command (a session, so sshd sets TCP_NODELAY: see start_ssh);
- ``ssh-N`` (with ``--ssh-n``): the same forwarded by ``ssh -N`` (no session): sshd leaves
  Nagle on, and the row stalls 40-85 ms whenever the channels' window adjusts go out;
- ``tunnel``: client → server HTTP front (``Host: edge-1:PORT``) → mTLS WebSocket tunnel →
  agent → target;
- ``tunnel-base`` (with ``--baseline DIR``): the same through another checkout's server and
  agent (``DIR/.venv/bin/python``), for a before/after in one run; ``tunnel-connect-base``
  likewise for ``tunnel-connect`` (unless ``--no-connect``);
- ``tunnel-connect``: each client connection first sends ``CONNECT edge-1:PORT`` to the same
  front, then its GETs go through that one tunnel stream as bytes (the way an egress dialer such
  as kube-apiserver's uses the proxy, and the way ``ssh -R`` forwards: nothing parsed per
  request). Against ``tunnel`` it shows what parsing and routing every request costs;
- ``floor`` (with ``--floor``): two minimal uvloop relays with mTLS between them
  (``floor_relay.py``: no framing, no streams, one TLS connection per client connection), the
  least two Python processes relaying with TLS cost.

Each relay's CPU per request is the user+system time of its processes (server + agent; sshd
with its per-connection children + ssh), from ``/proc/PID/stat`` over the row, divided by the
requests served. ``relay_cpu_per_client_cpu`` divides it by this client's own CPU per request
in the same row (the client is the same code in every row, so its CPU moves with the machine's
speed as the relays' does). With the same code on both sides (A/A, 1 000 req/s) the relay CPU
per request read -4 to +10 % apart (+4 to +16 % in all four rounds of one run), the ratio +1.5 to
+3.0 %. Each round has its own; a row's is the median of its rounds'. ``added_latency`` gives it
beside the raw CPU, over the ssh row's (``vs_ssh``) and, for ``tunnel``, over ``tunnel-base``'s
(``vs_base``, also round by round). Its limit: the client's CPU holds its own pacing and its
reads of the answers, so a relay change that changes how the answers arrive (more or fewer per
read: batching) moves the yardstick too.

Per rate the rows run ``--rounds`` times (default 2): direct, ssh, tunnel-base,
tunnel-connect-base, floor, tunnel, tunnel-connect in even rounds, the other way round in odd
ones, each row after ``--warmup`` seconds (default 1) at its rate, untimed. Run once in a fixed
order, the rows carried a row-order effect (of two tunnel rows, the one run second won). A
row's figures pool its rounds (percentiles of all the samples, CPU total / requests total); each
round's own are in ``rows[].rounds``.

    .venv/bin/python benchmarks/latency.py              # 1 000, 2 000 and 4 000 req/s, 2 rounds
    .venv/bin/python benchmarks/latency.py --baseline /work/other-checkout
    .venv/bin/python benchmarks/latency.py --rates 500 --seconds 2 --rounds 1 --output -  # a look

Results (p50/p90/p99/max and CPU µs/request per row, and the added p50/p99 = path - direct) go
to ``benchmarks/results/latency.json``, the plot to ``latency.png`` beside it. Loopback numbers
are noisy and every process shares the same cores: compare rows within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import email.utils
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import uvloop

from ravenproxy.client import open_tunnel
from ravenproxy.pki import init_pki

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sshrow import describe, forward_argv, ssh_files, sshd_attempts

SCRIPT = Path(__file__).resolve()
HERE = SCRIPT.parent
RESULTS = HERE / "results" / "latency.json"
SSH_CIPHER = "aes128-gcm@openssh.com"
CLK_TCK = os.sysconf("SC_CLK_TCK")
BODY = b"ok"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY
ANSWERS = ("varied", "same")
REQUESTS = ("same", "varied")
# ``--answer varied``: a metrics endpoint's answers differ from one to the next (a Date per
# second, a body and so a Content-Length that change every scrape), and the server's front
# re-derives what it forwards for each new head; identical answers (``same``, the figures
# before 2026-12-04) let it reuse the last one's, which real traffic rarely allows.
VARIED_LENGTHS = 7  # body lengths 2..8 in turn: consecutive answers' Content-Lengths differ

INVENTORY = """\
apiVersion: v1
kind: Node
metadata: {name: edge-1, labels: {raven.openyurt.io/gateway: gw-edge}}
status:
  addresses: [{type: InternalIP, address: 127.0.0.1}]
"""
# The target is plain HTTP, so it is not the node's kubelet port (the server re-originates TLS
# to that one): the agent admits it with --allow.


# -- the target (its own process: ``latency.py --target PORTFILE``) ---------------------------
class _Answers:
    """The target's answers, by second: ``same``, RESPONSE each time; ``varied``, a Date
    (IMF-fixdate, RFC 9110 §6.6.1) and a body of 2..8 bytes in turn. The second's answers are
    built once when it starts, so an answer costs the target a list index (it shares the
    cores with what is measured)."""

    def __init__(self, varied: bool) -> None:
        self.varied = varied
        self.second = -1
        self.answers = [RESPONSE]

    def now(self) -> list[bytes]:
        if self.varied:
            second = int(time.time())
            if second != self.second:
                self.second = second
                self.answers = varied_answers(second)
        return self.answers


def varied_answers(second: int) -> list[bytes]:
    date = email.utils.formatdate(second, usegmt=True).encode()
    out = []
    for n in range(VARIED_LENGTHS):
        body = BODY + b"." * n
        out.append(
            b"HTTP/1.1 200 OK\r\nDate: %s\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (date, len(body), body)
        )
    return out


class _Target(asyncio.Protocol):
    """Answers every complete request head with a small response (keep-alive): ``answers``'
    of the second, each connection going through them in turn."""

    def __init__(self, answers: _Answers) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.answers = answers
        self.count = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        answers = self.buf.count(b"\r\n\r\n")
        if answers:
            self.buf = self.buf[self.buf.rfind(b"\r\n\r\n") + 4 :]
            assert self.transport is not None
            now = self.answers.now()
            if len(now) == 1:
                self.transport.write(now[0] * answers)
                return
            count = self.count
            self.count = count + answers
            self.transport.write(b"".join(now[i % len(now)] for i in range(count, count + answers)))


async def _target_main(port_file: Path, answer: str) -> None:
    loop = asyncio.get_running_loop()
    answers = _Answers(answer == "varied")
    server = await loop.create_server(lambda: _Target(answers), "127.0.0.1", 0, backlog=1024)
    with open(port_file, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


# -- the client -----------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    rate: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    cpu_seconds: float | None = None
    cpu_by_pid: list[float] = field(default_factory=list)
    noise: Noise | None = None
    due: list[float] = field(default_factory=list)  # each sample's due time, s into the row

    @classmethod
    def pooled(cls, rows: list[Row]) -> Row:
        """One row of several rounds' runs of the same path and rate: all their samples and
        errors, their times and CPU added up (by process when every round saw the same
        processes), so the percentiles are over all the samples and the CPU per request is
        total CPU / total requests."""
        first = rows[0]
        out = cls(first.name, first.rate, sum(r.seconds for r in rows))
        for r in rows:
            out.latencies += r.latencies
            out.due += r.due
            out.errors += r.errors
            out.elapsed += r.elapsed
        cpus = [r.cpu_seconds for r in rows]
        out.cpu_seconds = None if None in cpus else sum(c for c in cpus if c is not None)
        noises = [r.noise for r in rows if r.noise is not None]
        if len(noises) == len(rows):
            out.noise = Noise(
                sum(n.client for n in noises),
                sum(n.others for n in noises),
                sum(n.steal for n in noises),
            )
        if len({len(r.cpu_by_pid) for r in rows}) == 1:
            out.cpu_by_pid = [sum(col) for col in zip(*(r.cpu_by_pid for r in rows), strict=True)]
        return out

    def summary(self) -> dict[str, Any]:
        """The row's figures. Beside the percentiles over every sample, a stall is named (none
        dropped): ``over_10x_p50`` requests took more than 10 times the p50, and the slowest was due
        ``max_at_s`` seconds into its round's timed part."""
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            if not lat:
                return None
            return round(lat[min(len(lat) - 1, int(len(lat) * p))] * 1000, 3)

        return {
            "path": self.name,
            "rate_target": self.rate,
            "rate_achieved": round(len(lat) / self.elapsed, 1) if self.elapsed else 0,
            "requests": len(lat),
            "errors": len(self.errors),
            "error_samples": self.errors[:3],
            "p50_ms": pct(0.50),
            "p90_ms": pct(0.90),
            "p99_ms": pct(0.99),
            "max_ms": round(lat[-1] * 1000, 3) if lat else None,
            "over_10x_p50": sum(1 for x in lat if x > 10 * lat[len(lat) // 2]) if lat else 0,
            "max_at_s": (
                round(self.due[self.latencies.index(lat[-1])], 3)
                if lat and len(self.due) == len(lat)
                else None
            ),
            "relay_cpu_us_per_request": (
                round(self.cpu_seconds / len(lat) * 1e6, 1)
                if self.cpu_seconds is not None and lat
                else None
            ),
            "relay_cpu_us_per_request_by_process": [
                round(cpu / len(lat) * 1e6, 1) for cpu in self.cpu_by_pid if lat
            ],
            **(self.noise.summary(len(lat), self.elapsed) if self.noise is not None else {}),
            "relay_cpu_per_client_cpu": self.relay_per_client(),
        }

    def relay_per_client(self) -> float | None:
        """The relays' CPU over this client's in the same row (both per request, so the
        requests cancel): the client is the same code in every row, so its CPU is the row's
        yardstick of the machine's speed (benchmarks/README, latency.py's "Relay CPU over the
        client's"). None when either is missing (no relay processes, no noise sample, no
        requests, a client that read no CPU)."""
        if self.cpu_seconds is None or self.noise is None or self.noise.client <= 0:
            return None
        return round(self.cpu_seconds / self.noise.client, 3) if self.latencies else None


@dataclass
class Noise:
    """The CPU around a row that is not the relay's: this client's own, and the machine's
    other processes' (not this benchmark's) and steal, as cores over the row. The p99 at a high
    rate moves with them (2 cores shared by client, target, relays): a row whose others' share
    or steal is up is a noisy row, not a slower relay."""

    client: float = 0.0
    others: float = 0.0
    steal: float = 0.0
    busy: float = 0.0
    ours: dict[int, float] = field(default_factory=dict)

    @classmethod
    def sample(cls, ours: list[int]) -> Noise:
        """Totals so far: this process, the machine's busy time, steal, each of ``ours``."""
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        # user nice system idle iowait irq softirq steal (USER_HZ ticks)
        busy = sum(int(fields[i]) for i in (0, 1, 2, 5, 6)) / CLK_TCK
        # This process's CPU to the nanosecond (the scheduler's runtime), not os.times()'s
        # 10 ms ticks: a 5 s row at 1 000 req/s holds ~50 of the client's ticks, so a tick was
        # 2 % of relay_cpu_per_client_cpu's yardstick.
        own = time.process_time()
        mine = {pid: cpu_seconds([pid]) for pid in ours}
        return cls(own, 0.0, int(fields[7]) / CLK_TCK, busy, mine)

    def since(self, before: Noise) -> Noise:
        """The row's: a process of ours counts only over both samples (one that ended in
        between would otherwise hand all its CPU to the others)."""
        client = self.client - before.client
        mine = sum(cpu - before.ours[pid] for pid, cpu in self.ours.items() if pid in before.ours)
        others = self.busy - before.busy - client - mine
        return Noise(client, others, self.steal - before.steal)

    def summary(self, served: int, elapsed: float) -> dict[str, Any]:
        return {
            "client_cpu_us_per_request": round(self.client / served * 1e6, 1) if served else None,
            "others_cpu_cores": round(max(self.others, 0.0) / elapsed, 3) if elapsed else None,
            "steal_cores": round(self.steal / elapsed, 3) if elapsed else None,
        }


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    status = int(head[9:12])
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            length = int(value)
        elif key.strip().lower() == b"transfer-encoding":
            raise RuntimeError("unexpected chunked response")
    if length:
        await reader.readexactly(length)
    return status


async def run_row(
    name: str,
    port: int,
    host_header: str,
    rate: int,
    seconds: float,
    connections: int,
    pids: Callable[[], list[int]] | None = None,
    connect: str | None = None,
    on_start: Callable[[], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    warmup: float = 0.0,
    ours: Callable[[], list[int]] | None = None,
    vary: bool = False,
) -> Row:
    """One row. ``connect``: open every connection with ``CONNECT connect`` first (a byte
    tunnel). ``warmup``: seconds of the same schedule at the same rate over the same
    connections before the timed part, neither timed nor in the CPU (its errors are kept).
    ``on_start`` is called once the connections are warmed up (just before the timed part),
    ``on_stop`` when the last answer is in (benchmarks/instructions.py's switch).
    ``ours``: every process of the benchmark but this one (target, relays): the row's
    :class:`Noise` is measured around them. ``vary``: request i asks for ``/ping?n=i`` (a
    request that differs from the last: parsed and routed anew), not ``/ping`` every time."""
    row = Row(name, rate, seconds)
    request = f"GET /ping HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: latency\r\n\r\n".encode()
    conns = []
    for _ in range(connections):
        if connect is None:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        else:
            reader, writer = await open_tunnel("127.0.0.1", port, connect)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append((reader, writer))
    # Warm up every connection (and, through the tunnel, its stream) outside the timed part.
    for reader, writer in conns:
        writer.write(request)
        await _read_response(reader)
    if warmup > 0:
        scratch = Row(name, rate, warmup)
        await _paced(conns, request, scratch, vary)
        row.errors += [f"warm-up: {e}" for e in scratch.errors]
    if on_start is not None:
        on_start()
    before = {pid: cpu_seconds([pid]) for pid in pids()} if pids is not None else {}
    noise = Noise.sample(ours()) if ours is not None else None
    await _paced(conns, request, row, vary)
    if ours is not None and noise is not None:
        row.noise = Noise.sample(ours()).since(noise)
    if on_stop is not None:
        on_stop()
    if pids is not None:
        after = {pid: cpu_seconds([pid]) for pid in pids()}
        row.cpu_by_pid = [after[pid] - before.get(pid, 0.0) for pid in after]
        row.cpu_seconds = sum(row.cpu_by_pid)
    for _, writer in conns:
        writer.close()
    return row


async def _paced(
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]],
    request: bytes,
    row: Row,
    vary: bool = False,
) -> None:
    """``row.rate`` requests a second for ``row.seconds`` over ``conns`` on an open-loop
    schedule; latencies (and when each was due) and errors into ``row``, the timed window
    into ``row.elapsed``: from the first request's due time to the schedule's end or the last
    answer, whichever is later (not the lead-in before the first is due)."""
    rate, connections = row.rate, len(conns)
    total = int(rate * row.seconds)
    now = time.perf_counter  # uvloop's loop.time() has millisecond resolution
    t0 = now() + 0.05
    path_end = request.index(b" HTTP/1.1")  # ``vary``: the query goes in before it
    head, tail = request[:path_end], request[path_end:]

    async def worker(c: int) -> None:
        reader, writer = conns[c]
        for i in range(c, total, connections):
            due = t0 + i / rate
            delay = due - now()
            if delay > 0:
                await asyncio.sleep(delay)
                # On time: measure from the send (the timer's own lateness is not the path's);
                # behind schedule: from the due time, so queueing behind a slow answer counts.
                due = now()
            try:
                writer.write(b"%b?n=%d%b" % (head, i, tail) if vary else request)
                status = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, RuntimeError, ValueError) as exc:
                row.errors.append(repr(exc))
                return
            if status != 200:
                row.errors.append(f"HTTP {status}")
                continue
            row.latencies.append(now() - due)
            row.due.append(i / rate)

    await asyncio.gather(*(worker(c) for c in range(connections)))
    row.elapsed = max(total / rate, now() - t0)


# -- processes ------------------------------------------------------------------------------
def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (a gone one counts 0)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return ticks / CLK_TCK


def with_descendants(pids: list[int]) -> list[int]:
    """These processes and all their descendants (sshd's per-connection children)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, todo = set(pids), list(pids)
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        with (self.base / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def stop_one(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the session we started; empty → ESRCH


def _wait_port_file(path: Path, proc: subprocess.Popen[bytes], seconds: float = 10.0) -> int:
    deadline = time.monotonic() + seconds
    while True:
        if path.exists() and path.read_text():
            return int(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError(f"{path.stem} exited")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{path.stem} did not start within {seconds:g} s")
        time.sleep(0.05)


async def _wait_routable(http: int, host: str, seconds: float = 20.0) -> None:
    """Until a GET through the front at ``http`` for ``host`` answers 200: the server listens
    and the agent's tunnel is up (``seconds``: how long a start may take)."""
    last = ""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", http)
            writer.write(f"GET /ping HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            status = await asyncio.wait_for(_read_response(reader), 5)
            writer.close()
            if status == 200:
                return
            last = f"HTTP {status}"
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"tunnel not routable within {seconds:g} s: {last}")


def _machine() -> dict[str, Any]:
    def version(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    commit = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(HERE), "diff", "--quiet", "HEAD"], check=False
    ).returncode
    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": _interpreter(sys.executable),
        "uvloop": version("uvloop"),
        "websockets": version("websockets"),
        "httptools": version("httptools"),
        "git_commit": commit,
        "git_tracked_changes": dirty != 0,
        "loadavg_at_start": list(os.getloadavg()),
    }


@dataclass
class Tunnel:
    name: str
    http: int
    pids: list[int]


def start_target(base: Path, procs: Procs, answer: str = "varied") -> int:
    port_file = base / "target.port"
    target = procs.start(
        "target", [sys.executable, str(SCRIPT), "--target", str(port_file), "--answer", answer]
    )
    return _wait_port_file(port_file, target)


def start_tunnel(
    base: Path,
    procs: Procs,
    target_port: int,
    name: str,
    python: str,
    cwd: Path | None,
    profile: Path | None = None,
    wrap: Callable[[str], list[str]] | None = None,
) -> Tunnel:
    """``ravenproxy server`` + ``ravenproxy agent`` run by ``python`` (in ``cwd``), under
    cProfile into ``profile/{server,agent}.prof`` when given; ``wrap(role)`` is put before
    the command line (a valgrind's, benchmarks/instructions.py's), so the PID is still its."""
    prefix = wrap if wrap is not None else (lambda role: [])
    certs = base / f"certs-{name}"
    init_pki(certs, ("localhost", "127.0.0.1"), ("edge-1",))
    inventory = base / "inventory.yaml"
    inventory.write_text(INVENTORY)
    http, tunnel = free_port(), free_port()
    server = procs.start(
        f"server-{name}",
        [
            *prefix("server"), python, *_profiled(profile, "server"), "-m", "ravenproxy", "server",
            "--inventory", str(inventory),
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / "server.crt"),
            "--key-file", str(certs / "server.key"),
            "--tunnel-addr", f"127.0.0.1:{tunnel}",
            "--http-addr", f"127.0.0.1:{http}",
            "--https-addr", f"127.0.0.1:{free_port()}",
            "--metrics-addr", f"127.0.0.1:{free_port()}",
            "--health-addr", f"127.0.0.1:{free_port()}",
            "--log-level", "WARNING",
        ],
        cwd,
    )  # fmt: skip
    agent = procs.start(
        f"agent-{name}",
        [
            *prefix("agent"), python, *_profiled(profile, "agent"), "-m", "ravenproxy", "agent",
            "--node-name", "edge-1",
            "--server-addr", f"wss://127.0.0.1:{tunnel}",
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / "edge-1.crt"),
            "--key-file", str(certs / "edge-1.key"),
            "--inventory", str(inventory),
            "--allow", f"127.0.0.1:{target_port}",
            "--log-level", "WARNING",
        ],
        cwd,
    )  # fmt: skip
    return Tunnel(name, http, [server.pid, agent.pid])


def start_floor(
    base: Path,
    procs: Procs,
    target_port: int,
    wrap: Callable[[str], list[str]] | None = None,
    seconds: float = 10.0,
) -> tuple[int, list[int]]:
    """Two ``floor_relay.py`` processes: client → A → (mTLS) → B → target. A stands where the
    server stands, B where the agent does: ``wrap(role)`` (``"server"`` for A, ``"agent"`` for
    B) is put before each command line, as :func:`start_tunnel`'s; ``seconds``: how long each
    may take to listen (under valgrind, on a busy host, over 10 s)."""
    prefix = wrap if wrap is not None else (lambda role: [])
    certs = base / "certs-floor"
    init_pki(certs, ("localhost", "127.0.0.1"), ("edge-1",))
    relay = [sys.executable, str(HERE / "floor_relay.py")]
    b = procs.start(
        "floor-b",
        [*prefix("agent"), *relay, str(base / "floor-b.port"), str(target_port), "--tls-in",
         str(certs / "ca.crt"), str(certs / "server.crt"), str(certs / "server.key")],
    )  # fmt: skip
    b_port = _wait_port_file(base / "floor-b.port", b, seconds)
    a = procs.start(
        "floor-a",
        [*prefix("server"), *relay, str(base / "floor-a.port"), str(b_port), "--tls-out",
         str(certs / "ca.crt"), str(certs / "edge-1.crt"), str(certs / "edge-1.key")],
    )  # fmt: skip
    return _wait_port_file(base / "floor-a.port", a, seconds), [a.pid, b.pid]


def _profiled(profile: Path | None, role: str) -> list[str]:
    return ["-m", "cProfile", "-o", str(profile / f"{role}.prof")] if profile else []


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_ssh(
    base: Path, procs: Procs, target_port: int, no_session: bool = False
) -> tuple[list[int], list[int], str]:
    """A private sshd (benchmarks/sshrow.py's, as throughput.py's) and ``ssh -R`` forwards to
    the target: one with a remote command (a session), and with ``no_session`` a second one
    with ``-N``. Returns (the forwarded ports, [sshd, ssh, ...], the OpenSSH version).

    Why a session: sshd sets TCP_NODELAY on its end of the connection only when a session
    starts (``ssh_packet_set_interactive``), so under ``ssh -N`` its writes to the client are
    Nagle'd. Each time the forwarded channels send their window adjusts (every 96 KiB a
    channel consumes: at 4 000 req/s over 16 connections, 6 s into a row's traffic, all at
    once), a small write waits for the client's delayed ACK: 40-85 ms for every connection
    (benchmarks/README.md, "The ssh -N stall")."""
    d, port, version = ssh_files(base)
    sshd = None
    for _, argv in sshd_attempts(d):
        sshd = procs.start(f"sshd-{len(procs.procs)}", argv)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sshd.poll() is None and not _port_open(port):
            time.sleep(0.05)
        if _port_open(port):
            break
        procs.stop_one(sshd)
        sshd = None
    if sshd is None:
        raise RuntimeError("sshd did not start (see its logs)")
    rports, pids = [], [sshd.pid]
    for name, session in (("ssh", True), ("ssh-N", False))[: 2 if no_session else 1]:
        rport = free_port()
        argv = forward_argv(port, d / "client_key", SSH_CIPHER, rport, target_port, session)
        ssh = procs.start(name, argv)
        deadline = time.monotonic() + 15
        while not _port_open(rport):
            if ssh.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} -R forward did not come up")
            time.sleep(0.05)
        rports.append(rport)
        pids.append(ssh.pid)
    return rports, pids, version


@dataclass
class Way:
    """One way to the target: its name, the port a client connects to, the Host it sends,
    the processes whose CPU is the relay's (none: direct) and, for a byte tunnel, the
    ``node:port`` each connection CONNECTs to first."""

    name: str
    port: int
    host: str
    pids: Callable[[], list[int]] | None = None
    connect: str | None = None


async def measure(
    args: argparse.Namespace, paths: list[Way], ours: Callable[[], list[int]] | None = None
) -> list[dict[str, Any]]:
    for path in paths:
        if path.name.startswith("tunnel") and path.connect is None:
            await _wait_routable(path.port, path.host)
    rows = []
    for rate in args.rates:
        runs: dict[str, list[tuple[int, Row]]] = {path.name: [] for path in paths}
        for r in range(args.rounds):
            # Every other round the other way round: no row is always the one after another
            # path's busy row, the tunnel and tunnel-base rows swap places.
            order = paths if r % 2 == 0 else paths[::-1]
            for position, path in enumerate(order):
                row = await run_row(
                    path.name,
                    path.port,
                    path.host,
                    rate,
                    args.seconds,
                    args.connections,
                    path.pids,
                    path.connect,
                    warmup=args.warmup,
                    ours=ours,
                    vary=args.request == "varied",
                )
                runs[path.name].append((position, row))
                print(json.dumps({"round": r, **row.summary()}), file=sys.stderr)
        rows += [pooled_summary(runs[path.name]) for path in paths]
    return rows


def pooled_summary(runs: list[tuple[int, Row]]) -> dict[str, Any]:
    """A path's figures at one rate over its rounds (``(position, row)`` each, in round
    order): pooled as :meth:`Row.pooled` does, each round's own in ``rounds``, and
    ``relay_cpu_per_client_cpu`` the median of the rounds' (None if any round has none, as the
    pooled CPU is): a ratio of two of a row's figures is not pooled, a noisy round's does not
    pull the rest."""
    summary = Row.pooled([row for _, row in runs]).summary()
    rounds = [
        {"round": r, "position": position, **row.summary()}
        for r, (position, row) in enumerate(runs)
    ]
    summary["rounds"] = rounds
    ratios = [r["relay_cpu_per_client_cpu"] for r in rounds]
    summary["relay_cpu_per_client_cpu"] = (
        None if None in ratios else round(statistics.median(ratios), 3)
    )
    return summary


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    machine = _machine()
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-latency-"))
    procs = Procs(base)
    ssh_info: dict[str, Any] = {}
    try:
        target_port = start_target(base, procs, args.answer)
        host = f"edge-1:{target_port}"
        paths = [Way("direct", target_port, f"127.0.0.1:{target_port}")]
        if not args.no_ssh:
            try:
                rports, ssh_pids, version = start_ssh(base, procs, target_port, args.ssh_n)
            except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                ssh_info = {"error": str(exc)}
                print(f"ssh row skipped: {exc}", file=sys.stderr)
            else:
                ssh_info = {
                    "openssh": version,
                    "cipher": SSH_CIPHER,
                    "ssh": describe(session=True),
                }
                if args.ssh_n:
                    ssh_info["ssh-N"] = describe(session=False)
                for name, rport, pid in zip(("ssh", "ssh-N"), rports, ssh_pids[1:], strict=False):
                    # sshd's per-connection children are both rows' (the other's idles).
                    pids = _pids([ssh_pids[0], pid], True)
                    paths.append(Way(name, rport, f"127.0.0.1:{target_port}", pids))
        if args.baseline is not None:
            python = str(args.baseline / ".venv" / "bin" / "python")
            old = start_tunnel(base, procs, target_port, "base", python, args.baseline)
            paths.append(Way("tunnel-base", old.http, host, _pids(old.pids, False)))
            if not args.no_connect:
                direct = f"127.0.0.1:{target_port}"
                paths.append(
                    Way("tunnel-connect-base", old.http, direct, _pids(old.pids, False), host)
                )
            machine["baseline"] = str(args.baseline)
            machine["baseline_commit"] = _commit(args.baseline)
            machine["baseline_python"] = _interpreter(python)
        if args.floor:
            floor_port, floor_pids = start_floor(base, procs, target_port)
            direct = f"127.0.0.1:{target_port}"
            paths.append(Way("floor", floor_port, direct, _pids(floor_pids, False)))
        new = start_tunnel(base, procs, target_port, "new", sys.executable, None, args.profile)
        paths.append(Way("tunnel", new.http, host, _pids(new.pids, False)))
        if not args.no_connect:
            direct = f"127.0.0.1:{target_port}"
            paths.append(Way("tunnel-connect", new.http, direct, _pids(new.pids, False), host))
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            started = [proc.pid for proc in procs.procs]
            rows = runner.run(measure(args, paths, lambda: with_descendants(started)))
    finally:
        procs.stop()
        shutil.rmtree(base, ignore_errors=True)
    added = compare(rows, args.rates)
    machine["loadavg_at_end"] = list(os.getloadavg())
    return {
        "benchmark": "latency",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "ssh": ssh_info,
        "settings": {
            "rates": args.rates,
            "answer": args.answer,
            "seconds_per_row": args.seconds,
            "rounds": args.rounds,
            "warmup_seconds_per_row": args.warmup,
            "order": "per rate, the rows in the order of `rows` in even rounds (from 0), "
            "reversed in odd ones; each row first warms up at its rate (untimed)",
            "pooling": "a row's figures are over all its rounds together: percentiles of all "
            "the samples, relay CPU per request = total CPU / total requests, rate achieved = "
            "total requests / total time, relay_cpu_per_client_cpu = the median of the "
            "rounds'; rows[].rounds has each round's own (position: its place in that round's "
            "order)",
            "connections": args.connections,
            "request": request_setting(args.request, "(keep-alive) (the answers: see answer)"),
            "schedule": "open loop; latency measured from each request's due time",
            "relay_cpu": "utime+stime from /proc/PID/stat over the row / requests served: "
            "server+agent (tunnel), sshd with its children+ssh (ssh); by process in that "
            "order (the ssh row's processes by PID)",
            "relay_cpu_per_client_cpu": "relay CPU per request / client_cpu_us_per_request in "
            "the same row (the client: the same code in every row, a yardstick of the row's "
            "machine speed); a path's figure is the median of its rounds'; moves too when a "
            "relay changes how the answers arrive (the client's reads)",
            "noise": "client_cpu_us_per_request: this client's own CPU; others_cpu_cores: the "
            "machine's busy time less this benchmark's processes', steal_cores: steal, both "
            "in cores over the row (/proc/stat); a row with either up is a noisy row",
        },
        "rows": rows,
        "added_latency": added,
    }


COMPARED = ("added_p50_ms", "added_p99_ms", "relay_cpu_us_per_request", "relay_cpu_per_client_cpu")


def compare(rows: list[dict[str, Any]], rates: list[int]) -> list[dict[str, Any]]:
    """``added_latency``: per rate, each path's added p50/p99 (path - direct), share of the
    offered rate served, relay CPU per request and relay CPU over the client's; the tunnel-like
    rows ``vs_ssh`` (over the ``ssh`` row's) and ``tunnel`` ``vs_base`` (over ``tunnel-base``'s,
    with ``--baseline``), each figure a ratio, the relay CPU's also round by round (rounds run
    in the same order, so round i of both rows ran a few seconds apart)."""
    added = []
    for rate in rates:
        at = {r["path"]: r for r in rows if r["rate_target"] == rate}
        d = at["direct"]
        entry: dict[str, Any] = {"rate": rate}
        for name, r in at.items():
            if name != "direct":
                entry[name] = {
                    "added_p50_ms": _diff(r["p50_ms"], d["p50_ms"]),
                    "added_p99_ms": _diff(r["p99_ms"], d["p99_ms"]),
                    "achieved": round(r["rate_achieved"] / rate, 3),
                    "relay_cpu_us_per_request": r["relay_cpu_us_per_request"],
                    "relay_cpu_per_client_cpu": r.get("relay_cpu_per_client_cpu"),
                }
        ssh = entry.get("ssh")
        for name in ("tunnel", "tunnel-base", "tunnel-connect", "tunnel-connect-base", "floor"):
            t = entry.get(name)
            if ssh is not None and t is not None:
                t["vs_ssh"] = {key: _ratio(t[key], ssh[key]) for key in COMPARED}
        for name in ("tunnel", "tunnel-connect"):
            tunnel, base = entry.get(name), entry.get(f"{name}-base")
            if tunnel is None or base is None:
                continue
            # Three decimals: an A/B of a few % is what --baseline is for.
            vs_base: dict[str, Any] = {key: _ratio(tunnel[key], base[key], 3) for key in COMPARED}
            for key in ("relay_cpu_us_per_request", "relay_cpu_per_client_cpu"):
                vs_base[f"{key}_by_round"] = [
                    _ratio(a.get(key), b.get(key), 3)
                    for a, b in zip(
                        at[name].get("rounds", []),
                        at[f"{name}-base"].get("rounds", []),
                        strict=False,
                    )
                ]
            tunnel["vs_base"] = vs_base
        added.append(entry)
    return added


def _pids(pids: list[int], descendants: bool) -> Callable[[], list[int]]:
    return (lambda: with_descendants(pids)) if descendants else (lambda: pids)


def _commit(checkout: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def _interpreter(python: str) -> str:
    """``python``'s version and the executable it resolves to (a venv's ``python`` is a link):
    a checkout's relays may run on another build of the interpreter than this one's (with or
    without PGO/LTO: benchmarks/README "The interpreter's build")."""
    return subprocess.run(
        [
            python,
            "-c",
            "import os, platform, sys; "
            "print(platform.python_version(), os.path.realpath(sys.executable))",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def _ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, digits)


def plot(result: dict[str, Any], path: Path) -> None:
    """Added p50 and p99 latency, share of the offered rate served, and relay CPU per request,
    by rate, one line per path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = list(dict.fromkeys(r["path"] for r in rows))
    rates = result["settings"]["rates"]
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    added = {e["rate"]: e for e in result["added_latency"]}
    colors = {name: f"C{i}" for i, name in enumerate(names)}
    for name in names:
        c = colors[name]
        served = [
            next(r for r in rows if r["path"] == name and r["rate_target"] == rate)
            for rate in rates
        ]
        axes[2].plot(
            rates, [r["rate_achieved"] / r["rate_target"] for r in served], "o-", label=name
        )
        if name == "direct":
            axes[0].plot(
                rates, [r["p50_ms"] for r in served], "o--", color=c, label="direct (absolute)"
            )
            axes[1].plot(
                rates, [r["p99_ms"] for r in served], "o--", color=c, label="direct (absolute)"
            )
            continue
        for ax, key in ((axes[0], "added_p50_ms"), (axes[1], "added_p99_ms")):
            ax.plot(rates, [added[rate][name][key] for rate in rates], "o-", color=c, label=name)
        axes[3].plot(
            rates, [r["relay_cpu_us_per_request"] for r in served], "o-", color=c, label=name
        )
    titles = (
        "added p50 (ms)",
        "added p99 (ms)",
        "served / offered",
        "relay CPU per request (µs)",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("offered req/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in axes[:2]:
        ax.set_yscale("symlog", linthresh=0.1)  # an added latency can be below 0
    fig.suptitle(
        f"small keep-alive GETs, {result['settings']['connections']} connections, "
        f"{result['settings'].get('rounds', 1)} rounds of "
        f"{result['settings']['seconds_per_row']:g} s per row ({result['date']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--rates", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 2000, 4000]
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per row and round (5)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="every rate's rows run this many times, the order reversed every other round; "
        "a row's figures pool its rounds (2)",
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        help="seconds each row first runs at its rate, untimed, before its timed part (1)",
    )
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--output", default=str(RESULTS), help="file, or - for stdout")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout (with its .venv) whose server and agent get a row too",
    )
    parser.add_argument("--no-ssh", action="store_true", help="no ssh -R rows")
    parser.add_argument(
        "--ssh-n",
        action="store_true",
        help="an ssh-N row too: ssh -N -R (no session, so sshd leaves Nagle on: it stalls "
        "40-85 ms whenever the channels' window adjusts go out)",
    )
    parser.add_argument(
        "--floor", action="store_true", help="a floor row: two minimal Python relays over mTLS"
    )
    parser.add_argument(
        "--no-connect", action="store_true", help="no tunnel-connect row (CONNECT, then bytes)"
    )
    parser.add_argument(
        "--profile", type=Path, help="run this checkout's server and agent under cProfile into DIR"
    )
    add_answer_argument(parser)
    add_request_argument(parser)
    parser.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_target_main(args.target, args.answer))
        return
    # SIGTERM (a `timeout`, a CI stop) must still run run_benchmark's cleanup: the server,
    # agent and target are in sessions of their own and would outlive us otherwise.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    write_result(run_benchmark(args), args.output, plot)


def add_request_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--request",
        choices=REQUESTS,
        default="same",
        help="the client's requests: same (GET /ping every time: the server's parse memo "
        "serves each one after the first) or varied (GET /ping?n=I, a query that changes "
        "every request, as a scraper's or kubectl's requests through one connection differ: "
        "each parsed and routed anew) (same)",
    )


def request_setting(request: str, rest: str) -> str:
    """The settings' ``request`` entry for ``--request``."""
    path = "GET /ping?n=I (I: the request's number)" if request == "varied" else "GET /ping"
    return f"{path} {rest}"


def add_answer_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--answer",
        choices=ANSWERS,
        default="varied",
        help="the target's answers: varied (a Date per second and a Content-Length that "
        "changes every answer, as a metrics endpoint's) or same (identical bytes every time, "
        "as every figure before 2026-12-04) (varied)",
    )


def write_result(
    result: dict[str, Any],
    output: str,
    plot: Callable[[dict[str, Any], Path], None] | None = None,
) -> None:
    """``result`` as JSON to ``output`` (``-``: stdout); with ``plot``, its PNG beside it."""
    text = json.dumps(result, indent=2) + "\n"
    if output == "-":
        sys.stdout.write(text)
        return
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if plot is None:
        print(f"wrote {path}", file=sys.stderr)
        return
    png = path.with_suffix(".png")
    plot(result, png)
    print(f"wrote {path} and {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
