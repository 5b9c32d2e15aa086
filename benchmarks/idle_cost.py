"""What idle things cost: RSS per idle stream on the server and on the agent, and RSS per idle
agent on the server.

Real processes on loopback, started through the CLI as in the tests: a TCP target (its own
process: it accepts and holds connections), ``ravenproxy server`` and ``ravenproxy agent``
(certificates from ``init_pki``, an inventory, the target admitted by ``--allow``).

- **streams**: for each N, fresh processes; one warm-up CONNECT (imports, first allocations),
  then VmRSS of server and agent; N idle ``CONNECT edge-1:TARGET`` streams through the HTTP
  front, held open; VmRSS again after a settle; (after - before) / N per side.
- **agents**: a server alone; K tunnels from this process, each with its own node certificate,
  each a library :class:`~ravenproxy.transport.session.Session` (what the agent runs, without
  the agent process); (after - before) / K on the server.
- **agent process**: VmRSS of an idle ``ravenproxy agent`` (server address, certificates,
  inventory, ``--allow``: no metrics, Kubernetes or L3), tunnel up, one stream opened and
  closed; then the same for the agent as shipped (k8s/agent.yaml: ``--kube-model --cert-dir``,
  the model from the tests' Kubernetes API emulator, a valid certificate in the directory), over
  http (``agent_kube_cert_dir``) and, as in a cluster, over https with the CA in the kubeconfig
  (``agent_kube_https``: a TLS front on the emulator); beside them an idle ``ssh -R`` client
  through a private sshd (throughput.py's), running a session as the other benchmarks' ssh rows
  do (benchmarks/sshrow.py); with ``--ssh-n`` an idle ``ssh -N -R`` client too.

A CONNECT takes one front connection, and the server caps its front connections at 7/16 of its
descriptor limit (an eighth kept in reserve, two descriptors per connection): with a hard limit
of 20 000 that is 8 750 streams per server, so the largest row is 8 500, not 10 000.

    .venv/bin/python benchmarks/idle_cost.py --label after     # 1000,5000,8500 streams; 500 agents
    .venv/bin/python benchmarks/idle_cost.py --streams 1000 --agents 100 --output -

Importable: :func:`stream_cost` and :func:`agent_cost` return the rows; :func:`rss_kib` reads a
process's VmRSS.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime
import importlib
import json
import os
import platform
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import uvloop
from websockets.asyncio.client import connect

from ravenproxy.pki import init_pki
from ravenproxy.transport import tls
from ravenproxy.transport.session import Session, SessionConfig, websocket_options

SCRIPT = Path(__file__).resolve()
HERE = SCRIPT.parent
RESULTS = HERE / "results" / "idle_cost.json"
SETTLE = 2.0
"""Seconds to wait after the last stream opened before reading RSS."""


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far, user and system, all its threads: the scheduler's own
    count in nanoseconds (``/proc/PID/task/*/schedstat``); ``/proc/PID/stat``'s utime + stime
    count 10 ms ticks, too coarse for an idle process (a few ms a minute)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread gone meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def mib(kib: int | None) -> float | None:
    """KiB as MiB (2**20 bytes), two decimals: the unit of the issue's goal, stated."""
    return None if kib is None else round(kib / 1024, 2)


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS), KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def raise_fd_limit() -> int:
    """Soft descriptor limit up to the hard one (children inherit it); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def inventory(nodes: list[str]) -> str:
    return "".join(
        f"---\napiVersion: v1\nkind: Node\nmetadata: {{name: {n}, labels: "
        "{raven.openyurt.io/gateway: gw-edge}}\n"
        "status:\n  addresses: [{type: InternalIP, address: 127.0.0.1}]\n"
        for n in nodes
    )


class Procs:
    """Processes in sessions of their own, stopped by PID in reverse order."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        with (self.base / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env, cwd=cwd,
            )  # fmt: skip
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
        self.procs.clear()

    def stop_one(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.procs.remove(proc)


# -- the target (its own process: ``idle_cost.py --target PORTFILE``) ------------------------
class _Hold(asyncio.Protocol):
    """Accepts and holds: an idle target."""


async def _target_main(port_file: Path) -> None:
    server = await asyncio.get_running_loop().create_server(_Hold, "127.0.0.1", 0, backlog=4096)
    with open(port_file, "w") as f:
        f.write(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


def _wait_file(path: Path, proc: subprocess.Popen[bytes]) -> int:
    for _ in range(400):
        if path.exists() and path.read_text():
            return int(path.read_text())
        if proc.poll() is not None:
            raise RuntimeError("target exited")
        time.sleep(0.05)
    raise RuntimeError("target did not start")


def start_server(base: Path, procs: Procs, nodes: list[str]) -> tuple[int, int, int]:
    """PKI for ``nodes``, an inventory, the server; returns (pid, HTTP front, tunnel port)."""
    certs = base / "certs"
    init_pki(certs, ("localhost", "127.0.0.1"), nodes)
    inv = base / "inventory.yaml"
    inv.write_text(inventory(nodes))
    http, tunnel = free_port(), free_port()
    server = procs.start(
        "server",
        [
            sys.executable, "-m", "ravenproxy", "server",
            "--inventory", str(inv),
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / "server.crt"),
            "--key-file", str(certs / "server.key"),
            "--tunnel-addr", f"127.0.0.1:{tunnel}",
            "--http-addr", f"127.0.0.1:{http}",
            "--https-addr", f"127.0.0.1:{free_port()}",
            "--metrics-addr", f"127.0.0.1:{free_port()}",
            "--health-addr", f"127.0.0.1:{free_port()}",
            "--max-front-connections", "100000",
            "--max-streams-per-client", "100000",
            "--log-level", "WARNING",
        ],
    )  # fmt: skip
    return server.pid, http, tunnel


def start_agent(
    base: Path,
    procs: Procs,
    tunnel: int,
    target_port: int,
    model: list[str] | None = None,
    env: dict[str, str] | None = None,
    checkout: Path | None = None,
) -> int:
    """``ravenproxy agent`` for edge-1; ``model``: its model and credential flags (default: the
    inventory and the certificate files); ``env``: its environment (default: this one's);
    ``checkout``: the checkout whose code it runs (``python -m ravenproxy`` from there; default
    the working directory's)."""
    certs = base / "certs"
    if model is None:
        model = [
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / "edge-1.crt"),
            "--key-file", str(certs / "edge-1.key"),
            "--inventory", str(base / "inventory.yaml"),
        ]  # fmt: skip
    agent = procs.start(
        "agent",
        [
            sys.executable, "-m", "ravenproxy", "agent",
            "--node-name", "edge-1",
            "--server-addr", f"wss://127.0.0.1:{tunnel}",
            *model,
            "--allow", f"127.0.0.1:{target_port}",
            "--log-level", "WARNING",
        ],
        env,
        checkout,
    )  # fmt: skip
    return agent.pid


