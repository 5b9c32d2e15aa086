"""The lab's topology as data: hosts, links, addresses, routes, rules, pods, processes.

```
 cloud-node ──eth0── cloud-gw ──wan0── nat-router ──br-lan── edge-gw
 10.0.0.2            10.0.0.1          172.31.0.254  │         192.168.1.10
 pod 10.16.1.5       172.31.0.1        192.168.1.1   └──────── edge-node
                                                               192.168.1.11
                                                               pods 10.16.11.5, 10.16.11.6
```
Pure: everything is computed from the lab's NAME. What the kernel shares between namespaces is
named after NAME so two labs never collide: the namespaces (``NAME-cloud-gw`` ...), their
``/etc/netns`` entries, and the WireGuard interfaces (wireguard-go's control sockets live in
one host-wide directory). Addresses are the same in every lab: each lab's hosts are its own
namespaces, joined only to each other, so equal addresses in two labs never meet — and the
docs can show them.

- Pod CIDRs: cloud-gw 10.16.0.0/24, cloud-node 10.16.1.0/24, edge-gw 10.16.10.0/24, edge-node
  10.16.11.0/24; each node holds the first address on ``cni0`` (an empty bridge) and its pods'
  addresses on it.
- The CNI stand-in: static routes inside each domain and a Flannel-style MASQUERADE on each
  gateway (``-s 10.16.0.0/16 ! -d 224.0.0.0/4``) — the first seed's trap.
- nat-router MASQUERADEs the edge out of wan0 and drops NEW connections from wan0.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ravenproxy.errors import ConfigError

HOSTS = ("cloud-node", "cloud-gw", "nat-router", "edge-gw", "edge-node")
DEFAULT_NAME = "lab"
DEFAULT_PERIOD = 60.0
"""Seconds between two reconciles of the lab's route drivers (``lab up --reconcile-period``)."""
FAULTS = ("skip-snat", "rp-filter", "route", "agent")
"""The seed failures ``lab fault`` injects (:mod:`ravenproxy.lab.faults`)."""
_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")

FLANNEL_SUPERNET = "10.16.0.0/16"
#: The server's addresses (on cloud-gw), as reached from cloud-node.
SERVER_IP = "10.0.0.1"
TUNNEL_PORT, HTTPS_PORT, HTTP_PORT, METRICS_PORT, HEALTH_PORT = 10262, 10263, 10264, 10266, 10275
DNS_PORT = 53
KUBELET_PORT = 10250
EXPORTER_PORT = 9400
ECHO_PORT = 7000


@dataclass(frozen=True)
class Node:
    name: str
    ip: str
    gateway: str
    pod_cidr: str
    bridge_ip: str  # first address of the pod CIDR, on cni0


NODES = (
    Node("cloud-gw", "10.0.0.1", "gw-cloud", "10.16.0.0/24", "10.16.0.1"),
    Node("cloud-node", "10.0.0.2", "gw-cloud", "10.16.1.0/24", "10.16.1.1"),
    Node("edge-gw", "192.168.1.10", "gw-edge", "10.16.10.0/24", "10.16.10.1"),
    Node("edge-node", "192.168.1.11", "gw-edge", "10.16.11.0/24", "10.16.11.1"),
)


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    ip: str
    port: int
    protocol: str


PODS = (
    Pod("cloud-echo", "cloud-node", "10.16.1.5", ECHO_PORT, "udp"),
    Pod("edge-echo", "edge-node", "10.16.11.5", ECHO_PORT, "udp"),
    Pod("edge-exporter", "edge-node", "10.16.11.6", EXPORTER_PORT, "tcp"),
)


@dataclass(frozen=True)
class Link:
    """A veth pair; ``bridge`` (optional) is the bridge in host ``a`` its ``a`` end joins."""

    a: str
    a_if: str
    b: str
    b_if: str
    bridge: str = ""


@dataclass(frozen=True)
class Address:
    host: str
    dev: str
    cidr: str


@dataclass(frozen=True)
class Route:
    host: str
    dest: str
    via: str


@dataclass(frozen=True)
class Rule:
    """One iptables rule (``-t table -A chain ...``) in a host."""

    host: str
    table: str
    args: tuple[str, ...]


