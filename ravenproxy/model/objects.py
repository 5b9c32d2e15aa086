"""The model's objects: immutable views of Kubernetes Node, Pod and Raven Gateway (v1beta1).

Every component reads these, whichever source (YAML inventory or Kubernetes API) fed them.
Field names follow the Kubernetes/Raven JSON names so that ``kubectl get -o yaml`` is a valid
inventory; see ``docs/inventory.md``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

GATEWAY_LABEL = "raven.openyurt.io/gateway"
PUBLIC_IP_ANNOTATION = "raven.openyurt.io/public-ip"
DEFAULT_KUBELET_PORT = 10250

ENDPOINT_PROXY = "proxy"
ENDPOINT_TUNNEL = "tunnel"

EXPOSE_NONE = ""
EXPOSE_PUBLIC_IP = "PublicIP"
EXPOSE_LOAD_BALANCER = "LoadBalancer"
EXPOSE_TYPES = (EXPOSE_NONE, EXPOSE_PUBLIC_IP, EXPOSE_LOAD_BALANCER)

_EMPTY: Mapping[str, str] = MappingProxyType({})


def frozen_map(data: Mapping[str, str] | None) -> Mapping[str, str]:
    """A read-only copy: later changes to ``data`` never show through."""
    return MappingProxyType(dict(data)) if data else _EMPTY


@dataclass(frozen=True)
class NodeAddress:
    """One of a node's addresses (``status.addresses``)."""

    type: str
    address: str


@dataclass(frozen=True)
class Node:
    """A Kubernetes Node, as far as the tunnel reads it."""

    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    addresses: tuple[NodeAddress, ...] = ()
    kubelet_port: int = DEFAULT_KUBELET_PORT
    pod_cidrs: tuple[str, ...] = ()
    ready: bool = False
    resource_version: str = ""

    @property
    def gateway(self) -> str | None:
        """The gateway this node belongs to (its ``raven.openyurt.io/gateway`` label)."""
        return self.labels.get(GATEWAY_LABEL) or None

    @property
    def internal_ip(self) -> str | None:
        for addr in self.addresses:
            if addr.type == "InternalIP":
                return addr.address
        return None

    @property
    def internal_ips(self) -> tuple[str, ...]:
        return tuple(a.address for a in self.addresses if a.type == "InternalIP")

    @property
    def public_ip_annotation(self) -> str | None:
        return self.annotations.get(PUBLIC_IP_ANNOTATION) or None


@dataclass(frozen=True)
class Endpoint:
    """A gateway endpoint: the node that serves it and how."""

    node_name: str
    type: str
    port: int = 0
    under_nat: bool = False
    nat_type: str = ""
    public_ip: str = ""
    public_port: int = 0
    config: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True)
class ProxyConfig:
    """A gateway's proxy settings (``spec.proxyConfig``)."""

    replicas: int = 1
    proxy_http_port: str = ""
    proxy_https_port: str = ""

    @property
    def http_ports(self) -> tuple[int, ...]:
        return parse_port_list(self.proxy_http_port)

    @property
    def https_ports(self) -> tuple[int, ...]:
        return parse_port_list(self.proxy_https_port)


@dataclass(frozen=True)
class TunnelConfig:
    """A gateway's tunnel settings (``spec.tunnelConfig``)."""

    replicas: int = 1


@dataclass(frozen=True)
class NodeInfo:
    """A node behind a gateway, with its private address and subnets."""

    node_name: str
    private_ip: str
    subnets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Gateway:
    """A Raven Gateway, as far as the tunnel reads it."""

    name: str
    node_selector: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    proxy_config: ProxyConfig = field(default_factory=ProxyConfig)
    tunnel_config: TunnelConfig = field(default_factory=TunnelConfig)
    endpoints: tuple[Endpoint, ...] = ()
    expose_type: str = EXPOSE_NONE
    status_nodes: tuple[NodeInfo, ...] = ()
    active_endpoints: tuple[Endpoint, ...] = ()
    resource_version: str = ""

    def endpoints_of(self, type_: str) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints if e.type == type_)

    def active_of(self, type_: str) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.active_endpoints if e.type == type_)

    @property
    def exposed(self) -> bool:
        return self.expose_type != EXPOSE_NONE


@dataclass(frozen=True)
class Pod:
    """A Pod, as far as the tunnel reads it (where it runs, its address)."""

    namespace: str
    name: str
    node_name: str = ""
    pod_ip: str = ""
    resource_version: str = ""


def parse_port_list(text: str) -> tuple[int, ...]:
    """Raven's ``proxyHTTPPort: "10255,9100"`` → ``(10255, 9100)``; empty → ``()``."""
    ports: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or not 0 < int(part) < 65536:
            raise ValueError(f"invalid port {part!r} in {text!r}")
        ports.append(int(part))
    return tuple(ports)


def is_ip(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address (Gateway validation's publicIP rule)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