@contextlib.contextmanager
def _api_emulator() -> Iterator[tuple[Any, Callable[[Any], Any]]]:
    """The tests' Kubernetes API emulator (tests/integration/kube/apiserver.py) on an asyncio
    loop of its own thread (it serves on asyncio's server, this process runs uvloop), and a
    ``call(coroutine)`` that runs a coroutine there. The repository's root goes on sys.path
    when this file runs as a script."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.append(root)
    emulator: Any = importlib.import_module("tests.integration.kube.apiserver")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="api-emulator", daemon=True)
    thread.start()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    async def start() -> Any:
        api = emulator.APIServer()
        await api.start()
        return api

    try:
        api = call(start())
        try:
            yield api, call
        finally:
            call(api.close())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def kube_agent_flags(base: Path, api: Any, call: Callable[[Any], Any]) -> list[str]:
    """The shipped DaemonSet's model and credential flags (``--kube-model --cert-dir``) against
    the API emulator ``api``: edge-1 and its Gateway in the API, a kubeconfig with edge-1's
    node token, a certificate directory already holding a valid key, certificate and CA."""
    certs = base / "certs"
    call(
        api.put(
            "nodes",
            {
                "metadata": {"name": "edge-1", "labels": {"raven.openyurt.io/gateway": "gw-edge"}},
                "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]},
            },
        )
    )
    call(
        api.put(
            "gateways",
            {"metadata": {"name": "gw-edge"}, "spec": {"endpoints": [{"nodeName": "edge-1"}]}},
        )
    )
    token = api.add_node_user("edge-1")
    kubeconfig = base / "agent.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": api.url}}],
                "users": [{"name": "emu", "user": {"token": token}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    cert_dir = base / "cert-dir"
    cert_dir.mkdir()
    for src, dst in (("ca.crt", "ca.crt"), ("edge-1.crt", "tls.crt"), ("edge-1.key", "tls.key")):
        shutil.copy(certs / src, cert_dir / dst)
    (cert_dir / "tls.key").chmod(0o600)
    return ["--kube-model", "--kubeconfig", str(kubeconfig), "--cert-dir", str(cert_dir)]


async def _tls_front(api: Any, certs: Path) -> asyncio.Server:
    """A TLS listener (``certs``' server certificate, for 127.0.0.1) relaying each connection
    to the API emulator ``api``, on the running loop (the emulator's)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs / "server.crt", certs / "server.key")
    port = int(api.url.rstrip("/").rsplit(":", 1)[1])

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(
            pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True
        )

    return await asyncio.start_server(relay, "127.0.0.1", 0, ssl=ctx)


def _https_kubeconfig(base: Path, port: int) -> None:
    """:func:`kube_agent_flags`' kubeconfig pointed at ``https://127.0.0.1:PORT`` with the
    cluster's CA as ``certificate-authority-data``."""
    path = base / "agent.kubeconfig"
    config = json.loads(path.read_text())
    ca = base64.b64encode((base / "certs" / "ca.crt").read_bytes()).decode()
    config["clusters"][0]["cluster"] = {
        "server": f"https://127.0.0.1:{port}",
        "certificate-authority-data": ca,
    }
    path.write_text(json.dumps(config))


async def open_connect(http: int, dest: str) -> socket.socket | None:
    """One CONNECT through the HTTP front; the socket once it is established, else None."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", http))
        await loop.sock_sendall(sock, f"CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            data = await loop.sock_recv(sock, 4096)
            if not data:
                break
            head += data
        if head.startswith(b"HTTP/1.1 200"):
            return sock
    except OSError:
        pass
    sock.close()
    return None


async def open_idle_streams(http: int, dest: str, n: int, parallel: int = 100) -> list[Any]:
    """``n`` established CONNECT streams (fewer if some failed), ``parallel`` opens at once."""
    gate = asyncio.Semaphore(parallel)

    async def one() -> socket.socket | None:
        async with gate:
            return await open_connect(http, dest)

    socks = await asyncio.gather(*(one() for _ in range(n)))
    return [s for s in socks if s is not None]


async def _wait_routable(http: int, dest: str) -> None:
    for _ in range(300):
        sock = await open_connect(http, dest)
        if sock is not None:
            sock.close()
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the tunnel did not become routable")


async def _streams_row(base: Path, n: int) -> dict[str, Any]:
    procs = Procs(base)
    try:
        port_file = base / "target.port"
        target = procs.start("target", [sys.executable, str(SCRIPT), "--target", str(port_file)])
        target_port = _wait_file(port_file, target)
        server_pid, http, tunnel = start_server(base, procs, ["edge-1"])
        agent_pid = start_agent(base, procs, tunnel, target_port)
        dest = f"edge-1:{target_port}"
        await _wait_routable(http, dest)
        warm = await open_idle_streams(http, dest, 10)  # first allocations, lazy imports
        await asyncio.sleep(SETTLE)
        for s in warm:
            s.close()
        await asyncio.sleep(SETTLE)
        before = {"server": rss_kib(server_pid), "agent": rss_kib(agent_pid)}
        started = time.monotonic()
        socks = await open_idle_streams(http, dest, n)
        opened = time.monotonic() - started
        await asyncio.sleep(SETTLE)
        after = {"server": rss_kib(server_pid), "agent": rss_kib(agent_pid)}
        for s in socks:
            s.close()
        held = len(socks)
        row: dict[str, Any] = {"streams": n, "established": held, "open_seconds": round(opened, 2)}
        for side in ("server", "agent"):
            row[f"{side}_rss_before_kib"] = before[side]
            row[f"{side}_rss_after_kib"] = after[side]
            row[f"{side}_kib_per_stream"] = (
                round((after[side] - before[side]) / held, 2) if held else None
            )
        return row
    finally:
        procs.stop()


async def _ssh_client_rss(base: Path, target_port: int, ssh_n: bool = False) -> dict[str, Any]:
    """An idle ``ssh -R`` client (a private sshd, throughput.py's) forwarding to the target,
    running a session as the other benchmarks' ssh rows do: its VmRSS, KiB; with ``ssh_n``
    also an idle ``ssh -N -R`` client's; the reason instead when sshd cannot run here."""
    # throughput.py sits beside this file: importable as benchmarks.throughput under -m, as
    # throughput when this file runs as a script (its folder is then sys.path[0]).
    throughput: Any = importlib.import_module(
        "benchmarks.throughput" if __package__ else "throughput"
    )
    procs = throughput.Procs()
    try:
        ssh = await throughput.start_sshd(procs, base)
        cipher = throughput.SSH_CIPHERS[0][1]
        _, client = await throughput.start_ssh_forward(procs, ssh, cipher, target_port)
        no_session = None
        if ssh_n:
            _, no_session = await throughput.start_ssh_forward(
                procs, ssh, cipher, target_port, session=False
            )
        await asyncio.sleep(SETTLE)
        row = {
            "ssh_client_rss_kib": rss_kib(client.pid),
            "ssh_client": throughput.describe(session=True),
            "ssh_version": ssh.version,
        }
        if no_session is not None:
            row["ssh_n_client_rss_kib"] = rss_kib(no_session.pid)
        return row
    except RuntimeError as exc:
        return {"ssh_client_rss_kib": None, "ssh_error": str(exc)}
    finally:
        await procs.stop()


def bytecode_env(mode: str, base: Path) -> dict[str, str] | None:
    """The agent's environment for ``mode``: ``cached``, every module it imports loaded from
    cached bytecode, as an image should run it (a bytecode cache of its own, under ``base``,
    filled by a first run of the same command: see :func:`agent_process`); ``environment``,
    this process's environment as it is (here PYTHONDONTWRITEBYTECODE=1 and a checkout with no
    ``__pycache__``: the agent compiles its own modules from source at every start, which
    leaves ~0.6 MB more in its heap; the rows before 2026-12-03 evening were taken so)."""
    if mode == "environment":
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(base / "bytecode")
    return env


async def agent_process(
    bytecode: str = "cached",
    ssh_n: bool = False,
    *,
    checkout: Path | None = None,
    ssh: bool = True,
    cpu: float = 0.0,
) -> dict[str, Any]:
    """VmRSS of an idle ``ravenproxy agent`` process started with the flags an edge node needs
    (server address, certificates, inventory, ``--allow``; no metrics, no Kubernetes, no L3),
    its tunnel up and one stream opened and closed; then as shipped (``--kube-model --cert-dir``,
    the API emulator over http, then over https with its CA in the kubeconfig); beside it, an
    idle ``ssh -R`` client (and with ``ssh_n`` an idle ``ssh -N -R`` one; none without
    ``ssh``). ``bytecode``: see :func:`bytecode_env`; ``checkout``: whose code the agent runs
    (see :func:`start_agent`).
    ``cpu`` seconds: each agent's CPU while idle that long after its RSS is read, as seconds
    an hour (its two 1 Hz file pollers, its tunnel's keepalive). RSS is in KiB (``*_kib``,
    1 024 bytes) and MiB (``*_mib``, 2**20 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-idle-agent-"))
    env = bytecode_env(bytecode, base)
    procs = Procs(base)
    try:
        port_file = base / "target.port"
        target = procs.start("target", [sys.executable, str(SCRIPT), "--target", str(port_file)])
        target_port = _wait_file(port_file, target)
        _, http, tunnel = start_server(base, procs, ["edge-1"])
        dest = f"edge-1:{target_port}"

        async def idle_rss(model: list[str] | None, name: str) -> None:
            if env is not None:  # a first run writes the bytecode of what it imports
                agent = start_agent(base, procs, tunnel, target_port, model, env, checkout)
                await _wait_routable(http, dest)
                procs.stop_one(next(p for p in procs.procs if p.pid == agent))
            agent = start_agent(base, procs, tunnel, target_port, model, env, checkout)
            await _wait_routable(http, dest)
            for s in await open_idle_streams(http, dest, 1):
                s.close()
            await asyncio.sleep(SETTLE)
            row[f"{name}_rss_kib"] = rss_kib(agent)
            row[f"{name}_rss_mib"] = mib(row[f"{name}_rss_kib"])
            if cpu:
                before = cpu_seconds(agent)
                await asyncio.sleep(cpu)
                row[f"{name}_cpu_s_per_hour"] = round((cpu_seconds(agent) - before) * 3600 / cpu, 3)
            procs.stop_one(next(p for p in procs.procs if p.pid == agent))

        row: dict[str, Any] = {"bytecode": bytecode, "processes_commit": _commit(checkout)}
        await idle_rss(None, "agent")
        # As shipped (k8s/agent.yaml): the model from the API, credentials from --cert-dir.
        with _api_emulator() as (api, call):
            flags = kube_agent_flags(base, api, call)
            await idle_rss(flags, "agent_kube_cert_dir")
            # And as in a cluster: the API over https, its CA in the kubeconfig (a service
            # account's ca.crt), through a TLS front on the emulator's loop.
            front = call(_tls_front(api, base / "certs"))
            try:
                _https_kubeconfig(base, front.sockets[0].getsockname()[1])
                await idle_rss(flags, "agent_kube_https")
            finally:
                front.close()
        if ssh:
            row.update(await _ssh_client_rss(base, target_port, ssh_n))
        if row.get("ssh_client_rss_kib"):
            row["ratio"] = round(row["agent_rss_kib"] / row["ssh_client_rss_kib"], 1)
            row["ratio_kube_cert_dir"] = round(
                row["agent_kube_cert_dir_rss_kib"] / row["ssh_client_rss_kib"], 1
            )
        print(json.dumps(row), file=sys.stderr)
        return row
    finally:
        procs.stop()
        shutil.rmtree(base, ignore_errors=True)


async def stream_cost(counts: list[int]) -> list[dict[str, Any]]:
    """One row per N: RSS per idle stream on the server and on the agent (fresh processes)."""
    rows = []
    for n in counts:
        base = Path(tempfile.mkdtemp(prefix="ravenproxy-idle-"))
        try:
            row = await _streams_row(base, n)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    return rows


async def _agent_tunnel(
    ctx: ssl.SSLContext, url: str, node: str, config: SessionConfig
) -> tuple[Session, asyncio.Task[None]]:
    ws = await connect(
        url,
        ssl=ctx,
        open_timeout=30,
        proxy=None,
        **websocket_options(config.wire),
    )
    session = Session(ws, server_side=False, config=config, name=node)
    task = asyncio.create_task(session.run(), name=f"idle-agent:{node}")
    await session.wait_ready()
    return session, task


async def agent_cost(k: int, parallel: int = 50) -> dict[str, Any]:
    """RSS per idle agent on the server: ``k`` tunnels from this process, own certificates."""
    base = Path(tempfile.mkdtemp(prefix="ravenproxy-idle-agents-"))
    procs = Procs(base)
    nodes = [f"edge-{i}" for i in range(k)]
    tasks: list[asyncio.Task[None]] = []
    sessions: list[Session] = []
    try:
        server_pid, _, tunnel = start_server(base, procs, nodes)
        url = f"wss://127.0.0.1:{tunnel}"
        certs = base / "certs"
        ctxs = [
            tls.client_context(certs / "ca.crt", certs / f"{n}.crt", certs / f"{n}.key")
            for n in nodes
        ]
        config = SessionConfig()
        for _ in range(300):  # the server is up once one tunnel is
            try:
                s, t = await _agent_tunnel(ctxs[0], url, nodes[0], config)
                sessions.append(s)
                tasks.append(t)
                break
            except OSError:
                await asyncio.sleep(0.1)
        await asyncio.sleep(SETTLE)
        before = rss_kib(server_pid)
        gate = asyncio.Semaphore(parallel)

        async def one(i: int) -> None:
            async with gate:
                s, t = await _agent_tunnel(ctxs[i], url, nodes[i], config)
                sessions.append(s)
                tasks.append(t)

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(1, k)))
        opened = time.monotonic() - started
        await asyncio.sleep(SETTLE)
        after = rss_kib(server_pid)
        row = {
            "agents": k,
            "connect_seconds": round(opened, 2),
            "server_rss_before_kib": before,
            "server_rss_after_kib": after,
            "server_kib_per_agent": round((after - before) / (k - 1), 2),
        }
        print(json.dumps(row), file=sys.stderr)
        return row
    finally:
        for s in sessions:
            with contextlib.suppress(Exception):
                await s.close("benchmark done")
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        procs.stop()
        shutil.rmtree(base, ignore_errors=True)


def _commit(where: Path | None = HERE) -> str:
    return subprocess.run(
        ["git", "-C", str(where or Path.cwd()), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip


async def run(
    streams: list[int],
    agents: int,
    process: bool = True,
    bytecode: str = "cached",
    ssh_n: bool = False,
    baseline: Path | None = None,
    rounds: int = 1,
    cpu: float = 0.0,
) -> dict[str, Any]:
    fd_limit = raise_fd_limit()
    alternated = None
    if process and baseline is not None:
        alternated = await agent_process_alternated(baseline, rounds, bytecode, cpu)
        process = False
    return {
        "benchmark": "idle_cost",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "nproc": os.cpu_count(),
            "python": platform.python_version(),
            "git_commit": _commit(),
            # The processes run `python -m ravenproxy` from here: its checkout's code.
            "processes_commit": _commit(Path.cwd()),
            "fd_limit": fd_limit,
            "loadavg_at_start": list(os.getloadavg()),
        },
        "streams": await stream_cost(streams) if streams else [],
        "agents": await agent_cost(agents) if agents else None,
        "agent_process": await agent_process(bytecode, ssh_n, cpu=cpu) if process else None,
        "agent_process_alternated": alternated,
    }


async def agent_process_alternated(
    baseline: Path, rounds: int, bytecode: str, cpu: float
) -> dict[str, Any]:
    """:func:`agent_process` for ``baseline``'s code and the working directory's, alternated
    (baseline, this, baseline, this, ...) ``rounds`` times; the ssh client once, in the first
    round of this checkout. Each figure's values by checkout, in round order."""
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        for name, checkout in (("baseline", baseline), ("this", None)):
            row = await agent_process(
                bytecode, checkout=checkout, ssh=r == 0 and name == "this", cpu=cpu
            )
            rows.append({"checkout": name, "round": r, **row})
    figures = [k for k in rows[0] if k.endswith(("_kib", "_mib", "_per_hour"))]
    return {
        "rows": rows,
        "by_checkout": {
            name: {k: [row[k] for row in rows if row["checkout"] == name] for k in figures}
            for name in ("baseline", "this")
        },
    }


def _agent_count(text: str) -> int:
    """``--agents``: 0 (skip) or at least 2 (the first tunnel is a warm-up: the figure is per
    agent after it)."""
    count = int(text)
    if count == 1 or count < 0:
        raise argparse.ArgumentTypeError(
            f"{count}: 0 to skip, or 2 or more (the first is a warm-up)"
        )
    return count


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--streams", type=lambda s: [int(x) for x in s.split(",") if x], default=[1000, 5000, 8500]
    )
    parser.add_argument(
        "--agents",
        type=_agent_count,
        default=500,
        help="idle agents, the first a warm-up left out of the figure: 2 or more (0: skip)",
    )
    parser.add_argument(
        "--no-agent-process", action="store_true", help="skip the idle agent process's RSS"
    )
    parser.add_argument(
        "--agent-bytecode",
        choices=("cached", "environment"),
        default="cached",
        help="the idle agent process's modules: from cached bytecode, as an image runs them "
        "(default), or as this environment runs them (here: compiled at start)",
    )
    parser.add_argument(
        "--ssh-n",
        action="store_true",
        help="beside the idle ssh -R client (a session, as the other benchmarks' ssh rows), an "
        "idle ssh -N -R client too (no session)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout: the idle agent process is measured for its code and this "
        "directory's, alternated (baseline, this, ...) --rounds times",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of --baseline (default 2)")
    parser.add_argument(
        "--cpu",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also each idle agent's CPU over SECONDS after its RSS, as seconds an hour "
        "(/proc/PID/task/*/schedstat)",
    )
    parser.add_argument("--label", default="", help="key to store the run under in --output")
    parser.add_argument("--output", default=str(RESULTS), help="file, or - for stdout")
    parser.add_argument("--target", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.target is not None:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_target_main(args.target))
        return
    # SIGTERM must still run the cleanup: the processes are in sessions of their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result = runner.run(
            run(
                args.streams,
                args.agents,
                not args.no_agent_process,
                args.agent_bytecode,
                args.ssh_n,
                args.baseline,
                args.rounds,
                args.cpu,
            )
        )
    result["machine"]["loadavg_at_end"] = list(os.getloadavg())
    if args.output == "-":
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    out = Path(args.output)
    # Runs are kept side by side under their label (e.g. "before", "after").
    stored = json.loads(out.read_text()) if out.exists() else {}
    stored[args.label or "latest"] = result
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(stored, indent=2) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
