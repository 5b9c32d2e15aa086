"""Bulk throughput on loopback: direct TCP vs the ravenproxy tunnel vs ``ssh -R``, side by side.

One run measures, with the same client code and the same sink process:

- ``direct``: client → sink (one TCP stream);
- ``tunnel``: client → server HTTP front ``CONNECT edge-1:SINK`` → mTLS WebSocket tunnel →
  agent → sink, with ``ravenproxy server`` and ``ravenproxy agent`` started through the CLI;
- ``ssh -R``: client → sshd's remote-forwarded port → ssh client → sink, through a private
  ``sshd`` (aes128-gcm and chacha20-poly1305 rows), the ssh client running a session (as
  latency.py's: benchmarks/sshrow.py); with ``--ssh-n`` also ``ssh -N -R`` aes128-gcm rows;
- ``direct x8`` / ``tunnel x8``: eight concurrent streams, aggregate rate.

Every stream speaks a tiny protocol to the sink: ``u64 length`` then ``length`` bytes; the sink
answers ``u64 count`` once it has them all, so a measurement ends when the last byte *arrived*.
A warm-up segment goes first on each connection (TCP and tunnel windows grow), then the timed
segment. Rows are interleaved round by round (``--repeat``) and each row reports its median run.

    .venv/bin/python benchmarks/throughput.py            # full run, writes results/throughput.json
    .venv/bin/python benchmarks/throughput.py --quick    # small smoke run
    .venv/bin/python benchmarks/throughput.py --only tunnel --profile /tmp/prof   # cProfile

MB/s is 10^6 bytes per second. Loopback numbers are noisy: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import uvloop

from ravenproxy.client import open_tunnel
from ravenproxy.demo import CLOUD_NODE, EDGE_NODE, INVENTORY, _Procs, _wait_for_agent, free_port
from ravenproxy.pki import init_pki

sys.path.insert(0, str(Path(__file__).resolve().parent))
from latency import _commit, _interpreter
from sshrow import SSH_CIPHERS, describe, forward_argv, ssh_files, sshd_attempts

MIB = 1 << 20
GIB = 1 << 30
BLOCK = MIB
"""Size of each client write."""
_LEN = struct.Struct("!Q")
SCRIPT = Path(__file__).resolve()
HERE = SCRIPT.parent
RESULTS = HERE / "results" / "throughput.json"
ROWS = ("direct", "tunnel", "ssh", "direct_x8", "tunnel_x8", "ssh_x8")
PLOT_SUFFIX = ".png"


# -- the sink (runs in its own process: ``throughput.py --sink``) -----------------------------
class _Sink(asyncio.BufferedProtocol):
    """Reads ``u64 length`` + payload, discards the payload, acks ``u64 count``; repeatable."""

    def __init__(self) -> None:
        self.buf = bytearray(256 * 1024)
        self.head = bytearray()
        self.remaining = 0
        self.count = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        pos = 0
        while pos < nbytes:
            if self.remaining:
                take = min(self.remaining, nbytes - pos)
                pos += take
                self.remaining -= take
                self.count += take
                if not self.remaining:
                    self._ack()
            else:
                take = min(_LEN.size - len(self.head), nbytes - pos)
                self.head += self.buf[pos : pos + take]
                pos += take
                if len(self.head) == _LEN.size:
                    (self.remaining,) = _LEN.unpack(self.head)
                    self.head.clear()
                    if not self.remaining:
                        self._ack()

    def _ack(self) -> None:
        assert self.transport is not None
        self.transport.write(_LEN.pack(self.count))
        self.count = 0

    def eof_received(self) -> bool:
        return False


async def _sink_main() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Sink, "127.0.0.1", 0, backlog=128)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(server.sockets[0].getsockname()[1], flush=True)
    await stop.wait()
    server.close()


# -- the client -----------------------------------------------------------------------------
Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
_PAYLOAD = memoryview(os.urandom(BLOCK))


async def _segment(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    """Send one length-prefixed segment of ``n`` bytes and wait for the sink's ack."""
    writer.write(_LEN.pack(n))
    sent = 0
    while sent < n:
        k = min(BLOCK, n - sent)
        writer.write(_PAYLOAD[:k])
        sent += k
        await writer.drain()
    (got,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if got != n:
        raise RuntimeError(f"sink counted {got} bytes, {n} were sent")


async def _connected(connect: Connector) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await connect()
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.transport.set_write_buffer_limits(high=4 * MIB)
    return reader, writer


async def measure(connect: Connector, streams: int, nbytes: int, warmup: int) -> tuple[int, float]:
    """``streams`` connections, each warmed up, then all send ``nbytes`` at once.
    Returns (total bytes, seconds from the first write to the last ack)."""
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(streams):
            conns.append(await _connected(connect))
        if warmup:
            await _all(_segment(r, w, warmup) for r, w in conns)
        started = time.perf_counter()
        await _all(_segment(r, w, nbytes) for r, w in conns)
        elapsed = time.perf_counter() - started
    finally:
        for _, w in conns:
            w.close()
        for _, w in conns:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                await w.wait_closed()
    return nbytes * streams, elapsed


async def _all(coros: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Like gather, but the first failure cancels (and collects) the others."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- processes --------------------------------------------------------------------------------
class Procs(_Procs):
    """demo's ``_Procs``, plus arbitrary commands; stops in reverse order, by PID, and sweeps
    the session group each process was started in (sshd's per-connection children)."""

    async def spawn(
        self, argv: Sequence[str], log: Path, *, stdout_pipe: bool = False, cwd: Path | None = None
    ) -> asyncio.subprocess.Process:
        out = log.open("wb")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout_pipe else out,
            stderr=out,
            start_new_session=True,
        )
        out.close()
        self.procs.append(proc)
        return proc

    async def stop_one(self, proc: asyncio.subprocess.Process, timeout: float = 15) -> None:
        # Let children exit while their parent can still reap them (sshd's per-connection
        # processes end once the ssh client is gone); killed orphans would stay zombies here.
        deadline = time.monotonic() + 3
        while proc.returncode is None and _children(proc.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group we created; empty → ESRCH
        if proc in self.procs:
            self.procs.remove(proc)

    async def stop(self) -> None:
        for proc in reversed(list(self.procs)):
            await self.stop_one(proc)


_TICK = os.sysconf("SC_CLK_TCK")


def relay_cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of ``pids`` and all their descendants (``/proc/PID/stat``)."""
    total = 0.0
    todo = list(pids)
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        todo += _children(pid)
    return total


def relay_counters(pid: int) -> dict[str, float]:
    """Cumulative counters of one relaying process and its descendants, as
    :func:`relay_cpu_seconds` counts: user and system CPU seconds (``/proc/PID/stat``), read-
    and write-type syscalls (``/proc/PID/io`` syscr, syscw), voluntary and involuntary context
    switches (``/proc/PID/status``)."""
    out: dict[str, float] = {}
    todo = [pid]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            found: dict[str, float] = {
                "user_s": int(fields[11]) / _TICK,
                "sys_s": int(fields[12]) / _TICK,
            }
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("syscr", "syscw"):
                    found[key] = int(value)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
                    found[key.split("_")[0] + "_cs"] = int(value)
            for key, count in found.items():
                out[key] = out.get(key, 0) + count
        todo += _children(pid)
    return out


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
    return kids


async def start_sink(procs: Procs, base: Path) -> int:
    proc = await procs.spawn(
        [sys.executable, str(SCRIPT), "--sink"],
        base / "sink.log",
        stdout_pipe=True,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 15)
    if not line.strip():
        raise RuntimeError(f"sink did not start: {(base / 'sink.log').read_text()[-2000:]}")
    return int(line)


async def start_tunnel(
    procs: Procs,
    base: Path,
    sink_port: int,
    profile: Path | None,
    checkout: Path | None = None,
) -> tuple[int, list[int]]:
    """``ravenproxy server`` + ``ravenproxy agent`` via the CLI; returns the HTTP front port
    and their PIDs.
    ``checkout``: run that checkout's code with its own ``.venv`` (an A/B baseline)."""
    await asyncio.to_thread(base.mkdir, exist_ok=True)
    certs = base / "certs"
    init_pki(certs, ("localhost", "127.0.0.1"), (EDGE_NODE,))
    inventory = base / "inventory.yaml"
    inventory.write_text(INVENTORY.format(port=sink_port, cloud=CLOUD_NODE, edge=EDGE_NODE))
    tunnel, front, metrics, health = free_port(), free_port(), free_port(), free_port()

    python = str(checkout / ".venv" / "bin" / "python") if checkout else sys.executable

    def cmd(role: str, *args: str) -> list[str]:
        prof = ["-m", "cProfile", "-o", str(profile / f"{role}.prof")] if profile else []
        return [python, *prof, "-m", "ravenproxy", role, *args]

    server = await procs.spawn(
        cmd(
            "server",
            "--inventory", str(inventory),
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / "server.crt"),
            "--key-file", str(certs / "server.key"),
            "--node-name", CLOUD_NODE,
            "--tunnel-addr", f"127.0.0.1:{tunnel}",
            "--http-addr", f"127.0.0.1:{front}",
            "--https-addr", "127.0.0.1:0",
            "--metrics-addr", f"127.0.0.1:{metrics}",
            "--health-addr", f"127.0.0.1:{health}",
            "--log-level", "WARNING",
        ),
        base / "server.log",
        cwd=checkout,
    )  # fmt: skip
    agent = await procs.spawn(
        cmd(
            "agent",
            "--node-name", EDGE_NODE,
            "--server-addr", f"wss://127.0.0.1:{tunnel}",
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / f"{EDGE_NODE}.crt"),
            "--key-file", str(certs / f"{EDGE_NODE}.key"),
            "--inventory", str(inventory),
            # The demo's inventory puts its target on a metrics port; the sink is admitted
            # explicitly, as in latency.py.
            "--allow", f"127.0.0.1:{sink_port}",
            "--log-level", "WARNING",
        ),
        base / "agent.log",
        cwd=checkout,
    )  # fmt: skip
    await _wait_for_agent(front, sink_port, procs, time.monotonic() + 30)
    return front, [server.pid, agent.pid]


