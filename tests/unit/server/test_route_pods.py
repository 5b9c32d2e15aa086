"""Routing by address: a pod IP goes to the node whose pod CIDRs hold it (its agent dials the
pod IP itself), a pod of the server's own gateway is dialled directly, an address nobody holds
is a 404 naming it."""

from __future__ import annotations

import pytest

from ravenproxy.errors import RoutingError
from ravenproxy.model import GATEWAY_LABEL, Gateway, Model, Node, NodeAddress
from ravenproxy.model.objects import NodeInfo
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import route
from ravenproxy.transport.session import Session
from ravenproxy.wire.frames import Target
from tests.unit.server.test_routing import fake, registry


def node(name: str, address: str, gateway: str, *cidrs: str) -> Node:
    return Node(
        name=name,
        labels={GATEWAY_LABEL: gateway},
        addresses=(NodeAddress("InternalIP", address),),
        pod_cidrs=cidrs,
    )


def model() -> Model:
    return Model.build(
        [
            node("cloud-1", "10.0.0.1", "gw-cloud", "10.16.0.0/24"),
            node("edge-1", "192.168.1.1", "gw-edge", "10.16.1.0/24"),
            node("edge-2", "192.168.1.2", "gw-edge"),
        ],
        [Gateway("gw-edge", status_nodes=(NodeInfo("edge-2", "192.168.1.2", ("10.16.2.0/26",)),))],
    )


def reg() -> tuple[AgentRegistry, Session]:
    agent = fake("edge-1")
    return registry(**{"edge-1": [agent]}), agent


def test_pod_ip_goes_to_its_nodes_agent_which_dials_the_pod() -> None:
    agents, agent = reg()
    r = route(model(), agents, "10.16.1.7", 8443, local_node="cloud-1")
    assert (r.node.name, r.target, r.session) == (
        "edge-1",
        Target("edge-1", "10.16.1.7", 8443),
        agent,
    )


def test_pod_of_a_peer_from_the_gateway_status_is_carried_by_the_gateways_agent() -> None:
    agents, agent = reg()
    r = route(model(), agents, "10.16.2.9", 80, local_node="cloud-1")
    assert (r.node.name, r.target.host, r.session) == ("edge-2", "10.16.2.9", agent)


def test_pod_of_the_own_gateway_is_dialled_directly() -> None:
    agents, _ = reg()
    r = route(model(), agents, "10.16.0.5", 9443, local_node="cloud-1")
    assert r.direct and r.target == Target("cloud-1", "10.16.0.5", 9443)


def test_node_address_and_name_still_mean_the_node() -> None:
    agents, agent = reg()
    for host in ("192.168.1.1", "edge-1"):
        r = route(model(), agents, host, 10250, local_node="cloud-1")
        assert (r.target, r.session) == (Target("edge-1", "192.168.1.1", 10250), agent)


@pytest.mark.parametrize(
    ("host", "port", "status", "named", "why"),
    [
        ("10.16.9.1", 443, 404, "10.16.9.1", "no node has this address, nor a pod CIDR holding it"),
        ("edge-9", 443, 404, "edge-9", "unknown node"),
        ("10.16.1.7", None, 400, "10.16.1.7", "a pod address needs a port"),
    ],
)
def test_refusals_name_the_address(
    host: str, port: int | None, status: int, named: str, why: str
) -> None:
    agents, _ = reg()
    with pytest.raises(RoutingError) as info:
        route(model(), agents, host, port, local_node="cloud-1")
    assert (info.value.status, info.value.node, info.value.reason) == (status, named, why)


def test_pod_of_a_node_without_agent_is_503() -> None:
    with pytest.raises(RoutingError) as info:
        route(model(), registry(), "10.16.1.7", 80, local_node="cloud-1")
    assert (info.value.status, info.value.node) == (503, "edge-1")
    assert info.value.reason == "no agent connected for this node"
