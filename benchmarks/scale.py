"""Scale: many agents on one server, many idle streams, and a server restart with every agent.

Real processes on loopback. ``ravenproxy server`` and one ``ravenproxy agent`` (node
``edge-s``, which carries the streams) are started through the CLI; the fleet of agents runs as
library :class:`~ravenproxy.agent.app.Agent` instances, many per process (an agent CLI process is
~47 MB; what the server sees is the same: one mTLS WebSocket tunnel per node, each agent with its
own client certificate for its own node, issued here with :mod:`ravenproxy.pki.authority`). The
inventory names every node.

1. **agents**: server RSS with no agent, then with ``--agents`` connected and settled:
   (after - before) / agents = server RSS per idle agent.
2. **streams**: ``CONNECT edge-s:TARGET`` streams through the HTTP front, held open and idle
   (the target, its own process, accepts and holds them), at each count of ``--streams``; RSS
   of the server and of edge-s's agent against the same processes with no stream open: per
   stream = delta / streams open. At 0 and at each count, the latency of ``--probes``
   sequential GETs (keep-alive, ``Host: edge-s:TARGET``, 2-byte answer) through the tunnel.
   A CONNECT holds one front connection, and the server caps its front connections at 7/16 of
   its descriptor limit (an eighth in reserve, two descriptors per connection): with a hard
   limit of 20 000 that is 8 750, so a 10 000 row opens 8 750 and the server closes the rest
   at once and counts them (``refused`` in the row); the per-stream figures use the streams
   actually open (ten fewer at the cap: closed again to let the latency probe in).
3. **restart**: SIGTERM the server (it drains and exits), start it again on the same ports;
   from its first ``/readyz`` 200 to each agent's tunnel up again (seen by the agents
   themselves: their ``connected`` event, sampled every 20 ms): p50/p99/max, and the number of
   agents back over time (the plot).

    python -m benchmarks.scale                                  # 1 000 agents, 1k/5k/10k streams
    python -m benchmarks.scale --agents 100 --streams 1000 --output -   # a quick run (~30 s)

Results: ``benchmarks/results/scale.json`` (machine, date, parameters, rows) and
``benchmarks/results/scale.png``. Every process is stopped by its PID (SIGTERM, then SIGKILL),
also on error or SIGTERM; the temp dir is removed. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import logging
import os
import platform
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import uvloop

from ravenproxy.pki import init_pki
from ravenproxy.pki.authority import issue_client_cert
from ravenproxy.pki.pemfiles import load_cert, load_key, write_pem_cert, write_pem_key

SCRIPT = Path(__file__).resolve()
HERE = SCRIPT.parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "scale.json"
PLOT = HERE / "results" / "scale.png"
SETTLE = 2.0
"""Seconds to wait after the last agent or stream came up before reading RSS."""
SAMPLE = 0.02
"""How often a fleet process looks at its agents' tunnel state."""
GAUGE_EVERY = 0.5
"""How often the restart reads the server's agents gauge (each /metrics scrape costs the server
~10 ms with 1 000 agents, the tasks gauge walking every task: at 0.1 s the benchmark itself took
a tenth of a core from the server it measures)."""
STREAM_NODE = "edge-s"
PROBE_ROOM = 10
"""Streams closed again, at the server's front connection cap, to let the latency probe in."""
BODY = b"ok"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY


def fleet_node(i: int) -> str:
    return f"edge-{i:05d}"


def inventory(agents: int) -> str:
    nodes = [STREAM_NODE, *(fleet_node(i) for i in range(agents))]
    return "".join(
        "---\napiVersion: v1\nkind: Node\n"
        f"metadata: {{name: {n}}}\n"
        "status:\n  addresses: [{type: InternalIP, address: 127.0.0.1}]\n"
        for n in nodes
    )


