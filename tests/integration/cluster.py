"""Real ravenproxy processes on loopback for integration tests, started through the CLI.

Every process is stopped by its PID when the test ends, also when it fails (the ``cluster``
fixture's teardown); logs land in the test's tmp dir and are printed when a wait fails.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ravenproxy.client import ConnectRefused, open_tunnel
from ravenproxy.pki import init_pki
from ravenproxy.pki.authority import generate_ca, issue_client_cert
from ravenproxy.pki.pemfiles import load_cert, load_key, write_pem_cert, write_pem_key
from tests.helpers import eventually, free_port, scrape, spawn_python, stop

INVENTORY = """\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {name: gw-cloud}
spec:
  proxyConfig: {Replicas: 1}
  endpoints:
  - {nodeName: cloud-1, type: proxy}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {name: gw-edge}
spec:
  proxyConfig: {Replicas: 1}
  endpoints:
  - {nodeName: edge-1, type: proxy, underNAT: true}
---
apiVersion: v1
kind: Node
metadata: {name: cloud-1, labels: {raven.openyurt.io/gateway: gw-cloud}}
status:
  addresses: [{type: InternalIP, address: 127.0.0.1}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Node
metadata: {name: edge-1, labels: {raven.openyurt.io/gateway: gw-edge}}
status:
  addresses: [{type: InternalIP, address: 127.0.0.1}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Node
metadata: {name: edge-2, labels: {raven.openyurt.io/gateway: gw-edge}}
status:
  addresses: [{type: InternalIP, address: 127.0.0.2}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Node
metadata: {name: edge-3}
status:
  addresses: [{type: InternalIP, address: 127.0.0.3}]
  conditions: [{type: Ready, status: "True"}]
"""


@dataclass
class Proc:
    name: str
    args: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    def start(self) -> Proc:
        self.popen = spawn_python(["-m", "ravenproxy", *self.args], self.log)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.running:
            assert self.popen is not None
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.popen is None:
            return None
        return stop(self.popen, timeout)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def fd_count(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    async def wait_until(
        self,
        check: Callable[[], object],
        what: str | Callable[[], str],
        within: float = 20,
        *,
        ignore: tuple[type[Exception], ...] = (),
    ) -> None:
        """Until ``check()`` is truthy (see :func:`eventually`); fails at once, with the log,
        if the process exits meanwhile."""

        def said() -> str:
            return what() if callable(what) else what

        async def alive_and_seen() -> object:
            if not self.running:
                pytest.fail(
                    f"{self.name} exited while waiting for {said()}:\n{self.output()[-3000:]}"
                )
            result = check()
            return await result if inspect.isawaitable(result) else result

        await eventually(
            alive_and_seen,
            within,
            interval=0.1,
            what=lambda: f"{said()}\n{self.output()[-3000:]}",
            ignore=ignore,
        )


class Cluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.certs = base / "certs"
        init_pki(self.certs, ("localhost", "127.0.0.1"), ("edge-1", "edge-2", "edge-3"))
        self.inventory = base / "inventory.yaml"
        self.inventory.write_text(INVENTORY)
        self.procs: list[Proc] = []
        self.server: Proc | None = None
        self.servers: dict[str, Proc] = {}

    # -- credentials -----------------------------------------------------------------------
    def other_ca_cert(self, node: str) -> tuple[Path, Path]:
        """A client cert for ``node`` signed by a CA the server does not trust."""
        ca, ca_key = generate_ca("some-other-ca")
        cert, key = issue_client_cert(ca, ca_key, node)
        return self._write(f"other-{node}", cert, key)

    def expired_cert(self, node: str) -> tuple[Path, Path]:
        """A client cert for ``node`` from the right CA that expired yesterday."""
        ca = load_cert(self.certs / "ca.crt")
        ca_key = load_key(self.certs / "ca.key")
        now = dt.datetime.now(dt.UTC)
        cert, key = issue_client_cert(
            ca,
            ca_key,  # type: ignore[arg-type]
            node,
            not_before=now - dt.timedelta(days=30),
            not_after=now - dt.timedelta(days=1),
        )
        return self._write(f"expired-{node}", cert, key)

    def _write(self, stem: str, cert: object, key: object) -> tuple[Path, Path]:
        crt, k = self.base / f"{stem}.crt", self.base / f"{stem}.key"
        write_pem_cert(crt, cert)  # type: ignore[arg-type]
        write_pem_key(k, key)  # type: ignore[arg-type]
        return crt, k

    # -- processes -------------------------------------------------------------------------
    def start_server(
        self,
        *extra: str,
        ports: dict[str, int] | None = None,
        extra_source: tuple[str, ...] = (),
        name: str = "server",
        cert_dir: Path | None = None,
    ) -> Proc:
        """``extra_source`` replaces ``--inventory FILE`` (e.g. ``--kube-model --kubeconfig F``).
        Several servers: give each its own ``name`` (its log file; with ``--server-id`` in
        ``extra`` for distinct ids); :attr:`server` is the last one started, :attr:`servers`
        all by name (a restart on the same ``ports`` replaces the entry). ``cert_dir``:
        ``--cert-dir`` instead of the embedded PKI's files (give ``--kubeconfig`` too)."""
        ports = ports or {
            "tunnel": free_port(),
            "http": free_port(),
            "https": free_port(),
            "metrics": free_port(),
            "health": free_port(),
        }
        source = list(extra_source) if extra_source else ["--inventory", str(self.inventory)]
        files = (
            ["--cert-dir", str(cert_dir)]
            if cert_dir is not None
            else [
                "--ca-file", str(self.certs / "ca.crt"),
                "--cert-file", str(self.certs / "server.crt"),
                "--key-file", str(self.certs / "server.key"),
            ]
        )  # fmt: skip
        args = [
            "server",
            *source,
            *files,
            "--node-name", "cloud-1",
            "--tunnel-addr", f"127.0.0.1:{ports['tunnel']}",
            "--http-addr", f"127.0.0.1:{ports['http']}",
            "--https-addr", f"127.0.0.1:{ports['https']}",
            "--metrics-addr", f"127.0.0.1:{ports['metrics']}",
            "--health-addr", f"127.0.0.1:{ports['health']}",
            "--log-level", "DEBUG",
            *extra,
        ]  # fmt: skip
        proc = Proc(name, args, self.base / f"{name}.log", ports=dict(ports)).start()
        self.procs.append(proc)
        self.server = proc
        self.servers[name] = proc
        return proc

    def start_agent(
        self,
        node: str,
        *allow: str,
        cert: tuple[Path, Path] | None = None,
        extra: tuple[str, ...] = (),
        servers: tuple[str, ...] | None = None,
        cert_dir: Path | None = None,
    ) -> Proc:
        """``servers``: the ``--server-addr`` values (default: the last server started); empty
        for an agent that finds them otherwise (``--discover-servers`` in ``extra``).
        ``cert_dir``: ``--cert-dir`` instead of the embedded PKI's files (the agent requests
        its certificate from Kubernetes: give ``--kubeconfig`` in ``extra``)."""
        if servers is None:
            assert self.server is not None
            servers = (f"wss://127.0.0.1:{self.server.ports['tunnel']}",)
        crt, key = cert or (self.certs / f"{node}.crt", self.certs / f"{node}.key")
        files = (
            ["--cert-dir", str(cert_dir)]
            if cert_dir is not None
            else [
                "--ca-file", str(self.certs / "ca.crt"),
                "--cert-file", str(crt),
                "--key-file", str(key),
            ]
        )  # fmt: skip
        args = [
            "agent",
            "--node-name", node,
            *[a for addr in servers for a in ("--server-addr", addr)],
            *files,
            "--metrics-addr", f"127.0.0.1:{free_port()}",
            "--log-level", "DEBUG",
            *[a for entry in allow for a in ("--allow", entry)],
            *extra,
        ]  # fmt: skip
        proc = Proc(f"agent-{node}", args, self.base / f"agent-{node}.log")
        proc.ports["metrics"] = int(args[args.index("--metrics-addr") + 1].rsplit(":", 1)[1])
        proc.start()
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"----- {p.name} -----\n{p.output()[-4000:]}" for p in self.procs)

    # -- waits -----------------------------------------------------------------------------
    @property
    def http_port(self) -> int:
        assert self.server is not None
        return self.server.ports["http"]

    async def connect(
        self, target: str, via: Proc | None = None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """``CONNECT target`` through the HTTP front of ``via`` (default: the last server)."""
        port = via.ports["http"] if via is not None else self.http_port
        return await open_tunnel("127.0.0.1", port, target)

    async def wait_routable(self, target: str, timeout: float = 20) -> None:
        """Until ``CONNECT target`` succeeds (the agent is up and may dial it)."""

        async def routable() -> bool:
            _, writer = await self.connect(target)
            writer.close()
            return True

        await eventually(
            routable,
            timeout,
            interval=0.1,
            what=lambda: f"{target} routable\n{self.logs()}",
            ignore=(ConnectRefused, OSError),
        )

    async def wait_up(self, proc: Proc | None = None) -> None:
        """Until the process serves its metrics (it has bound every listener)."""
        await self.wait_metric("ravenproxy_server_agents_connected", lambda v: True, proc=proc)

    async def metrics(self, proc: Proc | None = None) -> dict[str, float]:
        """The process's /metrics as {'name{labels}': value}."""
        proc = proc or self.server
        assert proc is not None
        return await scrape(proc.ports["metrics"])

    async def wait_metric(
        self, key: str, predicate: object, timeout: float = 15, proc: Proc | None = None
    ) -> float:
        """Until ``predicate(value of key)``; fails at once, with the log, if the process
        exits meanwhile (a server that could not bind says why there)."""
        proc = proc or self.server
        assert proc is not None
        seen: list[float] = []

        async def met() -> bool:
            seen.append((await self.metrics(proc)).get(key, 0.0))
            return bool(predicate(seen[-1]))  # type: ignore[operator]

        await proc.wait_until(
            met,
            lambda: f"metric {key} = {seen[-1] if seen else None}",
            timeout,
            ignore=(OSError,),  # not listening yet
        )
        return seen[-1]
