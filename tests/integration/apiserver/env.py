"""The test bed for docs/apiserver.md: real server, agent and ``ravenproxy dns`` processes (through
the CLI), a fake kubelet with its own PKI, and the doc's examples read from the doc itself.

Loopback stands in for the cluster:

- the internal Service's ClusterIP is a loopback address (``CLUSTER_IP``) on which the server's
  fronts listen on the Service's ports: the HTTPS front on the kubelet's port number, the HTTP
  front on the exporter's (kube-proxy's ClusterIP:port → server:10263/10264, without the NAT);
- ``ravenproxy dns`` answers every node name with that ClusterIP (``--cluster-ip``), on port 53
  of its own loopback address when root (so a program's resolver can be pointed at it);
- edge-1 (gateway gw-edge, one agent) has its InternalIP on ``EDGE_IP``, where the fake kubelet
  listens: TLS on the kubelet port, plain HTTP on the "exporter" port; edge-9 is in a gateway
  with no agent at all.

Ports in the doc's examples (10250, 10255, 9100) are replaced by the ones bound here.
"""

from __future__ import annotations

import os
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.message

from ravenproxy.client import ConnectRefused, open_tunnel
from ravenproxy.pki.authority import generate_ca, issue_client_cert, issue_server_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from tests.helpers import eventually, free_port, is_free
from tests.integration.cluster import Cluster, Proc
from tests.integration.l7.env import Kubelet, start_kubelet

DOC = Path(__file__).resolve().parents[3] / "docs" / "apiserver.md"

_SUFFIX = 2 + os.getpid() % 250
EDGE_IP = "127.0.0.31"
CLOUD_IP = "127.0.0.41"
FAR_IP = "127.0.0.51"
CLUSTER_IP = f"127.96.0.{_SUFFIX}"
DNS_IP = f"127.53.0.{_SUFFIX}"

APISERVER_CN = "kube-apiserver-kubelet-client"
SERVER_KUBELET_CN = "ravenproxy-server-kubelet-client"
PROMETHEUS_CN = "prometheus"

_EXAMPLE = re.compile(
    r"^[ \t]*<!-- example: ([\w-]+) -->\n([ \t]*)```\w*\n(.*?)^[ \t]*```", re.M | re.S
)


def doc_examples() -> dict[str, str]:
    """Every ``<!-- example: NAME -->`` block of docs/apiserver.md, dedented."""
    text = DOC.read_text()
    found = {m.group(1): textwrap.dedent(m.group(3)) for m in _EXAMPLE.finditer(text)}
    assert found, f"no examples in {DOC}"
    return found


def doc_example(name: str) -> str:
    examples = doc_examples()
    assert name in examples, f"{DOC} has no example {name!r} (has {sorted(examples)})"
    return examples[name]


def replace_all(text: str, replacements: dict[str, str]) -> str:
    """Replace each key (a whole token: not inside a longer word or number); each must occur."""
    for old, new in replacements.items():
        pattern = re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w])")
        assert pattern.search(text), f"example lost {old!r}:\n{text}"
        text = pattern.sub(new, text)
    return text


INVENTORY = """\
{gateway}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-edge}}
spec:
  proxyConfig: {{Replicas: 1}}
  endpoints:
  - {{nodeName: edge-1, type: proxy, underNAT: true}}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-far}}
spec:
  proxyConfig: {{Replicas: 1}}
  endpoints:
  - {{nodeName: edge-9, type: proxy, underNAT: true}}
---
apiVersion: v1
kind: Node
metadata: {{name: cloud-1, labels: {{raven.openyurt.io/gateway: gw-cloud}}}}
status:
  addresses: [{{type: InternalIP, address: {cloud_ip}}}, {{type: Hostname, address: cloud-1}}]
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata: {{name: edge-1, labels: {{raven.openyurt.io/gateway: gw-edge}}}}
status:
  addresses: [{{type: InternalIP, address: {edge_ip}}}, {{type: Hostname, address: edge-1}}]
  daemonEndpoints: {{kubeletEndpoint: {{Port: {kubelet_port}}}}}
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Node
metadata: {{name: edge-9, labels: {{raven.openyurt.io/gateway: gw-far}}}}
status:
  addresses: [{{type: InternalIP, address: {far_ip}}}, {{type: Hostname, address: edge-9}}]
  daemonEndpoints: {{kubeletEndpoint: {{Port: {kubelet_port}}}}}
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: v1
kind: Pod
metadata: {{namespace: default, name: web-1}}
spec: {{nodeName: edge-1}}
"""


@dataclass
class Pki:
    """The cluster's kubelet PKI: the kubelet CA and the certificates it signed."""

    dir: Path

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"


def make_pki(base: Path) -> Pki:
    pki = Pki(base / "kubelet-pki")
    pki.dir.mkdir()
    ca, ca_key = generate_ca("cluster-ca")
    write_pem_cert(pki.ca, ca)
    serving, serving_key = issue_server_cert(ca, ca_key, ["edge-1", EDGE_IP], common_name="edge-1")
    write_pem_cert(pki.cert("edge-1"), serving)
    write_pem_key(pki.key("edge-1"), serving_key)
    for name, cn in (
        ("apiserver-kubelet-client", APISERVER_CN),
        ("server-kubelet-client", SERVER_KUBELET_CN),
        ("prometheus", PROMETHEUS_CN),
    ):
        cert, key = issue_client_cert(ca, ca_key, cn)
        write_pem_cert(pki.cert(name), cert)
        write_pem_key(pki.key(name), key)
    return pki


