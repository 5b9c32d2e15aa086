"""Added latency of the L7 path: small GETs at fixed rates, direct vs through the tunnel.

One run starts a tiny HTTP target (its own process: asyncio + uvloop, keep-alive, a 2-byte
body), ``ravenproxy server`` and ``ravenproxy agent`` through the CLI, and then, for each rate,
sends GETs on an *open-loop* schedule (request i is due at ``t0 + i / rate``; its latency is
measured from when it was due, so a stall is charged to every request it delays — no
coordinated omission) over a pool of keep-alive connections:

- ``direct``: client → target;
- ``tunnel``: client → server HTTP front (``Host: edge-1:PORT``) → mTLS WebSocket tunnel →
  agent → target.

    .venv/bin/python benchmarks/latency.py              # 1 000, 2 000 and 4 000 req/s, 5 s each
    .venv/bin/python benchmarks/latency.py --rates 500 --seconds 2 --output -   # quick look

Results (p50/p90/p99/max per row, and the added p50/p99 = tunnel - direct) go to
``benchmarks/results/latency.json``. Loopback numbers are noisy and every process shares the same
cores: compare rows within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import uvloop

from ravenproxy.pki import init_pki

SCRIPT = Path(__file__).resolve()
HERE = SCRIPT.parent
RESULTS = HERE / "results" / "latency.json"
BODY = b"ok"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY

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
class _Target(asyncio.Protocol):
    """Answers every complete request head with a fixed small response (keep-alive)."""

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None

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
            self.transport.write(RESPONSE * answers)


async def _target_main(port_file: Path) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Target, "127.0.0.1", 0, backlog=1024)
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

    def summary(self) -> dict[str, Any]:
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
    name: str, port: int, host_header: str, rate: int, seconds: float, connections: int
) -> Row:
    row = Row(name, rate, seconds)
    request = f"GET /ping HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: latency\r\n\r\n".encode()
    conns = []
    for _ in range(connections):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conns.append((reader, writer))
    # Warm up every connection (and, through the tunnel, its stream) outside the timed part.
    for reader, writer in conns:
        writer.write(request)
        await _read_response(reader)
    total = int(rate * seconds)
    now = time.perf_counter  # uvloop's loop.time() has millisecond resolution
    t0 = now() + 0.05

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
                writer.write(request)
                status = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, RuntimeError, ValueError) as exc:
                row.errors.append(repr(exc))
                return
            if status != 200:
                row.errors.append(f"HTTP {status}")
                continue
            row.latencies.append(now() - due)

    start = now()
    await asyncio.gather(*(worker(c) for c in range(connections)))
    row.elapsed = now() - start
    for _, writer in conns:
        writer.close()
    return row


# -- processes ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Procs:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with (self.base / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

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


def _wait_port_file(path: Path, proc: subprocess.Popen[bytes]) -> int:
    for _ in range(200):
        if path.exists() and path.read_text():
            return int(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError("target exited")
        time.sleep(0.05)
    raise RuntimeError("target did not start")


async def _wait_routable(http: int, host: str) -> None:
    last = ""
    for _ in range(200):
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
    raise RuntimeError(f"tunnel not routable: {last}")


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
        "python": platform.python_version(),
        "uvloop": version("uvloop"),
        "websockets": version("websockets"),
        "h11": version("h11"),
        "git_commit": commit,
        "git_tracked_changes": dirty != 0,
        "loadavg_at_start": list(os.getloadavg()),
    }


def start_processes(base: Path, procs: Procs) -> tuple[int, int]:
    """Target, server and agent; returns (target port, server HTTP front port)."""
    port_file = base / "target.port"
    target = procs.start("target", [sys.executable, str(SCRIPT), "--target", str(port_file)])
    target_port = _wait_port_file(port_file, target)
    init_pki(base / "certs", ("localhost", "127.0.0.1"), ("edge-1",))
    inventory = base / "inventory.yaml"
    inventory.write_text(INVENTORY)
    http, tunnel = free_port(), free_port()
    certs = base / "certs"
    procs.start(
        "server",
        [
            sys.executable, "-m", "ravenproxy", "server",
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
    )  # fmt: skip
    procs.start(
        "agent",
        [
            sys.executable, "-m", "ravenproxy", "agent",
            "--node-name", "edge-1",
            "--server-addr", f"wss://127.0.0.1:{tunnel}",
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / "edge-1.crt"),
            "--key-file", str(certs / "edge-1.key"),
            "--inventory", str(inventory),
            "--allow", f"127.0.0.1:{target_port}",
            "--log-level", "WARNING",
        ],
    )  # fmt: skip
    return target_port, http


async def measure(args: argparse.Namespace, target_port: int, http: int) -> list[dict[str, Any]]:
    host = f"edge-1:{target_port}"
    await _wait_routable(http, host)
    rows = []
    for rate in args.rates:
        for name, port, header in (
            ("direct", target_port, f"127.0.0.1:{target_port}"),
            ("tunnel", http, host),
        ):
            row = await run_row(name, port, header, rate, args.seconds, args.connections)
            summary = row.summary()
            rows.append(summary)
            print(json.dumps(summary), file=sys.stderr)
    return rows


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    machine = _machine()
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-latency-"))
    procs = Procs(base)
    try:
        target_port, http = start_processes(base, procs)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            rows = runner.run(measure(args, target_port, http))
    finally:
        procs.stop()
        shutil.rmtree(base, ignore_errors=True)
    added = []
    for rate in args.rates:
        d = next(r for r in rows if r["path"] == "direct" and r["rate_target"] == rate)
        t = next(r for r in rows if r["path"] == "tunnel" and r["rate_target"] == rate)
        added.append(
            {
                "rate": rate,
                "added_p50_ms": _diff(t["p50_ms"], d["p50_ms"]),
                "added_p99_ms": _diff(t["p99_ms"], d["p99_ms"]),
            }
        )
    machine["loadavg_at_end"] = list(os.getloadavg())
    return {
        "benchmark": "latency",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine,
        "settings": {
            "rates": args.rates,
            "seconds_per_row": args.seconds,
            "connections": args.connections,
            "request": "GET /ping (keep-alive), 2-byte body",
            "schedule": "open loop; latency measured from each request's due time",
        },
        "rows": rows,
        "added_latency": added,
    }


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--rates", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 2000, 4000]
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--output", default=str(RESULTS), help="file, or - for stdout")
    parser.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_target_main(args.target))
        return
    # SIGTERM (a `timeout`, a CI stop) must still run run_benchmark's cleanup: the server,
    # agent and target are in sessions of their own and would outlive us otherwise.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_benchmark(args)
    text = json.dumps(result, indent=2) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