# -- the target (its own process: ``--target PORTFILE``) ----------------------------------------
class _Target(asyncio.Protocol):
    """Holds every connection; answers each complete request head with a small response."""

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        answers = self.buf.count(b"\r\n\r\n")
        if answers and self.transport is not None:
            self.buf = self.buf.rsplit(b"\r\n\r\n", 1)[1]
            self.transport.write(RESPONSE * answers)


async def _target_main(port_file: Path) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Target, "127.0.0.1", 0, backlog=4096)
    with open(port_file, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


# -- a fleet process (``--fleet DIR --first I --count N --server-addr URL``) -------------------
async def _fleet_main(args: argparse.Namespace) -> None:
    """``count`` library agents; each change of a tunnel's state is appended to
    ``DIR/fleet-FIRST.events`` as ``node up|down unix-time``."""
    from ravenproxy.agent.app import Agent
    from ravenproxy.agent.settings import AgentSettings
    from ravenproxy.metrics import AgentMetrics

    logging.basicConfig(level=logging.ERROR)  # 1 000 agents retrying would flood the log
    base = Path(args.fleet)
    agents = []
    for i in range(args.first, args.first + args.count):
        node = fleet_node(i)
        settings = AgentSettings.from_mapping(
            {
                "node_name": node,
                "server_addr": args.server_addr,
                "ca_file": str(base / "certs" / "ca.crt"),
                "cert_file": str(base / "fleet" / f"{node}.crt"),
                "key_file": str(base / "fleet" / f"{node}.key"),
            }
        )
        # Their metrics are read below (dump_dials), not served: kept all the same.
        agents.append(Agent(settings, metrics=AgentMetrics()))
    tasks = [asyncio.create_task(a.run(), name=a.settings.node_name) for a in agents]
    state = [False] * len(agents)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def dump_dials() -> None:
        """On SIGUSR1: the fleet's dials so far (``ok failed``), from the agents' own counter."""
        totals = [0.0, 0.0]
        for agent in agents:
            for k, result in enumerate(("ok", "failed")):
                registry = agent.metrics.registry
                assert registry is not None
                value = registry.get_sample_value(
                    "ravenproxy_agent_connect_attempts_total", {"result": result}
                )
                totals[k] += value or 0.0
        tmp = base / f"fleet-{args.first}.dials.tmp"
        tmp.write_text(f"{totals[0]:.0f} {totals[1]:.0f}")
        tmp.rename(base / f"fleet-{args.first}.dials")

    loop.add_signal_handler(signal.SIGUSR1, dump_dials)
    with (base / f"fleet-{args.first}.events").open("a") as events:
        (base / f"fleet-{args.first}.started").write_text("1")
        while not stop.is_set():
            now = time.time()
            lines = []
            for k, agent in enumerate(agents):
                up = agent.connected.is_set()
                if up != state[k]:
                    state[k] = up
                    lines.append(f"{agent.settings.node_name} {'up' if up else 'down'} {now:.4f}\n")
            if lines:
                events.write("".join(lines))
                events.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def fleet_dials(bed: Bed) -> tuple[int, int]:
    """The dials (ok, failed) the fleet's agents have made so far (SIGUSR1 to each process)."""
    for path in bed.base.glob("fleet-*.dials"):
        path.unlink()
    for proc in bed.fleet:
        proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 20
    while len(paths := list(bed.base.glob("fleet-*.dials"))) < len(bed.fleet):
        if time.monotonic() > deadline:
            raise RuntimeError("the fleet did not report its dials")
        await asyncio.sleep(0.05)
    ok = failed = 0
    for path in paths:
        a, b = path.read_text().split()
        ok, failed = ok + int(a), failed + int(b)
    return ok, failed


def read_events(base: Path) -> list[tuple[str, str, float]]:
    out = []
    for path in base.glob("fleet-*.events"):
        for line in path.read_text().splitlines():
            node, what, when = line.split()
            out.append((node, what, float(when)))
    return sorted(out, key=lambda e: e[2])


def agents_up(base: Path) -> int:
    up: dict[str, bool] = {}
    for node, what, _ in read_events(base):
        up[node] = what == "up"
    return sum(up.values())


# -- processes ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def listen_overflows() -> int:
    """The kernel's count of connections dropped for a full accept queue (this network
    namespace, every listener: other processes' too)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    return 0


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return int(hard)


class Procs:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with (self.base / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=ROOT,
            )
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop_one(proc: subprocess.Popen[bytes], timeout: float = 20) -> int:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            self.stop_one(proc)


async def http_get(port: int, path: str, host: str = "x") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def metric(port: int, name: str) -> float:
    _, body = await http_get(port, "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def until(check: Any, what: str, within: float, interval: float = 0.1) -> None:
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        try:
            if await check():
                return
        except (OSError, TimeoutError, ValueError, IndexError) as exc:
            last = exc
        await asyncio.sleep(interval)
    raise RuntimeError(f"{what}: not within {within:g}s (last error: {last!r})")


class Bed:
    """The processes of one run and their ports."""

    def __init__(self, base: Path, procs: Procs, args: argparse.Namespace) -> None:
        self.base, self.procs, self.args = base, procs, args
        self.ports = {k: free_port() for k in ("tunnel", "http", "https", "metrics", "health")}
        self.server: subprocess.Popen[bytes] | None = None
        self.stream_agent: subprocess.Popen[bytes] | None = None
        self.fleet: list[subprocess.Popen[bytes]] = []
        self.target_port = 0

    @property
    def certs(self) -> Path:
        return self.base / "certs"

    def setup(self) -> None:
        init_pki(self.certs, ("localhost", "127.0.0.1"), (STREAM_NODE,))
        ca, ca_key = load_cert(self.certs / "ca.crt"), load_key(self.certs / "ca.key")
        fleet = self.base / "fleet"
        fleet.mkdir()
        for i in range(self.args.agents):
            cert, key = issue_client_cert(ca, ca_key, fleet_node(i))
            write_pem_cert(fleet / f"{fleet_node(i)}.crt", cert)
            write_pem_key(fleet / f"{fleet_node(i)}.key", key)
        (self.base / "inventory.yaml").write_text(inventory(self.args.agents))
        port_file = self.base / "target.port"
        target = self.procs.start(
            "target", [sys.executable, "-m", "benchmarks.scale", "--target", str(port_file)]
        )
        deadline = time.monotonic() + 15
        while not (port_file.exists() and port_file.read_text()):
            if target.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the target did not start")
            time.sleep(0.05)
        self.target_port = int(port_file.read_text())

    def start_server(self) -> float:
        """Start the server; returns the wall-clock time it was spawned."""
        p = self.ports
        spawned = time.time()
        self.server = self.procs.start(
            "server",
            [
                sys.executable, "-m", "ravenproxy", "server",
                "--inventory", str(self.base / "inventory.yaml"),
                "--ca-file", str(self.certs / "ca.crt"),
                "--cert-file", str(self.certs / "server.crt"),
                "--key-file", str(self.certs / "server.key"),
                "--tunnel-addr", f"127.0.0.1:{p['tunnel']}",
                "--http-addr", f"127.0.0.1:{p['http']}",
                "--https-addr", f"127.0.0.1:{p['https']}",
                "--metrics-addr", f"127.0.0.1:{p['metrics']}",
                "--health-addr", f"127.0.0.1:{p['health']}",
                "--max-front-connections", "100000",  # lowered to the descriptor limit's cap
                "--max-streams-per-client", "100000",
                "--drain-timeout", "5",
                "--log-level", "WARNING",
            ],
        )  # fmt: skip
        return spawned

    async def wait_ready(self) -> float:
        """Until the server's /readyz is 200; returns the wall-clock time it was seen."""
        port = self.ports["health"]

        async def ready() -> bool:
            if self.server is not None and self.server.poll() is not None:
                tail = (self.base / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the server exited ({self.server.returncode}):\n{tail}")
            return (await http_get(port, "/readyz"))[0] == 200

        await until(ready, "server ready", 30, interval=0.01)
        return time.time()

    def start_fleet(self) -> None:
        n, workers = self.args.agents, max(1, self.args.fleet_processes)
        per = -(-n // workers)
        for first in range(0, n, per):
            proc = self.procs.start(
                f"fleet-{first}",
                [
                    sys.executable, "-m", "benchmarks.scale",
                    "--fleet", str(self.base),
                    "--first", str(first),
                    "--count", str(min(per, n - first)),
                    "--server-addr", f"wss://127.0.0.1:{self.ports['tunnel']}",
                ],
            )  # fmt: skip
            self.fleet.append(proc)

    def start_stream_agent(self) -> None:
        self.stream_agent = self.procs.start(
            "agent-edge-s",
            [
                sys.executable, "-m", "ravenproxy", "agent",
                "--node-name", STREAM_NODE,
                "--server-addr", f"wss://127.0.0.1:{self.ports['tunnel']}",
                "--ca-file", str(self.certs / "ca.crt"),
                "--cert-file", str(self.certs / f"{STREAM_NODE}.crt"),
                "--key-file", str(self.certs / f"{STREAM_NODE}.key"),
                "--allow", f"127.0.0.1:{self.target_port}",
                "--log-level", "WARNING",
            ],
        )  # fmt: skip

    @property
    def dest(self) -> str:
        return f"{STREAM_NODE}:{self.target_port}"


# -- measurements -------------------------------------------------------------------------------
async def open_stream(http: int, dest: str) -> socket.socket | None:
    """One idle CONNECT stream (its raw socket), or None when the front refused or closed it."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", http))
        await loop.sock_sendall(sock, f"CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n".encode())
        head = b""
        async with asyncio.timeout(20):
            while b"\r\n\r\n" not in head:
                chunk = await loop.sock_recv(sock, 4096)
                if not chunk:
                    break
                head += chunk
        if head.startswith(b"HTTP/1.1 200"):
            return sock
    except (OSError, TimeoutError):
        pass
    sock.close()
    return None


async def open_streams(
    http: int, dest: str, n: int, parallel: int = 100
) -> tuple[list[socket.socket], int]:
    gate = asyncio.Semaphore(parallel)

    async def one() -> socket.socket | None:
        async with gate:
            return await open_stream(http, dest)

    results = await asyncio.gather(*(one() for _ in range(n)))
    opened = [s for s in results if s is not None]
    return opened, n - len(opened)


async def probe_latency(http: int, dest: str, count: int) -> dict[str, Any]:
    """``count`` sequential GETs on one keep-alive connection through the tunnel."""
    reader, writer = await asyncio.open_connection("127.0.0.1", http)
    request = f"GET /ping HTTP/1.1\r\nHost: {dest}\r\n\r\n".encode()
    times = []
    errors = 0
    try:
        for _ in range(count):
            began = time.perf_counter()
            writer.write(request)
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                await reader.readexactly(len(BODY))
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                errors += 1
                break
            if not head.startswith(b"HTTP/1.1 200"):
                errors += 1
            times.append((time.perf_counter() - began) * 1000)
    finally:
        writer.close()
    return {"requests": len(times), "errors": errors, **percentiles(times, "ms", 3)}


def percentiles(values: list[float], unit: str, digits: int) -> dict[str, float | None]:
    ordered = sorted(values)

    def pct(p: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))], digits)

    return {
        f"p50_{unit}": pct(0.50),
        f"p99_{unit}": pct(0.99),
        f"max_{unit}": round(ordered[-1], digits) if ordered else None,
    }


async def measure_agents(bed: Bed) -> dict[str, Any]:
    assert bed.server is not None
    await asyncio.sleep(SETTLE)
    before = rss_kib(bed.server.pid)
    began = time.monotonic()
    bed.start_fleet()
    n: int = bed.args.agents
    port = bed.ports["metrics"]

    async def all_in() -> bool:
        return await metric(port, "ravenproxy_server_agents_connected") >= n

    await until(all_in, f"{n} agents connected", 180, interval=0.25)
    took = time.monotonic() - began
    await asyncio.sleep(SETTLE)
    after = rss_kib(bed.server.pid)
    row = {
        "agents": n,
        "fleet_processes": bed.args.fleet_processes,
        "seconds_to_connect_all": round(took, 2),
        "server_rss_kib_before": before,
        "server_rss_kib_after": after,
        "server_kib_per_agent": round((after - before) / n, 2),
    }
    print(json.dumps(row), file=sys.stderr)
    return row


async def measure_streams(bed: Bed) -> dict[str, Any]:
    assert bed.server is not None and bed.stream_agent is not None
    http, dest = bed.ports["http"], bed.dest
    # Warm-up: imports, first allocations on both sides, before the baseline.
    warm, _ = await open_streams(http, dest, 10)
    for s in warm:
        s.close()
    await probe_latency(http, dest, 50)
    await asyncio.sleep(SETTLE)
    base_server, base_agent = rss_kib(bed.server.pid), rss_kib(bed.stream_agent.pid)
    baseline_latency = await probe_latency(http, dest, bed.args.probes)
    rows = []
    held: list[socket.socket] = []
    refused_total = 0
    try:
        for count in bed.args.streams:
            want = count - len(held) - refused_total
            if want > 0:
                opened, refused = await open_streams(http, dest, want)
                held += opened
                refused_total += refused
            if refused_total:
                # At the server's front connection cap the probe itself would be closed at
                # once: give back a few slots for it.
                for s in held[-PROBE_ROOM:]:
                    s.close()
                del held[-PROBE_ROOM:]
            await asyncio.sleep(SETTLE)
            server, agent = rss_kib(bed.server.pid), rss_kib(bed.stream_agent.pid)
            latency = await probe_latency(http, dest, bed.args.probes)
            open_now = len(held)
            row = {
                "streams_asked": count,
                "streams_open": open_now,
                "refused": refused_total,
                "server_rss_kib": server,
                "agent_rss_kib": agent,
                "server_kib_per_stream": round((server - base_server) / open_now, 2)
                if open_now
                else None,
                "agent_kib_per_stream": round((agent - base_agent) / open_now, 2)
                if open_now
                else None,
                "latency": latency,
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    finally:
        for s in held:
            s.close()
    # Until the server has closed them all: a restart right away would find them draining.
    port = bed.ports["metrics"]

    async def closed() -> bool:
        return await metric(port, "ravenproxy_server_streams_open") == 0

    await until(closed, "streams closed on the server", 120, interval=0.25)
    return {
        "baseline": {
            "server_rss_kib": base_server,
            "agent_rss_kib": base_agent,
            "latency": baseline_latency,
        },
        "rows": rows,
    }


async def measure_restart(bed: Bed) -> dict[str, Any]:
    assert bed.server is not None
    n = bed.args.agents
    dials_ok, dials_failed = await fleet_dials(bed)
    fleet_cpu = sum(cpu_seconds(p.pid) for p in bed.fleet)
    busy, total = machine_busy()
    overflows = listen_overflows()
    signalled = time.time()
    code = Procs.stop_one(bed.server)
    stopped = time.time()
    spawned = bed.start_server()
    ready = await bed.wait_ready()
    port = bed.ports["metrics"]
    gauge: list[tuple[float, float]] = []
    deadline = time.monotonic() + bed.args.restart_timeout

    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
            gauge.append(
                (
                    round(time.time() - ready, 3),
                    await metric(port, "ravenproxy_server_agents_connected"),
                )
            )
        returned = {
            node for node, what, when in read_events(bed.base) if what == "up" and when >= signalled
        }
        if len(returned) >= n:
            break
        await asyncio.sleep(GAUGE_EVERY)
    # The CPU the fleet and the new server used from the SIGTERM until the last agent was back
    # (or the timeout): a fleet that needs most of the cores would limit the result itself.
    elapsed = time.time() - signalled
    fleet_cpu = sum(cpu_seconds(p.pid) for p in bed.fleet) - fleet_cpu
    server_cpu = cpu_seconds(bed.server.pid) if bed.server is not None else 0.0
    busy_now, total_now = machine_busy()
    ok_now, failed_now = await fleet_dials(bed)
    cores = os.cpu_count() or 1
    cpu = {
        "seconds": round(elapsed, 2),
        "cores": cores,
        "fleet_cpu_s": round(fleet_cpu, 2),
        "new_server_cpu_s": round(server_cpu, 2),
        "machine_busy_cpu_s": round(busy_now - busy, 2),
        "fleet_share_of_machine": round(fleet_cpu / (elapsed * cores), 3),
        "machine_busy_share": round((busy_now - busy) / (total_now - total), 3),
        "listen_overflows": listen_overflows() - overflows,
    }
    dials = {"ok": ok_now - dials_ok, "failed": failed_now - dials_failed}
    back: dict[str, float] = {}
    for node, what, when in read_events(bed.base):
        if what == "up" and when >= signalled and node not in back:
            back[node] = when
    delays = [max(0.0, when - ready) for when in back.values()]
    row = {
        "agents": n,
        "server_exit_code": code,
        "server_stop_seconds": round(stopped - signalled, 2),
        "server_start_to_ready_seconds": round(ready - spawned, 2),
        "returned": len(back),
        "missing": n - len(back),
        **percentiles(delays, "s", 3),
        "mean_s": round(sum(delays) / len(delays), 3) if delays else None,
        "returned_within_10s": sum(d <= 10 for d in delays),
        # From the new server's spawn instead (its tunnel listener takes agents before its
        # /readyz is 200: a server busy with returning agents is ready later).
        "from_spawn": percentiles([when - spawned for when in back.values()], "s", 3),
        "cpu_during_restart": cpu,
        "fleet_dials_during_restart": dials,
        "return_times_s": sorted(round(d, 3) for d in delays),
        "agents_connected_gauge": gauge,
    }
    print(
        json.dumps(
            {k: v for k, v in row.items() if k not in ("return_times_s", "agents_connected_gauge")}
        ),
        file=sys.stderr,
    )
    return row


def machine() -> dict[str, Any]:
    def version(pkg: str) -> str:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(HERE), *args], capture_output=True, text=True, check=False
        )

    return {
        "nproc": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "uvloop": version("uvloop"),
        "websockets": version("websockets"),
        "git_commit": git("rev-parse", "--short", "HEAD").stdout.strip(),
        "git_branch": git("rev-parse", "--abbrev-ref", "HEAD").stdout.strip(),
        "git_tracked_changes": git("diff", "--quiet", "HEAD").returncode != 0,
        "fd_limit": raise_fd_limit(),
        "loadavg_at_start": list(os.getloadavg()),
    }


async def measure(bed: Bed) -> dict[str, Any]:
    bed.start_server()
    await bed.wait_ready()
    agents = await measure_agents(bed)
    bed.start_stream_agent()

    async def routable() -> bool:
        opened, _ = await open_streams(bed.ports["http"], bed.dest, 1)
        for s in opened:
            s.close()
        return bool(opened)

    await until(routable, f"{bed.dest} routable", 30)
    streams = await measure_streams(bed) if bed.args.streams else None
    restart = await measure_restart(bed) if not bed.args.no_restart else None
    return {"agents": agents, "streams": streams, "restart": restart}


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    info = machine()
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-scale-"))
    procs = Procs(base)
    try:
        bed = Bed(base, procs, args)
        bed.setup()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            results = runner.run(measure(bed))
    finally:
        procs.stop()
        shutil.rmtree(base, ignore_errors=True)
    info["loadavg_at_end"] = list(os.getloadavg())
    return {
        "benchmark": "scale",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": info,
        "settings": {
            "agents": args.agents,
            "fleet_processes": args.fleet_processes,
            "streams": args.streams,
            "probes": args.probes,
            "settle_seconds": SETTLE,
            "agent_backoff": "as on this branch (ravenproxy.backoff: base 0.5 s, cap 30 s)",
            "restart": "SIGTERM (drain 5 s), then a new server on the same ports",
        },
        **results,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    restart = result.get("restart")
    if restart:
        times = restart["return_times_s"]
        left.step(
            times, range(1, len(times) + 1), where="post", label="agents back (their own view)"
        )
        gauge = restart["agents_connected_gauge"]
        if gauge:
            left.plot(
                [t for t, _ in gauge],
                [v for _, v in gauge],
                ".",
                ms=3,
                label="server gauge agents_connected (+1: edge-s)",
            )
        left.axvline(10, color="grey", ls="--", lw=1, label="goal: p99 ≤ 10 s")
        left.set_xlabel("seconds since the restarted server was ready")
        left.set_ylabel("agents with a tunnel up")
        left.set_title(
            f"server restart, {restart['agents']} agents: p50 {restart['p50_s']} s, "
            f"p99 {restart['p99_s']} s, max {restart['max_s']} s",
            fontsize=9,
        )
        left.legend(fontsize=8)
    streams = result.get("streams")
    if streams and streams["rows"]:
        rows = streams["rows"]
        x = [r["streams_open"] for r in rows]
        right.plot(x, [r["server_kib_per_stream"] for r in rows], "o-", label="server KiB/stream")
        right.plot(x, [r["agent_kib_per_stream"] for r in rows], "s-", label="agent KiB/stream")
        right.set_xlabel("idle streams open")
        right.set_ylabel("RSS per idle stream (KiB)")
        twin = right.twinx()
        twin.plot(
            x, [r["latency"]["p99_ms"] for r in rows], "^:", color="C3", label="request p99 ms"
        )
        twin.set_ylabel("request latency p99 (ms)")
        agents = result["agents"]
        right.set_title(
            f"idle streams; server {agents['server_kib_per_agent']} KiB per idle agent "
            f"({agents['agents']} agents)",
            fontsize=9,
        )
        lines = right.get_legend_handles_labels()
        more = twin.get_legend_handles_labels()
        right.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8)
    fig.suptitle(
        f"ravenproxy scale, {result['date']}, commit {result['machine']['git_commit']}", fontsize=10
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=1000, help="agents connected (default 1000)")
    parser.add_argument(
        "--fleet-processes", type=int, default=4, help="processes the agents run in (default 4)"
    )
    parser.add_argument(
        "--streams",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[1000, 5000, 10000],
        help="idle stream counts, ascending (default 1000,5000,10000; empty: skip)",
    )
    parser.add_argument(
        "--probes", type=int, default=200, help="GETs per latency probe (default 200)"
    )
    parser.add_argument(
        "--restart-timeout", type=float, default=120, help="longest wait for the agents' return"
    )
    parser.add_argument("--no-restart", action="store_true", help="skip the restart")
    parser.add_argument("--output", default=str(RESULTS), help="file, or - for stdout")
    parser.add_argument(
        "--plot",
        default=None,
        help=f"PNG (default {PLOT.name} beside a --output file; none with -)",
    )
    parser.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fleet", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--server-addr", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_target_main(args.target))
        return
    if args.fleet is not None:
        raise_fd_limit()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_fleet_main(args))
        return
    if sorted(args.streams) != args.streams:
        parser.error("--streams: counts must ascend")
    # SIGTERM (a `timeout`, a CI stop) must still run the cleanup: every process is in a
    # session of its own and would outlive us otherwise.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_benchmark(args)
    text = json.dumps(result, indent=2) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
        if args.plot:
            plot(result, Path(args.plot))
        return
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    png = Path(args.plot) if args.plot else out.with_suffix(".png")
    plot(result, png)
    print(f"wrote {out} and {png}", file=sys.stderr)


if __name__ == "__main__":
    main()