@dataclass
class Env:
    base: Path
    cluster: Cluster
    kubelet: Kubelet
    pki: Pki
    dns: Proc
    dns_port: int

    @property
    def server(self) -> Proc:
        assert self.cluster.server is not None
        return self.cluster.server

    @property
    def kubelet_port(self) -> int:
        """edge-1's kubelet port (10250 in the doc); also the Service port of the HTTPS front."""
        return self.kubelet.tls_port

    @property
    def exporter_port(self) -> int:
        """edge-1's exporter port (9100 and 10255 in the doc); the HTTP front's Service port."""
        return self.kubelet.http_port

    async def metrics(self) -> dict[str, float]:
        return await self.cluster.metrics()

    def logs(self) -> str:
        return f"{self.cluster.logs()}\n----- dns -----\n{self.dns.output()[-3000:]}"

    def stop(self) -> None:
        self.dns.stop()
        self.cluster.stop_all()
        self.kubelet.stop()


def _port_free_on_both(*hosts: str) -> int:
    for _ in range(50):
        port = free_port(hosts[0])
        if all(is_free(port, host) for host in hosts[1:]):
            return port
    raise RuntimeError(f"no port free on all of {hosts}")


def dns_args(inventory: Path, listen: str) -> list[str]:
    """The doc's ``ravenproxy dns`` command line, with this bed's file and addresses."""
    argv = shlex.split(doc_example("ravenproxy-dns"))
    assert argv[:2] == ["ravenproxy", "dns"], argv
    flags = {a for a in argv if a.startswith("--")}
    assert flags == {"--inventory", "--listen", "--cluster-ip"}, argv
    filled = replace_all(
        shlex.join(argv[1:]),
        {
            argv[argv.index("--inventory") + 1]: str(inventory),
            argv[argv.index("--listen") + 1]: listen,
            argv[argv.index("--cluster-ip") + 1]: CLUSTER_IP,
        },
    )
    return shlex.split(filled)


def start_env(base: Path) -> Env:
    pki = make_pki(base)
    kubelet_port = _port_free_on_both(EDGE_IP, CLUSTER_IP)
    exporter_port = _port_free_on_both(EDGE_IP, CLUSTER_IP)
    kubelet = start_kubelet(
        base, EDGE_IP, pki.cert("edge-1"), pki.key("edge-1"), pki.ca,
        ports=(kubelet_port, exporter_port),
    )  # fmt: skip
    cluster = Cluster(base)
    # Port 53 lets a program's own resolver (resolv.conf has no port) use it: root only.
    root53 = os.geteuid() == 0 and is_free(53, DNS_IP, udp=True)
    dns_port = 53 if root53 else free_port(DNS_IP)
    dns = Proc("dns", [], base / "dns.log")
    env = Env(base, cluster, kubelet, pki, dns, dns_port)
    try:
        gateway = replace_all(
            doc_example("gateway"),
            {"10250": str(kubelet_port), "10255": str(exporter_port), "9100": str(exporter_port)},
        )
        cluster.inventory.write_text(
            INVENTORY.format(
                gateway=gateway.rstrip(),
                cloud_ip=CLOUD_IP,
                edge_ip=EDGE_IP,
                far_ip=FAR_IP,
                kubelet_port=kubelet_port,
            )
        )
        dns.args = dns_args(cluster.inventory, f"{DNS_IP}:{dns_port}")
        dns.start()
        cluster.start_server(
            "--https-addr", f"{CLUSTER_IP}:{kubelet_port}",
            "--http-addr", f"{CLUSTER_IP}:{exporter_port}",
            "--kubelet-ca-file", str(pki.ca),
            "--kubelet-cert-file", str(pki.cert("server-kubelet-client")),
            "--kubelet-key-file", str(pki.key("server-kubelet-client")),
            "--front-client-ca-file", str(pki.ca),
            "--dial-timeout", "1",
        )  # fmt: skip
        cluster.start_agent(
            "edge-1",
            extra=(
                "--inventory", str(cluster.inventory),
                "--metrics-port", str(exporter_port),
                "--dial-timeout", "1",
            ),
        )  # fmt: skip
    except BaseException:
        env.stop()
        raise
    return env


async def wait_ready(env: Env) -> None:
    """Until edge-1's kubelet is routable through the HTTP front and the DNS answers."""

    async def routable() -> bool:
        _, writer = await open_tunnel(CLUSTER_IP, env.exporter_port, f"edge-1:{env.kubelet_port}")
        writer.close()
        await writer.wait_closed()
        return True

    async def answering() -> bool:
        query = dns.message.make_query("edge-1", "A")
        reply = await dns.asyncquery.udp(query, DNS_IP, port=env.dns_port, timeout=1)
        return [r.to_text() for rrset in reply.answer for r in rrset] == [CLUSTER_IP]

    await eventually(routable, 20, interval=0.1, what=env.logs, ignore=(ConnectRefused, OSError))
    await env.dns.wait_until(answering, "dns answering", ignore=(OSError, dns.exception.Timeout))
