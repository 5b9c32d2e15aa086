"""The names a server certificate may carry, and who may hold one."""

from __future__ import annotations

from ravenproxy.model.objects import Endpoint, Gateway, Node, NodeAddress
from ravenproxy.model.server_names import (
    INTERNAL_SERVICE,
    internal_service_dns,
    is_cloud_gateway_node,
    server_names,
)
from ravenproxy.model.snapshot import Model

GW = "raven.openyurt.io/gateway"


def cloud(name: str, ip: str, **labels: str) -> Node:
    return Node(
        name,
        labels={GW: "gw-cloud", **labels},
        addresses=(NodeAddress("InternalIP", ip), NodeAddress("Hostname", name)),
        annotations={"raven.openyurt.io/public-ip": "203.0.113.9"},
    )


def test_names_of_a_cloud_gateway_server() -> None:
    gw = Gateway(
        "gw-cloud",
        endpoints=(Endpoint("cloud-1", "proxy", public_ip="198.51.100.1"),),
        active_endpoints=(Endpoint("cloud-2", "tunnel", public_ip="198.51.100.2"),),
    )
    model = Model.build([cloud("cloud-1", "10.0.0.1")], [gw])
    names = server_names(model, "cloud-1", service_ip="10.96.0.10", extra=("proxy.example",))
    assert names == (
        "cloud-1",
        "10.0.0.1",
        "203.0.113.9",
        "198.51.100.1",
        "198.51.100.2",
        "10.96.0.10",
        *internal_service_dns(),
        "proxy.example",
    )
    assert f"{INTERNAL_SERVICE}.kube-system.svc.cluster.local" in names


def test_unknown_node_gets_only_its_name_and_the_service_names() -> None:
    names = server_names(Model.build(), "ghost", cluster_domain="corp")
    assert names == ("ghost", *internal_service_dns("corp"))


def test_only_gateway_nodes_outside_the_edge_are_cloud_gateway_nodes() -> None:
    assert is_cloud_gateway_node(cloud("c", "10.0.0.1"))
    assert not is_cloud_gateway_node(
        cloud("e", "10.0.0.2", **{"openyurt.io/is-edge-worker": "true"})
    )
    assert not is_cloud_gateway_node(Node("plain"))
