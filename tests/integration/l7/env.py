"""The L7 test bed: real server and agent processes (through the CLI), a fake kubelet process
with its own PKI, and helpers to drive curl and a raw client of a front. Everything runs on
loopback and is stopped by PID.

Topology (inventory written per run):

- cloud-1 (gateway gw-cloud, the server's own node), InternalIP 127.0.0.21: dialled directly;
- edge-1 (gw-edge, has an agent), InternalIP 127.0.0.11: the fake kubelet listens there, its TLS
  port is edge-1's kubelet port, its plain port an "exporter" (``--metrics-port`` on the agent);
- edge-2 (gw-edge, no agent of its own), 127.0.0.12: served by edge-1's agent; nothing listens;
- edge-3 (no gateway, no agent), 127.0.0.13;
- pods default/web-1 on edge-1, default/away on edge-3.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from ravenproxy.pki.authority import generate_ca, issue_client_cert, issue_server_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from tests.helpers import free_port, run, spawn, stop
from tests.integration.cluster import Cluster

EDGE_IP = "127.0.0.11"
EDGE2_IP = "127.0.0.12"
EDGE3_IP = "127.0.0.13"
CLOUD_IP = "127.0.0.21"
KUBELET_CLIENT_CN = "kube-apiserver-kubelet-client"

INVENTORY = """\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-cloud}}
spec:
  proxyConfig: {{Replicas: 1}}
  endpoints:
  - {{nodeName: cloud-1, type: proxy}}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-edge}}
spec:
  proxyConfig: {{Replicas: 1}}
  endpoints:
  - {{nodeName: edge-1, type: proxy, underNAT: true}}
---
apiVersion: v1
kind: Node
metadata: {{name: cloud-1, labels: {{raven.openyurt.io/gateway: gw-cloud}}}}
status:
  addresses: [{{type: InternalIP, address: {cloud_ip}}}]
  daemonEndpoints: {{kubeletEndpoint: {{Port: {cloud_port}}}}}
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata: {{name: edge-1, labels: {{raven.openyurt.io/gateway: gw-edge}}}}
status:
  addresses: [{{type: InternalIP, address: {edge_ip}}}]
  daemonEndpoints: {{kubeletEndpoint: {{Port: {kubelet_port}}}}}
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata: {{name: edge-2, labels: {{raven.openyurt.io/gateway: gw-edge}}}}
status:
  addresses: [{{type: InternalIP, address: {edge2_ip}}}]
  daemonEndpoints: {{kubeletEndpoint: {{Port: {kubelet_port}}}}}
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata: {{name: edge-3}}
status:
  addresses: [{{type: InternalIP, address: {edge3_ip}}}]
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Pod
metadata: {{namespace: default, name: web-1}}
spec: {{nodeName: edge-1}}
---
apiVersion: v1
kind: Pod
metadata: {{namespace: default, name: away}}
spec: {{nodeName: edge-3}}
"""


@dataclass
class Kubelet:
    popen: subprocess.Popen[bytes]
    tls_port: int
    http_port: int
    log: Path

    def stop(self) -> None:
        stop(self.popen, 5)


def kubelet_pki(base: Path, edge_ip: str, client_cn: str) -> Path:
    """``base/kubelet-pki``: a cluster CA (``ca.crt``), edge-1's kubelet serving certificate
    for its name and ``edge_ip`` (``edge-1.crt``/``.key``), cloud-1's (``cloud-1.crt``/``.key``)
    and a kubelet-client certificate with CN
    ``client_cn`` (``client.crt``/``.key``)."""
    kpki = base / "kubelet-pki"
    kpki.mkdir()
    ca, ca_key = generate_ca("fake-kubelet-ca")
    write_pem_cert(kpki / "ca.crt", ca)
    serving, serving_key = issue_server_cert(ca, ca_key, ["edge-1", edge_ip], common_name="edge-1")
    write_pem_cert(kpki / "edge-1.crt", serving)
    write_pem_key(kpki / "edge-1.key", serving_key)
    # cloud-1's kubelet, which the server dials itself (a test listens with it on cloud_port).
    cloud, cloud_key = issue_server_cert(ca, ca_key, ["cloud-1", CLOUD_IP], common_name="cloud-1")
    write_pem_cert(kpki / "cloud-1.crt", cloud)
    write_pem_key(kpki / "cloud-1.key", cloud_key)
    client, client_key = issue_client_cert(ca, ca_key, client_cn)
    write_pem_cert(kpki / "client.crt", client)
    write_pem_key(kpki / "client.key", client_key)
    return kpki


def start_kubelet(
    base: Path,
    host: str,
    cert: Path,
    key: Path,
    ca: Path | None,
    ports: tuple[int, int] | None = None,
) -> Kubelet:
    """``ports``: (TLS, HTTP) to bind; free ones by default."""
    ready = base / f"kubelet-{host}.json"
    log = base / f"kubelet-{host}.log"
    args = [
        sys.executable, "-m", "tests.fakes.kubelet",
        "--host", host, "--cert", str(cert), "--key", str(key), "--ready-file", str(ready),
    ]  # fmt: skip
    if ca is not None:
        args += ["--ca", str(ca)]
    if ports is not None:
        args += ["--tls-port", str(ports[0]), "--http-port", str(ports[1])]
    popen = spawn(args, log, cwd=Path(__file__).resolve().parents[3])
    deadline = time.monotonic() + 15
    while not ready.exists():
        if popen.poll() is not None or time.monotonic() > deadline:
            popen.kill()
            raise AssertionError(f"fake kubelet did not start:\n{log.read_text()}")
        time.sleep(0.05)
    ports = json.loads(ready.read_text())
    return Kubelet(popen, int(ports["tls"]), int(ports["http"]), log)


@dataclass
class L7:
    base: Path
    cluster: Cluster
    kubelet: Kubelet
    kubelet_ca: Path
    blackhole_port: int
    refused_port: int
    spare_port: int
    """Allowed on edge-1's address; free for a test to listen on."""
    cloud_port: int
    """cloud-1's kubelet port (the server dials it directly); free for a test to listen on."""
    sockets: list[socket.socket] = field(default_factory=list)

    @property
    def http(self) -> int:
        assert self.cluster.server is not None
        return self.cluster.server.ports["http"]

    @property
    def https(self) -> int:
        assert self.cluster.server is not None
        return self.cluster.server.ports["https"]

    @property
    def client_cert(self) -> tuple[str, str]:
        """curl arguments presenting the cluster's kubelet-client certificate (what
        kube-apiserver presents), trusted by the server's ``--front-client-ca-file``."""
        kpki = self.base / "kubelet-pki"
        return ("--cert", str(kpki / "client.crt"), "--key", str(kpki / "client.key"))

    @property
    def ca(self) -> Path:
        """The ravenproxy CA (signs the server's certificate)."""
        return self.cluster.certs / "ca.crt"

    def server_log(self) -> str:
        assert self.cluster.server is not None
        return self.cluster.server.output()

    def stop(self) -> None:
        self.cluster.stop_all()
        self.kubelet.stop()
        for s in self.sockets:
            s.close()