LINKS = (
    Link("cloud-node", "eth0", "cloud-gw", "eth0"),
    Link("cloud-gw", "wan0", "nat-router", "wan0"),
    Link("nat-router", "lan-gw", "edge-gw", "eth0", bridge="br-lan"),
    Link("nat-router", "lan-node", "edge-node", "eth0", bridge="br-lan"),
)
#: Bridges that exist before the links join them: the edge LAN and each node's cni0.
BRIDGES = (("nat-router", "br-lan"), *((n.name, "cni0") for n in NODES))
ADDRESSES = (
    Address("cloud-node", "eth0", "10.0.0.2/24"),
    Address("cloud-gw", "eth0", "10.0.0.1/24"),
    Address("cloud-gw", "wan0", "172.31.0.1/24"),
    Address("nat-router", "wan0", "172.31.0.254/24"),
    Address("nat-router", "br-lan", "192.168.1.1/24"),
    Address("edge-gw", "eth0", "192.168.1.10/24"),
    Address("edge-node", "eth0", "192.168.1.11/24"),
    *(Address(n.name, "cni0", f"{n.bridge_ip}/24") for n in NODES),
    *(Address(p.node, "cni0", f"{p.ip}/32") for p in PODS),
)
ROUTES = (
    Route("nat-router", "10.0.0.0/24", "172.31.0.1"),
    # A node's default route goes to a router that knows no pod network (here: none at all).
    Route("cloud-node", "default", "10.0.0.254"),
    Route("edge-gw", "default", "192.168.1.1"),
    Route("edge-node", "default", "192.168.1.1"),
    # The CNI stand-in within each domain (as Flannel host-gw would install).
    Route("cloud-gw", "10.16.1.0/24", "10.0.0.2"),
    Route("cloud-node", "10.16.0.0/24", "10.0.0.1"),
    Route("edge-gw", "10.16.11.0/24", "192.168.1.11"),
    Route("edge-node", "10.16.10.0/24", "192.168.1.10"),
)
FORWARDING = ("nat-router", "cloud-gw", "edge-gw")
RULES = (
    Rule("nat-router", "nat", ("POSTROUTING", "-s", "192.168.1.0/24", "-o", "wan0",
                               "-j", "MASQUERADE")),
    Rule("nat-router", "filter", ("FORWARD", "-i", "wan0", "-m", "conntrack", "--ctstate", "NEW",
                                  "-j", "DROP")),
    *(
        Rule(gw, "nat", ("POSTROUTING", "-s", FLANNEL_SUPERNET, "!", "-d", "224.0.0.0/4",
                         "-j", "MASQUERADE"))
        for gw in ("cloud-gw", "edge-gw")
    ),
)  # fmt: skip


def check_name(name: str) -> str:
    """A lab's NAME: a lowercase letter, then up to 11 lowercase letters or digits (it prefixes
    namespace names and must leave room in an interface name)."""
    if not _NAME.match(name):
        raise ConfigError(
            "--name", f"{name!r}: use a lowercase letter then up to 11 lowercase letters or digits"
        )
    return name


@dataclass(frozen=True)
class LabPlan:
    name: str

    def namespace(self, host: str) -> str:
        return f"{self.name}-{host}"

    @property
    def namespaces(self) -> dict[str, str]:
        return {h: self.namespace(h) for h in HOSTS}

    @property
    def tag(self) -> str:
        """Eight hex digits of the NAME's hash: unique host-wide names within 15 bytes."""
        return hashlib.sha256(self.name.encode()).hexdigest()[:8]

    def wireguard_interface(self, node: str) -> str:
        return f"rl{self.tag}{'c' if node.startswith('cloud') else 'e'}"

    def addresses(self, host: str) -> list[str]:
        """The host's own addresses (its pods' addresses left out)."""
        return [a.cidr for a in ADDRESSES if a.host == host and not a.cidr.endswith("/32")]


def node(name: str) -> Node:
    for n in NODES:
        if n.name == name:
            return n
    raise KeyError(name)


def inventory(keys: dict[str, str]) -> str:
    """The model as an inventory: the cloud gateway exposed (proxy and tunnel endpoints on
    cloud-gw), the edge gateway under NAT, four Ready nodes with their pod CIDRs, the pods
    (kubelet paths name them); ``keys``: the gateways' WireGuard public keys by gateway name
    (none with strongSwan)."""
    cloud_key, edge_key = keys.get("gw-cloud", ""), keys.get("gw-edge", "")
    parts = [
        f"""\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-cloud}}
spec:
  exposeType: PublicIP
  proxyConfig: {{Replicas: 1, proxyHTTPPort: "{HTTP_PORT}", proxyHTTPSPort: "{HTTPS_PORT}"}}
  endpoints:
  - {{nodeName: cloud-gw, type: proxy, port: {TUNNEL_PORT}, publicIP: {SERVER_IP}}}
  - {{nodeName: cloud-gw, type: tunnel, port: 4500, config: {{publicKey: "{cloud_key}"}}}}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-edge}}
spec:
  proxyConfig: {{Replicas: 1}}
  endpoints:
  - {{nodeName: edge-gw, type: proxy, underNAT: true}}
  - {{nodeName: edge-gw, type: tunnel, port: 4500, underNAT: true,
     config: {{publicKey: "{edge_key}"}}}}
"""
    ]
    for n in NODES:
        parts.append(
            f"""\
apiVersion: v1
kind: Node
metadata:
  name: {n.name}
  labels: {{raven.openyurt.io/gateway: {n.gateway}}}
spec: {{podCIDRs: [{n.pod_cidr}]}}
status:
  addresses: [{{type: InternalIP, address: {n.ip}}}]
  conditions: [{{type: Ready, status: "True"}}]
"""
        )
    for pod in PODS:
        parts.append(
            f"""\
apiVersion: v1
kind: Pod
metadata: {{name: {pod.name}, namespace: default}}
spec: {{nodeName: {pod.node}}}
status: {{podIP: {pod.ip}}}
"""
        )
    return "---\n".join(parts)
