"""``ravenproxy demo``: the whole L7 path on one machine, with nothing but the package.

Creates a PKI and an inventory, starts ``ravenproxy server`` and ``ravenproxy agent`` as real
processes (mTLS tunnel on loopback), and a sample HTTP target on the edge node that only the
agent's allowlist admits; then sends real requests through ``CONNECT edge-1:PORT``: a small GET,
a streamed response (lines timed as they arrive) and an upload checked by SHA-256.

The target listens on an ordinary port of the edge node (9100, where node-exporter would be,
admitted by the agent's ``--metrics-port``), not on its kubelet port: requests to a kubelet port
are sent on over TLS, which a plain HTTP target does not speak. The HTTP front and the metrics
listen where the README's curl commands expect them (127.0.0.1:10264 and 127.0.0.1:10266).

A temporary directory (it holds ``ca.key``) is removed when the demo ends, also when stopped by
SIGINT or SIGTERM; a ``--dir`` given by the user is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from ravenproxy.client import ConnectRefused, open_tunnel
from ravenproxy.config import Address
from ravenproxy.errors import ConfigError
from ravenproxy.lifecycle import listening
from ravenproxy.pki import init_pki

EDGE_NODE = "edge-1"
CLOUD_NODE = "cloud-1"

INVENTORY = """\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-cloud}}
spec:
  exposeType: PublicIP
  proxyConfig: {{Replicas: 1, proxyHTTPPort: "{port}"}}
  endpoints:
  - {{nodeName: {cloud}, type: proxy, port: 10262, publicIP: 127.0.0.1}}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-edge}}
spec:
  proxyConfig: {{Replicas: 1}}
  endpoints:
  - {{nodeName: {edge}, type: proxy, underNAT: true}}
---
apiVersion: v1
kind: Node
metadata:
  name: {cloud}
  labels: {{raven.openyurt.io/gateway: gw-cloud}}
status:
  addresses: [{{type: InternalIP, address: 127.0.0.1}}]
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata:
  name: {edge}
  labels: {{raven.openyurt.io/gateway: gw-edge}}
status:
  addresses: [{{type: InternalIP, address: 127.0.0.1}}]
  conditions: [{{type: Ready, status: "True"}}]