@dataclass
class Ssh:
    base: Path
    port: int
    key: Path
    mode: str
    version: str
    pid: int


async def _port_open(port: int) -> bool:
    try:
        _, w = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    w.close()
    return True


async def start_sshd(procs: Procs, base: Path) -> Ssh:
    """A private sshd on a free loopback port; raises RuntimeError with the reason."""
    d, port, version = await asyncio.to_thread(ssh_files, base)
    errors: list[str] = []
    for mode, argv in sshd_attempts(d):
        log = d / f"sshd-{len(errors)}.log"
        proc = await procs.spawn(argv, log)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and proc.returncode is None:
            if await _port_open(port):
                return Ssh(d, port, d / "client_key", mode, version, proc.pid)
            await asyncio.sleep(0.05)
        await procs.stop_one(proc, timeout=2)
        errors.append(f"{mode}: {log.read_text().strip()[-300:] or 'no listener'}")
    raise RuntimeError("sshd did not start: " + " | ".join(errors))


async def start_ssh_forward(
    procs: Procs, ssh: Ssh, cipher: str, sink_port: int, session: bool = True
) -> tuple[int, asyncio.subprocess.Process]:
    """An ``ssh -R`` client forwarding a free port of sshd's to ``sink_port``, running a
    session (``session=False``: ``ssh -N``; see benchmarks/sshrow.py); returns the forwarded
    port and the client."""
    rport = free_port()
    argv = forward_argv(ssh.port, ssh.key, cipher, rport, sink_port, session)
    log = ssh.base / f"ssh-{cipher.split('@')[0]}{'' if session else '-N'}.log"
    proc = await procs.spawn(argv, log)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"ssh exited ({proc.returncode}): {log.read_text()[-500:]}")
        if await _port_open(rport):
            return rport, proc
        await asyncio.sleep(0.05)
    await procs.stop_one(proc)
    raise RuntimeError("ssh -R forward did not come up in 15 s")