def blackhole(host: str) -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose accept queue is full: further SYNs are dropped, so dials time out."""
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect((host, port))
        except BlockingIOError:
            pass
        fillers.append(c)
    time.sleep(0.05)
    return listener, fillers


def start_l7(base: Path) -> L7:
    cluster = Cluster(base)
    kpki = kubelet_pki(base, EDGE_IP, KUBELET_CLIENT_CN)
    kubelet = start_kubelet(
        base, EDGE_IP, kpki / "edge-1.crt", kpki / "edge-1.key", kpki / "ca.crt"
    )
    hole, fillers = blackhole(EDGE_IP)
    refused_port = free_port(EDGE_IP)  # allowed, nothing listens
    spare_port = free_port(EDGE_IP)
    env = L7(
        base,
        cluster,
        kubelet,
        kpki / "ca.crt",
        hole.getsockname()[1],
        refused_port,
        spare_port,
        free_port(CLOUD_IP),
        [hole, *fillers],
    )
    try:
        cluster.inventory.write_text(
            INVENTORY.format(
                cloud_ip=CLOUD_IP,
                cloud_port=env.cloud_port,
                edge_ip=EDGE_IP,
                edge2_ip=EDGE2_IP,
                edge3_ip=EDGE3_IP,
                kubelet_port=kubelet.tls_port,
            )
        )
        cluster.start_server(
            "--kubelet-ca-file", str(kpki / "ca.crt"),
            "--kubelet-cert-file", str(kpki / "client.crt"),
            "--kubelet-key-file", str(kpki / "client.key"),
            # The front trusts the cluster CA for its clients (kube-apiserver's kubelet-client
            # certificate): only those get the server's kubelet identity.
            "--front-client-ca-file", str(kpki / "ca.crt"),
            "--dial-timeout", "1",
        )  # fmt: skip
        cluster.start_agent(
            "edge-1",
            f"{EDGE_IP}:{env.blackhole_port}",
            f"{EDGE_IP}:{refused_port}",
            f"{EDGE_IP}:{spare_port}",
            extra=(
                "--inventory", str(cluster.inventory),
                "--metrics-port", str(kubelet.http_port),
                "--dial-timeout", "1",
            ),
        )  # fmt: skip
        asyncio.run(cluster.wait_routable(f"edge-1:{kubelet.http_port}"))
    except BaseException:
        env.stop()
        raise
    return env


def content_length(head: bytes) -> int:
    """An answer head's Content-Length (the last one's, 0 without one): how many body bytes a
    test's client reads after it (a HEAD's answer: none)."""
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return length


async def curl(*args: str, timeout: float = 30) -> tuple[int, str]:
    """curl with the status code appended on a last line; returns (status, body)."""
    code, out, err = await run("curl", "-sS", "-w", "\n%{http_code}", *args, timeout=timeout)
    assert code == 0, f"curl {' '.join(args)} failed ({code}): {err}"
    body, _, status = out.rpartition("\n")
    return int(status), body


@contextlib.asynccontextmanager
async def front_client(
    port: int, *, tls: ssl.SSLContext | None = None, abort: bool = False
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connection to the front on 127.0.0.1:``port`` (``tls``: over TLS), closed when
    the block ends, failing too; ``abort``: reset rather than closed (a client gone mid-way; a
    TLS client whose close would wait for the front's close_notify)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        yield reader, writer
    finally:
        if abort:
            writer.transport.abort()
        else:
            writer.close()
