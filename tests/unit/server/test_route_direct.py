"""Routing with the server's own node known: targets in its gateway are dialled directly;
the port defaults to the node's kubelet port; the agent dials the InternalIP."""

from __future__ import annotations

import pytest

from ravenproxy.errors import RoutingError
from ravenproxy.model import GATEWAY_LABEL, Model, Node, NodeAddress
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import route


def node(name: str, ip: str, gateway: str | None, kubelet_port: int = 10250) -> Node:
    return Node(
        name=name,
        labels={GATEWAY_LABEL: gateway} if gateway else {},
        addresses=(NodeAddress("InternalIP", ip),),
        kubelet_port=kubelet_port,
    )


MODEL = Model.build(
    [
        node("cloud-1", "10.0.0.1", "gw-cloud"),
        node("cloud-2", "10.0.0.2", "gw-cloud", kubelet_port=11250),
        node("edge-1", "10.1.0.1", "gw-edge"),
        node("loner", "10.2.0.1", None),
    ]
)


def test_own_gateway_is_dialled_directly() -> None:
    r = route(MODEL, AgentRegistry(), "cloud-2", None, local_node="cloud-1")
    assert r.direct and r.session is None
    assert (r.target.node, r.target.host, r.target.port) == ("cloud-2", "10.0.0.2", 11250)
    r = route(MODEL, AgentRegistry(), "10.0.0.1", 9100, local_node="cloud-1")
    assert r.direct and r.node.name == "cloud-1" and r.target.port == 9100


def test_the_server_node_itself_without_a_gateway() -> None:
    r = route(MODEL, AgentRegistry(), "loner", 1, local_node="loner")
    assert r.direct


@pytest.mark.parametrize("local", [None, "cloud-1", "loner", "not-in-model"])
def test_other_gateways_need_an_agent(local: str | None) -> None:
    with pytest.raises(RoutingError) as info:
        route(MODEL, AgentRegistry(), "edge-1", None, local_node=local)
    assert (info.value.status, info.value.node) == (503, "edge-1")
