"""The egress test bed: a real server (``--egress-uds`` and ``--egress-addr``) and two real agents,
through the CLI, a fake kubelet with its own PKI, and a client that dials exactly as
kube-apiserver's ``HTTPConnect`` egress dialer does (:func:`egress_dial`).

Topology (pod CIDRs are loopback ranges, so a "pod" is a listener bound inside one):

- cloud-1 (gw-cloud, the server's own node) 127.0.0.21, pods 127.0.60.0/24: dialled directly
  (the server runs with ``--allow-pods``);
- edge-1 (gw-edge, agent with ``--allow-pods``) 127.0.0.11, pods 127.0.50.0/24 (``podCIDRs``);
  the fake kubelet listens on 127.0.0.11;
- edge-2 (gw-edge, served by edge-1's agent) 127.0.0.12, pods 127.0.51.0/26 from the Gateway's
  status subnets only (as the controller writes confirmed Calico blocks);
- edge-3 (gw-solo, agent *without* ``--allow-pods``) 127.0.0.13, pods 127.0.52.0/24.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path

from ravenproxy.pki.authority import generate_ca, issue_client_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from tests.helpers import free_port
from tests.integration.cluster import Cluster
from tests.integration.l7.env import Kubelet, kubelet_pki, start_kubelet

EDGE_IP, EDGE2_IP, EDGE3_IP, CLOUD_IP = "127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.21"
EDGE_POD = "127.0.50.7"
EDGE2_POD = "127.0.51.9"
EDGE3_POD = "127.0.52.7"
CLOUD_POD = "127.0.60.7"
NOWHERE = "127.0.99.7"
"""In no node's addresses and no pod CIDR."""

INVENTORY = """\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-cloud}}
spec:
  endpoints: [{{nodeName: cloud-1, type: proxy}}]
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-edge}}
spec:
  endpoints: [{{nodeName: edge-1, type: proxy, underNAT: true}}]
status:
  nodes:
  - {{nodeName: edge-1, privateIP: {edge_ip}, subnets: [127.0.50.0/24]}}
  - {{nodeName: edge-2, privateIP: {edge2_ip}, subnets: [127.0.51.0/26]}}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-solo}}
spec:
  endpoints: [{{nodeName: edge-3, type: proxy, underNAT: true}}]
---
apiVersion: v1
kind: Node
metadata: {{name: cloud-1, labels: {{raven.openyurt.io/gateway: gw-cloud}}}}
spec: {{podCIDRs: [127.0.60.0/24]}}
status:
  addresses: [{{type: InternalIP, address: {cloud_ip}}}]
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata: {{name: edge-1, labels: {{raven.openyurt.io/gateway: gw-edge}}}}
spec: {{podCIDRs: [127.0.50.0/24]}}
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
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata: {{name: edge-3, labels: {{raven.openyurt.io/gateway: gw-solo}}}}
spec: {{podCIDRs: [127.0.52.0/24]}}
status:
  addresses: [{{type: InternalIP, address: {edge3_ip}}}]
  conditions: [{{type: Ready, status: "True"}}]
"""


class ConnectRefused(Exception):
    """The egress listener answered the CONNECT with a status other than 200."""

    def __init__(self, status: int, head: bytes, body: bytes) -> None:
        super().__init__(f"{status}: {body.decode(errors='replace').strip()}")
        self.status = status
        self.head = head
        self.body = body


@dataclass
class Egress:
    base: Path
    cluster: Cluster
    kubelet: Kubelet
    kpki: Path
    uds: Path
    apiserver: Path
    """The PKI of the "apiserver" side: its egress client certificate and the CA that signs it
    (the server's --egress-client-ca-file)."""

    @property
    def tcp(self) -> int:
        assert self.cluster.server is not None
        return self.cluster.server.ports["egress"]

    def egress_tls(self, cert: tuple[Path, Path] | None) -> ssl.SSLContext:
        """The apiserver's egress ``tlsConfig``: the ravenproxy CA as caBundle, ``cert`` as
        clientCert/clientKey (None: none presented)."""
        ctx = ssl.create_default_context(cafile=str(self.cluster.certs / "ca.crt"))
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        return ctx

    @property
    def client_cert(self) -> tuple[Path, Path]:
        return self.apiserver / "egress-client.crt", self.apiserver / "egress-client.key"

    def kubelet_tls(self) -> ssl.SSLContext:
        """What the apiserver uses towards the kubelet: its CA, and the kubelet-client cert."""
        ctx = ssl.create_default_context(cafile=str(self.kpki / "ca.crt"))
        ctx.load_cert_chain(str(self.kpki / "client.crt"), str(self.kpki / "client.key"))
        return ctx

    def stop(self) -> None:
        self.cluster.stop_all()
        self.kubelet.stop()


