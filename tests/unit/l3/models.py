"""Small model builders for the L3 planner tests: gateways, members, NAT, relays."""

from __future__ import annotations

from ravenproxy.model.objects import (
    GATEWAY_LABEL,
    Endpoint,
    Gateway,
    Node,
    NodeAddress,
    NodeInfo,
    frozen_map,
)
from ravenproxy.model.snapshot import Model


def node(name: str, ip: str, gateway: str | None, *pod_cidrs: str) -> Node:
    labels = {GATEWAY_LABEL: gateway} if gateway else {}
    return Node(
        name=name,
        labels=frozen_map(labels),
        addresses=(NodeAddress("InternalIP", ip),),
        pod_cidrs=tuple(pod_cidrs),
        ready=True,
    )


def gateway(
    name: str,
    tunnel_node: str | None,
    *,
    under_nat: bool = False,
    public_ip: str = "",
    exposed: bool = False,
    status: tuple[NodeInfo, ...] = (),
    public_key: str = "",
    port: int = 4500,
) -> Gateway:
    eps: tuple[Endpoint, ...] = ()
    if tunnel_node is not None:
        config = frozen_map({"publicKey": public_key} if public_key else None)
        eps = (
            Endpoint(
                node_name=tunnel_node,
                type="tunnel",
                port=port,
                under_nat=under_nat,
                public_ip=public_ip,
                config=config,
            ),
        )
    return Gateway(
        name=name,
        endpoints=eps,
        expose_type="PublicIP" if exposed else "",
        status_nodes=status,
        active_endpoints=eps,
    )


def cloud_and_edge() -> Model:
    """gw-cloud (public, exposed) with two nodes; gw-edge under NAT with two nodes; a solo
    node in no gateway."""
    return Model.build(
        nodes=[
            node("cloud-gw", "10.0.0.1", "gw-cloud", "10.16.0.0/24"),
            node("cloud-2", "10.0.0.2", "gw-cloud", "10.16.1.0/24"),
            node("edge-gw", "192.168.1.10", "gw-edge", "10.16.10.0/24"),
            node("edge-2", "192.168.1.11", "gw-edge", "10.16.11.0/24"),
            node("solo", "192.168.9.9", None, "10.16.99.0/24"),
        ],
        gateways=[
            gateway("gw-cloud", "cloud-gw", public_ip="1.2.3.4", exposed=True),
            gateway("gw-edge", "edge-gw", under_nat=True),
        ],
    )


def hub_and_two_nated_edges() -> Model:
    """gw-cloud relays between gw-a and gw-b, both under NAT; gw-b has a single node."""
    return Model.build(
        nodes=[
            node("cloud-gw", "10.0.0.1", "gw-cloud", "10.16.0.0/24"),
            node("cloud-2", "10.0.0.2", "gw-cloud", "10.16.1.0/24"),
            node("a-gw", "192.168.1.10", "gw-a", "10.16.10.0/24"),
            node("a-2", "192.168.1.11", "gw-a", "10.16.11.0/24"),
            node("b-gw", "192.168.2.10", "gw-b", "10.16.20.0/24"),
        ],
        gateways=[
            gateway("gw-cloud", "cloud-gw", public_ip="1.2.3.4", exposed=True),
            gateway("gw-a", "a-gw", under_nat=True),
            gateway("gw-b", "b-gw", under_nat=True),
        ],
    )
