"""Small builders for model objects, so each test states only what it is about."""

from __future__ import annotations

from ravenproxy.model.objects import (
    GATEWAY_LABEL,
    PUBLIC_IP_ANNOTATION,
    Endpoint,
    Gateway,
    Node,
    NodeAddress,
    ProxyConfig,
    TunnelConfig,
    frozen_map,
)
from ravenproxy.model.snapshot import Model


def node(
    name: str,
    gateway: str | None = None,
    ip: str | tuple[str, ...] | None = "",
    ready: bool = True,
    cidrs: tuple[str, ...] = (),
    public_ip: str | None = None,
) -> Node:
    """A node; ``ip=""`` derives a distinct 10.0.0.x address from the name's digits."""
    if ip == "":
        digits = "".join(c for c in name if c.isdigit()) or "9"
        ip = f"10.0.0.{int(digits) % 250 + 1}"
    ips = (ip,) if isinstance(ip, str) else (ip or ())
    return Node(
        name=name,
        labels=frozen_map({GATEWAY_LABEL: gateway} if gateway else None),
        annotations=frozen_map({PUBLIC_IP_ANNOTATION: public_ip} if public_ip else None),
        addresses=tuple(NodeAddress("InternalIP", a) for a in ips),
        pod_cidrs=cidrs,
        ready=ready,
    )


def ep(node_name: str, type_: str = "proxy", **kw: object) -> Endpoint:
    return Endpoint(node_name=node_name, type=type_, **kw)  # type: ignore[arg-type]


def gateway(
    name: str,
    endpoints: tuple[Endpoint, ...] = (),
    active: tuple[Endpoint, ...] = (),
    proxy_replicas: int = 1,
    tunnel_replicas: int = 1,
    expose: str = "",
    http: str = "",
    https: str = "",
) -> Gateway:
    return Gateway(
        name=name,
        proxy_config=ProxyConfig(proxy_replicas, http, https),
        tunnel_config=TunnelConfig(tunnel_replicas),
        endpoints=endpoints,
        expose_type=expose,
        active_endpoints=active,
    )


def model(*objs: Node | Gateway) -> Model:
    return Model.build(
        [o for o in objs if isinstance(o, Node)], [o for o in objs if isinstance(o, Gateway)]
    )