async def egress_dial(
    target: str,
    *,
    uds: Path | None = None,
    tcp: tuple[str, int] | None = None,
    tls: ssl.SSLContext | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """kube-apiserver's ``tunnelHTTPConnect``, byte for byte: ``CONNECT target HTTP/1.1`` with
    ``Host: 127.0.0.1``, the response read up to its blank line, non-200 refused, and any byte
    buffered after the 200 an error (the apiserver refuses those). Over the Unix socket ``uds``,
    or TLS to ``tcp`` with ``tls``."""
    if uds is not None:
        reader, writer = await asyncio.open_unix_connection(str(uds))
    else:
        assert tcp is not None and tls is not None
        reader, writer = await asyncio.open_connection(*tcp, ssl=tls, server_hostname=tcp[0])
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            body = await asyncio.wait_for(reader.read(), 5)
            raise ConnectRefused(status, head, body)
        # http.ReadResponse, then br.Buffered() > 0 is a failure: nothing may follow the 200
        # before the client speaks (the target, TLS or not, waits for it).
        try:
            extra = await asyncio.wait_for(reader.read(4096), 0.1)
        except TimeoutError:
            extra = b""
        assert extra == b"", f"bytes after the 200: {extra[:80]!r}"
    except BaseException:
        writer.transport.abort()
        raise
    return reader, writer


STREAM_CAP = 4
"""--max-streams-per-client of the server: the HTTP front refuses a fifth stream of one client,
the egress listeners (kube-apiserver's) do not."""


def start_egress(base: Path) -> Egress:
    cluster = Cluster(base)
    kpki = kubelet_pki(base, EDGE_IP, "kube-apiserver-kubelet-client")
    apiserver = base / "apiserver-pki"
    apiserver.mkdir()
    aca, aca_key = generate_ca("apiserver-egress-ca")
    write_pem_cert(apiserver / "ca.crt", aca)
    egress_cert, egress_key = issue_client_cert(aca, aca_key, "kube-apiserver-egress")
    write_pem_cert(apiserver / "egress-client.crt", egress_cert)
    write_pem_key(apiserver / "egress-client.key", egress_key)

    kubelet = start_kubelet(
        base, EDGE_IP, kpki / "edge-1.crt", kpki / "edge-1.key", kpki / "ca.crt"
    )
    env = Egress(base, cluster, kubelet, kpki, base / "egress.sock", apiserver)
    try:
        cluster.inventory.write_text(
            INVENTORY.format(
                cloud_ip=CLOUD_IP,
                edge_ip=EDGE_IP,
                edge2_ip=EDGE2_IP,
                edge3_ip=EDGE3_IP,
                kubelet_port=kubelet.tls_port,
            )
        )
        ports = {k: free_port() for k in ("tunnel", "http", "https", "metrics", "health", "egress")}
        cluster.start_server(
            "--egress-uds", str(env.uds),
            "--egress-addr", f"127.0.0.1:{ports['egress']}",
            "--egress-client-ca-file", str(apiserver / "ca.crt"),
            "--allow-pods",
            "--dial-timeout", "2",
            "--max-streams-per-client", str(STREAM_CAP),
            ports=ports,
        )  # fmt: skip
        inventory = ("--inventory", str(cluster.inventory))
        cluster.start_agent("edge-1", extra=(*inventory, "--allow-pods"))
        cluster.start_agent("edge-3", extra=inventory)
        asyncio.run(cluster.wait_routable(f"edge-1:{kubelet.tls_port}"))
        asyncio.run(cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v >= 2))
    except BaseException:
        env.stop()
        raise
    return env