"""


HTTP_ADDR = Address("127.0.0.1", 10264)
METRICS_ADDR = Address("127.0.0.1", 10266)
TARGET_PORT = 9100


@dataclass(frozen=True)
class DemoOptions:
    directory: Path | None = None
    keep_running: bool = False
    upload_mib: int = 100
    http_addr: Address = HTTP_ADDR
    metrics_addr: Address = METRICS_ADDR
    target_port: int = TARGET_PORT


def curl_commands(front: Address, metrics: Address, target: int) -> list[str]:
    """What ``--keep-running`` prints to paste: the README's Quick start shows these for the
    default addresses (a test runs each of them, from the README, against the demo)."""
    proxy = f"http://{front}"
    node = f"{EDGE_NODE}:{target}"
    commands = [
        (f"curl -x {proxy} http://{node}/hello", "forward proxy"),
        (f"curl -H 'Host: {node}' {proxy}/hello", "Host routing"),
        (f"curl -p -x {proxy} http://{node}/hello", "CONNECT tunnel"),
        (f"curl -N -x {proxy} http://{node}/stream", "lines as they are written"),
        (f"curl -x {proxy} http://edge-9:{target}/hello", "404: no such node"),
        (f"curl -s http://{metrics}/metrics | grep ravenproxy_server_streams", ""),
    ]
    return [f"{c:<60} # {why}" if why else c for c, why in commands]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the sample target: a tiny HTTP/1.1 server standing in for a kubelet -------------------
async def _target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode()
        method, path, _ = line.split(" ", 2)
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (h.partition(":") for h in head.decode().split("\r\n")[1:] if h)
        }
        if method == "GET" and path == "/metrics":
            body = b"# a node-exporter stands here\ndemo_target_up 1\n"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        elif method == "GET" and path == "/hello":
            body = f"hello from {EDGE_NODE}\n".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        elif method == "GET" and path.startswith("/stream"):
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
            )
            for i in range(10):
                writer.write(f"{time.time():.6f} line {i}\n".encode())
                await writer.drain()
                await asyncio.sleep(0.05)
        elif method == "POST" and path == "/upload":
            remaining = int(headers.get("content-length", "0"))
            digest = hashlib.sha256()
            size = 0
            while remaining:
                chunk = await reader.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                digest.update(chunk)
                size += len(chunk)
                remaining -= len(chunk)
            body = f"{digest.hexdigest()} {size}\n".encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def _request(
    front: int, port: int, raw: bytes, body: AsyncIterator[bytes] | None = None
) -> tuple[int, bytes]:
    reader, writer = await open_tunnel("127.0.0.1", front, f"{EDGE_NODE}:{port}")
    try:
        writer.write(raw)
        if body is not None:
            async for chunk in body:
                writer.write(chunk)
                await writer.drain()
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        match = re.search(rb"content-length:\s*(\d+)", head, re.I)
        data = await reader.readexactly(int(match.group(1))) if match else await reader.read()
        return status, data
    finally:
        writer.close()


class _Procs:
    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self, *args: str, log: Path) -> asyncio.subprocess.Process:
        out = log.open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ravenproxy",
            *args,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        out.close()
        self.procs.append(proc)
        return proc

    async def stop(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _wait_for_agent(front: int, port: int, procs: _Procs, deadline: float) -> None:
    last = ""
    while time.monotonic() < deadline:
        for proc in procs.procs:
            if proc.returncode is not None:
                raise RuntimeError(f"a demo process exited early (code {proc.returncode})")
        try:
            _, writer = await open_tunnel("127.0.0.1", front, f"{EDGE_NODE}:{port}")
            writer.close()
            return
        except ConnectRefused as exc:
            last = str(exc)
        except OSError as exc:
            last = str(exc)
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the agent did not come up in time: {last}")


async def _metric(port: int, name: str) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = (await reader.read()).decode()
    writer.close()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _check_free(flag: str, addr: Address) -> None:
    """Fail at once, naming the flag, when an address the server would bind is taken (its
    process would otherwise fail into its log)."""
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.socket())
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((addr.host or "0.0.0.0", addr.port))
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(flag, f"cannot listen on {addr}: {reason}") from None


async def run_demo(options: DemoOptions) -> int:
    """The demo; the directory it made is removed when it ends, SIGINT/SIGTERM included."""
    own_dir = options.directory is None
    _check_free("--http-addr", options.http_addr)
    _check_free("--metrics-addr", options.metrics_addr)
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    signalled: list[int] = []

    def on_signal(sig: int) -> None:
        if not signalled:  # once: a second Ctrl-C must not cut the clean-up short
            main.cancel()
        signalled.append(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-demo-")) if own_dir else options.directory
    assert base is not None
    try:
        return await _run(options, base)
    except asyncio.CancelledError:
        if not signalled:
            raise
        main.uncancel()
        return 0 if options.keep_running else 130
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        if own_dir:
            shutil.rmtree(base, ignore_errors=True)


async def _run(options: DemoOptions, base: Path) -> int:
    own_dir = options.directory is None
    os.makedirs(base, exist_ok=True)
    certs = base / "certs"
    init_pki(certs, ("localhost", "127.0.0.1"), (EDGE_NODE,))
    async with listening("--target-port", f"127.0.0.1:{options.target_port}"):
        target = await asyncio.start_server(_target, "127.0.0.1", options.target_port)
    tport = target.sockets[0].getsockname()[1]
    inventory = base / "inventory.yaml"
    inventory.write_text(INVENTORY.format(port=tport, cloud=CLOUD_NODE, edge=EDGE_NODE))
    tunnel, health = free_port(), free_port()
    front_addr, metrics_addr = options.http_addr, options.metrics_addr
    front, metrics = front_addr.port, metrics_addr.port
    procs = _Procs()
    try:
        await procs.start(
            "server",
            "--inventory",
            str(inventory),
            "--ca-file",
            str(certs / "ca.crt"),
            "--cert-file",
            str(certs / "server.crt"),
            "--key-file",
            str(certs / "server.key"),
            "--node-name",
            CLOUD_NODE,
            "--tunnel-addr",
            f"127.0.0.1:{tunnel}",
            "--http-addr",
            str(front_addr),
            "--https-addr",
            "127.0.0.1:0",
            "--metrics-addr",
            str(metrics_addr),
            "--health-addr",
            f"127.0.0.1:{health}",
            log=base / "server.log",
        )
        await procs.start(
            "agent",
            "--node-name",
            EDGE_NODE,
            "--server-addr",
            f"wss://127.0.0.1:{tunnel}",
            "--ca-file",
            str(certs / "ca.crt"),
            "--cert-file",
            str(certs / f"{EDGE_NODE}.crt"),
            "--key-file",
            str(certs / f"{EDGE_NODE}.key"),
            "--inventory",
            str(inventory),
            "--metrics-port",
            str(tport),
            log=base / "agent.log",
        )
        await _wait_for_agent(front, tport, procs, time.monotonic() + 20)
        print(f"tunnel up: agent {EDGE_NODE} → server 127.0.0.1:{tunnel} (mTLS, TLS 1.3)")

        status, body = await _request(
            front, tport, b"GET /hello HTTP/1.1\r\nHost: edge-1\r\nConnection: close\r\n\r\n"
        )
        assert status == 200 and body == f"hello from {EDGE_NODE}\n".encode(), (status, body)
        print(f"GET  /hello     → {status} {body.decode().strip()!r}")

        reader, writer = await open_tunnel("127.0.0.1", front, f"{EDGE_NODE}:{tport}")
        writer.write(b"GET /stream HTTP/1.1\r\nHost: edge-1\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        delays = []
        while line := await reader.readline():
            sent = float(line.split(b" ", 1)[0])
            delays.append((time.time() - sent) * 1000)
        writer.close()
        assert len(delays) == 10, delays
        print(
            f"GET  /stream    → {len(delays)} lines, each arrived within "
            f"{max(delays):.1f} ms of being written"
        )

        size = options.upload_mib * 1024 * 1024
        digest = hashlib.sha256()

        async def payload() -> AsyncIterator[bytes]:
            block = os.urandom(1 << 20)
            for _ in range(options.upload_mib):
                digest.update(block)
                yield block

        head = (
            f"POST /upload HTTP/1.1\r\nHost: edge-1\r\nContent-Length: {size}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        started = time.monotonic()
        status, body = await _request(front, tport, head, payload())
        elapsed = time.monotonic() - started
        remote_digest, remote_size = body.decode().split()
        assert status == 200 and remote_digest == digest.hexdigest() and int(remote_size) == size
        print(
            f"POST /upload    → {options.upload_mib} MiB, SHA-256 matches "
            f"({remote_digest[:16]}…), {size / elapsed / 1e6:.0f} MB/s"
        )

        opened = await _metric(metrics, 'ravenproxy_server_stream_opens_total{result="ok"}')
        up = await _metric(metrics, 'ravenproxy_server_bytes_total{direction="up"}')
        down = await _metric(metrics, 'ravenproxy_server_bytes_total{direction="down"}')
        print(
            f"summary: {int(opened)} streams opened, {up / 1e6:.1f} MB up, "
            f"{down / 1e3:.1f} kB down (server metrics)"
        )
        if options.keep_running:
            print("\nEverything stays up until Ctrl-C. Try:")
            for command in curl_commands(front_addr, metrics_addr, tport):
                print(f"  {command}")
            kept = "" if own_dir else " (kept)"
            print(f"files and logs: {base}{kept}", flush=True)
            await asyncio.Event().wait()  # until SIGINT or SIGTERM cancels this task
        return 0
    except (AssertionError, RuntimeError, ConnectRefused, OSError) as exc:
        print(f"demo failed: {exc!r}", file=sys.stderr)
        for name in ("server.log", "agent.log"):
            with contextlib.suppress(OSError):
                print(f"--- {name} ---\n" + (base / name).read_text()[-3000:], file=sys.stderr)
        return 1
    finally:
        await procs.stop()
        target.close()
        await target.wait_closed()