# -- the run ----------------------------------------------------------------------------------
@dataclass
class Options:
    mib: int
    mib_each: int
    streams: int
    warmup_mib: int
    repeat: int
    only: tuple[str, ...]
    profile: Path | None
    output: Path | None
    baseline: Path | None = None
    run_timeout: float = 300.0
    ssh_n: bool = False
    """Also ``ssh -N -R`` aes128-gcm rows (no session: sshd leaves Nagle on its socket)."""


@dataclass
class Pair:
    """One checkout's ``ravenproxy server`` + ``ravenproxy agent``, started afresh every round.

    Kept running for the whole run, one of two identical pairs (most often the one started
    first, whatever position its rows ran in) fell into a slower mode from round 2 on and
    stayed in it (8 streams: ~3.2 -> ~4.2 s/GiB relay CPU); see benchmarks/README.md. A new
    pair per round, the start order alternating, keeps that from biasing an A/B."""

    key: str
    name: str
    checkout: Path | None
    front: int = 0
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    async def start(self, procs: Procs, base: Path, sink: int, profile: Path | None) -> None:
        before = len(procs.procs)
        prof = profile / base.name if profile else None  # DIR/<key>-<round>/<role>.prof
        if prof:
            prof.mkdir(parents=True, exist_ok=True)
        self.front, _ = await start_tunnel(procs, base, sink, prof, self.checkout)
        self.procs = procs.procs[before:]

    async def stop(self, procs: Procs) -> None:
        for proc in reversed(self.procs):
            await procs.stop_one(proc)
        self.procs = []


@dataclass
class Forward:
    """One ``ssh -R`` client (and so one sshd per-connection process, the other relaying end),
    started afresh every round like the tunnel pairs: each round is an independent draw for
    ssh too, not one process pair kept for the whole run. ``session``: the client runs a
    remote command (the default rows), else ``ssh -N`` (``--ssh-n``'s rows)."""

    ssh: Ssh
    cipher: str
    session: bool = True
    port: int = 0
    proc: asyncio.subprocess.Process | None = None

    @property
    def pids(self) -> list[int]:
        # The sshd listener counts with its descendants: the per-connection child relays.
        return [self.ssh.pid, self.proc.pid] if self.proc else []

    async def start(self, procs: Procs, sink: int) -> None:
        self.port, self.proc = await start_ssh_forward(
            procs, self.ssh, self.cipher, sink, self.session
        )

    async def stop(self, procs: Procs) -> None:
        if self.proc is not None:
            await procs.stop_one(self.proc)
        self.proc = None


def merge_profiles(profile: Path, pairs: Sequence[Pair]) -> None:
    """The rounds' profiles into ``DIR/server.prof`` and ``DIR/agent.prof`` (the tunnel under
    test) and ``DIR/base-server.prof``, ``DIR/base-agent.prof``; the per-round ones go."""
    import pstats

    for pair in pairs:
        rounds = sorted(profile.glob(f"{pair.key}-*"))
        for role in ("server", "agent"):
            files = [str(f) for d in rounds if (f := d / f"{role}.prof").exists()]
            if files:
                prefix = "" if pair.key == "tunnel" else f"{pair.key}-"
                pstats.Stats(*files).dump_stats(profile / f"{prefix}{role}.prof")
        for d in rounds:
            shutil.rmtree(d, ignore_errors=True)


@dataclass
class Row:
    key: str
    name: str
    streams: int
    connect: Connector
    nbytes: int
    warmup: int
    fixed_relay: tuple[int, ...] = ()
    """PIDs of the relaying processes (their descendants count too): CPU per GiB is charged
    to them. CPU time is a steadier A/B measure than MB/s on a shared machine."""
    pair: Pair | None = None
    """A tunnel row's server + agent (restarted every round): its relay PIDs are theirs."""
    forward: Forward | None = None
    """An ssh row's ``ssh -R`` (restarted every round): its relay PIDs are sshd's and its."""
    runs: list[tuple[int, float]] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    """Relay CPU seconds per GiB moved (warm-up included), one per run."""
    cpu_each: list[list[float]] = field(default_factory=list)
    """The same per relaying process (server, agent / sshd, ssh), one list per run."""
    counters: list[list[dict[str, float]]] = field(default_factory=list)
    """Per run, per relaying process: :func:`relay_counters` per MiB moved (CPU per GiB)."""
    errors: list[str] = field(default_factory=list)

    @property
    def relay(self) -> tuple[int, ...]:
        if self.pair:
            return tuple(self.pair.pids)
        return tuple(self.forward.pids) if self.forward else self.fixed_relay

    def result(self) -> dict[str, Any]:
        if not self.runs:
            return {
                "key": self.key,
                "name": self.name,
                "streams": self.streams,
                "mb_s": None,
                "errors": self.errors,
            }
        cpu = sorted(self.cpu)
        relay_cpu: dict[str, Any] = {}
        if cpu:
            relay_cpu[CPU] = round(cpu[len(cpu) // 2], 3)
            relay_cpu["relay_cpu_each_runs"] = [[round(c, 3) for c in r] for r in self.cpu_each]
        if self.counters:
            relay_cpu["relay_per_mib_each_runs"] = [
                [{k: round(v, 3) for k, v in each.items()} for each in run] for run in self.counters
            ]
        rates = [b / s / 1e6 for b, s in self.runs]
        median = sorted(range(len(rates)), key=rates.__getitem__)[len(rates) // 2]
        nbytes, seconds = self.runs[median]
        return {
            "key": self.key,
            "name": self.name,
            "streams": self.streams,
            "mb_s": round(nbytes / seconds / 1e6, 1),
            "bytes": nbytes,
            "seconds": round(seconds, 4),
            "runs_mb_s": [round(r, 1) for r in rates],
            **relay_cpu,
            "errors": self.errors,
        }


def _per_mib(after: dict[str, float], before: dict[str, float], moved: int) -> dict[str, float]:
    """Counters' growth per MiB moved (CPU seconds per GiB)."""
    out = {}
    for key, value in after.items():
        if key in before:
            scale = GIB if key.endswith("_s") else MIB
            out[key] = (value - before[key]) * scale / moved
    return out


def _in_start_order(
    rows: Sequence[Row], order: Sequence[Pair], forwards: Sequence[Forward] = ()
) -> list[Row]:
    """``rows`` with the tunnel rows' slots refilled pair by pair in ``order`` (the pair
    started first runs first), and the ssh rows' slots forward by forward in ``forwards``'
    order; the other rows keep their places."""
    rank = {id(owner): i for i, owner in enumerate([*order, *forwards])}
    tunnel = iter(sorted((r for r in rows if r.pair), key=lambda r: rank[id(r.pair)]))
    ssh = iter(
        sorted((r for r in rows if id(r.forward) in rank), key=lambda r: rank[id(r.forward)])
    )
    return [
        next(tunnel) if row.pair else next(ssh) if id(row.forward) in rank else row for row in rows
    ]


async def _settle(row: Row, timeout: float = 30) -> None:
    """After a failed run, wait until the path carries a small segment again (the agent
    reconnects after a broken tunnel), so the next row is not charged for the outage."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(measure(row.connect, 1, MIB, 0), 5)
            return
        await asyncio.sleep(0.2)


def machine_info() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(HERE), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "cpu": cpu,
        "kernel": platform.release(),
        "python": _interpreter(sys.executable),
        "uvloop": importlib.metadata.version("uvloop"),
        "websockets": importlib.metadata.version("websockets"),
        "git_commit": commit or None,
        "git_tracked_changes": bool(dirty),
    }


def baseline_info(opts: Options) -> dict[str, Any]:
    """The ``--baseline`` checkout's commit and the interpreter its relays run on."""
    if opts.baseline is None:
        return {}
    return {
        "baseline": str(opts.baseline),
        "baseline_commit": _commit(opts.baseline),
        "baseline_python": _interpreter(str(opts.baseline / ".venv" / "bin" / "python")),
    }


CPU = "relay_cpu_s_per_gib"


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str = "mb_s") -> float | None:
    if a is None or b is None or not a.get(key) or not b.get(key):
        return None
    return round(float(a[key]) / float(b[key]), 3)


async def run(opts: Options) -> dict[str, Any]:
    load_start = [round(x, 2) for x in os.getloadavg()]
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-bench-"))
    keep = False
    procs = Procs()
    rows: list[Row] = []
    pairs: list[Pair] = []
    forwards: list[Forward] = []
    ssh_info: dict[str, Any] | None = None
    ssh_error: str | None = None
    start_order: list[list[str]] = []
    try:
        sink = await start_sink(procs, base)
        one, each, warm = opts.mib * MIB, opts.mib_each * MIB, opts.warmup_mib * MIB

        def direct() -> Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
            return asyncio.open_connection("127.0.0.1", sink, limit=256 * 1024)

        if "direct" in opts.only:
            rows.append(Row("direct", "direct TCP", 1, direct, one, warm))
        n = opts.streams
        # The tunnel under test, and the baseline checkout's when asked: same sink, same run.
        # Both pairs are started afresh every round, in alternating order (see Pair).
        pairs = [Pair("tunnel", "ravenproxy tunnel", None)]
        if opts.baseline is not None:
            pairs.append(Pair("base", f"baseline {opts.baseline.name}", opts.baseline))
        if not {"tunnel", "tunnel_x8"} & set(opts.only):
            pairs = []
        for pair in pairs:

            def tunnel(
                pair: Pair = pair,
            ) -> Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
                return open_tunnel("127.0.0.1", pair.front, f"{EDGE_NODE}:{sink}")

            key, name = pair.key, pair.name
            if "tunnel" in opts.only:
                rows.append(Row(key, name, 1, tunnel, one, warm, pair=pair))
            if "tunnel_x8" in opts.only:
                rows.append(Row(f"{key}_x8", f"{name} x{n}", n, tunnel, each, warm // n, pair=pair))
        if {"ssh", "ssh_x8"} & set(opts.only):
            try:
                ssh = await start_sshd(procs, base)
                ssh_info = {
                    "openssh": ssh.version,
                    "sshd_mode": ssh.mode,
                    "rows": [],
                    "ssh": describe(session=True),
                }
                forms = [(label, cipher, True) for label, cipher in SSH_CIPHERS]
                if opts.ssh_n:
                    ssh_info["ssh-N"] = describe(session=False)
                    forms.append((*SSH_CIPHERS[0], False))
                for label, cipher, session in forms:
                    x8 = "ssh_x8" in opts.only and cipher == SSH_CIPHERS[0][1]
                    if "ssh" not in opts.only and not x8:
                        continue
                    forward = Forward(ssh, cipher, session)
                    await forward.start(procs, sink)  # fails here, not mid-run, if it cannot
                    forwards.append(forward)

                    def via_ssh(
                        f: Forward = forward,
                    ) -> Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
                        return asyncio.open_connection("127.0.0.1", f.port, limit=256 * 1024)

                    key = ("ssh_" if session else "ssh-N_") + label.split("-")[0]
                    how = f"ssh -R {label}" if session else f"ssh -N -R {label}"
                    if "ssh" in opts.only:
                        rows.append(Row(key, how, 1, via_ssh, one, warm, forward=forward))
                        ssh_info["rows"].append(key)
                    if x8:
                        rows.append(
                            Row(
                                f"{key}_x8",
                                f"{how} x{n}",
                                n,
                                via_ssh,
                                each,
                                warm // n,
                                forward=forward,
                            )
                        )
                        ssh_info["rows"].append(f"{key}_x8")
            except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
                ssh_error = str(exc)
                print(f"ssh rows skipped: {ssh_error}", file=sys.stderr)
        if "direct_x8" in opts.only:
            rows.append(Row("direct_x8", f"direct TCP x{n}", n, direct, each, warm // n))

        for round_ in range(opts.repeat):
            # Odd rounds start (and run) the pairs in reverse: no pair is always the first;
            # the ssh forwards likewise (with --ssh-n: ssh and ssh -N take turns going first).
            order = pairs[::-1] if round_ % 2 else pairs
            forward_order = forwards[::-1] if round_ % 2 else forwards
            try:
                for forward in forward_order if round_ else ():  # round 1's were started above
                    await forward.stop(procs)
                for forward in forward_order if round_ else ():
                    await forward.start(procs, sink)
                for pair in order:
                    await pair.start(procs, base / f"{pair.key}-{round_ + 1}", sink, opts.profile)
            except BaseException:
                keep = True
                raise
            start_order.append([p.key for p in order])
            for row in _in_start_order(rows, order, forward_order):
                label = f"  round {round_ + 1}/{opts.repeat}  {row.name:<28}"
                cpu_before = [relay_cpu_seconds((pid,)) for pid in row.relay]
                counters_before = [relay_counters(pid) for pid in row.relay]
                try:
                    nbytes, seconds = await asyncio.wait_for(
                        measure(row.connect, row.streams, row.nbytes, row.warmup),
                        opts.run_timeout,
                    )
                except (OSError, RuntimeError, TimeoutError, asyncio.IncompleteReadError) as exc:
                    # Recorded, never papered over: a failed run has no rate.
                    row.errors.append(f"round {round_ + 1}: {exc!r}")
                    print(f"{label} FAILED: {exc!r}", flush=True)
                    await _settle(row)
                    continue
                row.runs.append((nbytes, seconds))
                if row.relay:
                    moved = nbytes + row.warmup * row.streams
                    each_cpu = [
                        (relay_cpu_seconds((pid,)) - before) * GIB / moved
                        for pid, before in zip(row.relay, cpu_before, strict=True)
                    ]
                    row.cpu.append(sum(each_cpu))
                    row.cpu_each.append(each_cpu)
                    row.counters.append(
                        [
                            _per_mib(relay_counters(pid), before, moved)
                            for pid, before in zip(row.relay, counters_before, strict=True)
                        ]
                    )
                cpu = (
                    f"  relay CPU {row.cpu[-1]:.2f} s/GiB "
                    f"({' + '.join(f'{c:.2f}' for c in row.cpu_each[-1])})"
                    if row.cpu
                    else ""
                )
                if row.counters:
                    cpu += "  read/write/cs per MiB " + " + ".join(
                        f"{c.get('syscr', 0):.1f}/{c.get('syscw', 0):.1f}/"
                        f"{c.get('voluntary_cs', 0) + c.get('nonvoluntary_cs', 0):.1f}"
                        for c in row.counters[-1]
                    )
                print(f"{label} {nbytes / seconds / 1e6:8.1f} MB/s{cpu}", flush=True)
            for pair in reversed(order):
                await pair.stop(procs)
    except BaseException:
        keep = True
        raise
    finally:
        await procs.stop()
        if keep:  # show the logs' tails before the directory goes
            for name in ("server.log", "agent.log", "sink.log"):
                with contextlib.suppress(OSError):
                    text = (base / name).read_text()[-2000:]
                    if text.strip():
                        print(f"--- {name} ---\n{text}", file=sys.stderr)
        shutil.rmtree(base, ignore_errors=True)

    if opts.profile is not None:
        merge_profiles(opts.profile, pairs)
    results = {r.key: r.result() for r in rows}
    ssh_aes = results.get("ssh_aes128")
    ssh_chacha = results.get("ssh_chacha20")
    ssh_n: dict[str, float | None] = {}
    if opts.ssh_n:  # below 1: the session row is slower than -N (MB/s) or cheaper (CPU)
        for x in ("", "_x8"):
            with_session = results.get(f"ssh_aes128{x}")
            without = results.get(f"ssh-N_aes128{x}")
            ssh_n[f"ssh_aes128{x}/ssh-N_aes128{x}"] = _ratio(with_session, without)
            ssh_n[f"cpu ssh_aes128{x}/ssh-N_aes128{x}"] = _ratio(with_session, without, CPU)
    return {
        "benchmark": "throughput",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {**machine_info(), "loadavg_at_start": load_start, **baseline_info(opts)},
        "settings": {
            "mib_single": opts.mib,
            "mib_each_concurrent": opts.mib_each,
            "concurrent_streams": opts.streams,
            "warmup_mib": opts.warmup_mib,
            "repeat": opts.repeat,
            "write_block_bytes": BLOCK,
            "profiled": opts.profile is not None,
            "tunnel_start_order": start_order,
            "note": "MB/s = 1e6 bytes/s; median of the rounds; loopback, all processes on one host",
        },
        "rows": list(results.values()),
        "ssh": ssh_info,
        "ssh_error": ssh_error,
        "ratios": {
            "tunnel/direct": _ratio(results.get("tunnel"), results.get("direct")),
            "tunnel/ssh_aes128_gcm": _ratio(results.get("tunnel"), ssh_aes),
            "tunnel/ssh_chacha20_poly1305": _ratio(results.get("tunnel"), ssh_chacha),
            "tunnel_x8/direct_x8": _ratio(results.get("tunnel_x8"), results.get("direct_x8")),
            "tunnel_x8/tunnel": _ratio(results.get("tunnel_x8"), results.get("tunnel")),
            "tunnel_x8/ssh_x8_aes128_gcm": _ratio(
                results.get("tunnel_x8"), results.get("ssh_aes128_x8")
            ),
            "ssh_x8/ssh_aes128_gcm": _ratio(results.get("ssh_aes128_x8"), ssh_aes),
            "tunnel/base": _ratio(results.get("tunnel"), results.get("base")),
            "tunnel_x8/base_x8": _ratio(results.get("tunnel_x8"), results.get("base_x8")),
            # Relay CPU per GiB: below 1 means the tunnel spends less CPU than the other.
            "cpu tunnel/base": _ratio(results.get("tunnel"), results.get("base"), CPU),
            "cpu tunnel_x8/base_x8": _ratio(results.get("tunnel_x8"), results.get("base_x8"), CPU),
            "cpu tunnel/ssh_aes128_gcm": _ratio(results.get("tunnel"), ssh_aes, CPU),
            "cpu tunnel_x8/ssh_x8_aes128_gcm": _ratio(
                results.get("tunnel_x8"), results.get("ssh_aes128_x8"), CPU
            ),
            **ssh_n,
        },
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"\nthroughput on loopback, {report['date']}, nproc={report['machine']['nproc']}")
    print(f"{'path':<28} {'streams':>7} {'MB/s':>9} {'MiB':>7} {'seconds':>8}  runs MB/s")
    for row in report["rows"]:
        if row["mb_s"] is None:
            print(f"{row['name']:<28} {row['streams']:>7} {'—':>9}")
            continue
        print(
            f"{row['name']:<28} {row['streams']:>7} {row['mb_s']:>9.1f} "
            f"{row['bytes'] / MIB:>7.0f} {row['seconds']:>8.3f}  {row['runs_mb_s']}"
            + (f"  relay CPU {row[CPU]} s/GiB" if CPU in row else "")
        )
    if report["ssh"] is None and report["ssh_error"]:
        print(f"ssh -R: not measured ({report['ssh_error']})")
    print("ratios:")
    for name, value in report["ratios"].items():
        print(f"  {name:<30} {'—' if value is None else f'{value:.2f}x'}")


def plot(report: dict[str, Any], path: Path) -> None:
    """MB/s of every row, one stream and concurrent side by side: tunnel vs ssh -R vs direct."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report["rows"] if r["mb_s"] is not None]
    colours = {
        "direct": "#999999",
        "tunnel": "#1f77b4",
        "base": "#9ecae1",
        "ssh": "#ff7f0e",
        "ssh-N": "#ffbb78",
    }
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    names = [r["name"] for r in rows]
    values = [float(r["mb_s"]) for r in rows]
    colour = [colours.get(r["key"].split("_")[0], "#2ca02c") for r in rows]
    bars = ax.barh(names, values, color=colour)
    ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("MB/s (median of the rounds)")
    machine = report["machine"]
    ax.set_title(
        f"throughput on loopback, {report['date']}, nproc={machine['nproc']}, "
        f"load {machine['loadavg_at_start'][0]:.1f}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=1024, help="MiB per single-stream run (1024)")
    p.add_argument("--mib-each", type=int, default=256, help="MiB per stream, concurrent (256)")
    p.add_argument("--streams", type=int, default=8, help="concurrent streams (8)")
    p.add_argument("--warmup-mib", type=int, default=64, help="warm-up MiB per run (64)")
    p.add_argument("--repeat", type=int, default=3, help="rounds; rows report the median (3)")
    p.add_argument("--quick", action="store_true", help="small run: 64 / 16 MiB, 1 round")
    p.add_argument(
        "--only",
        default=",".join(ROWS),
        help=f"comma-separated subset of {','.join(ROWS)} (default: all)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run server and agent under cProfile, writing DIR/server.prof, DIR/agent.prof",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"JSON report path (default {RESULTS.relative_to(HERE.parent)}; '-' for none)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="CHECKOUT",
        help="also measure the tunnel of another checkout with its own .venv (rows base, "
        "base_x8), e.g. main's, for an A/B in the same run",
    )
    p.add_argument(
        "--ssh-n",
        action="store_true",
        help="also ssh -N -R aes128-gcm rows (ssh-N_aes128, ssh-N_aes128_x8): no session, so "
        "sshd leaves Nagle on its socket (the ssh rows run a session; see benchmarks/sshrow.py)",
    )
    p.add_argument("--sink", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


async def _main(opts: Options) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run(opts)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.sink:
        uvloop.run(_sink_main())
        return 0
    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    unknown = set(only) - set(ROWS)
    if unknown:
        print(f"unknown rows: {sorted(unknown)}; choose from {ROWS}", file=sys.stderr)
        return 2
    if args.quick:
        args.mib, args.mib_each, args.warmup_mib, args.repeat = 64, 16, 8, 1
    profile = args.profile.resolve() if args.profile else None
    if profile:
        profile.mkdir(parents=True, exist_ok=True)
    full = set(only) == set(ROWS) and not args.quick and profile is None and not args.ssh_n
    output = args.output
    if output is None:
        output = RESULTS if full else None
    elif str(output) == "-":
        output = None
    opts = Options(
        args.mib, args.mib_each, args.streams, args.warmup_mib, max(1, args.repeat), only,
        profile, output, args.baseline.resolve() if args.baseline else None,
        ssh_n=args.ssh_n,
    )  # fmt: skip
    try:
        report = uvloop.run(_main(opts))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every started process was stopped", file=sys.stderr)
        return 130
    print_report(report)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2) + "\n")
        png = output.with_suffix(PLOT_SUFFIX)
        plot(report, png)
        print(f"wrote {output} and {png}")
    else:
        print("(partial/quick/profiled run: JSON not written; pass --output FILE to keep it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
