from __future__ import annotations

from typing import Any

from ravenproxy.controller.desired import desired_state
from ravenproxy.controller.election import (
    ElectionEvent,
    Health,
    current_status,
    event_object,
    gateway_status,
    resolve_public_ip,
)
from ravenproxy.model.parse import parse_gateway
from tests.unit.controller.builders import ep, gateway, model, node

UP = Health.ready_only()


def test_status_nodes_sorted_with_every_pod_cidr_and_raven_endpoint_json() -> None:
    gw = gateway(
        "gw-edge",
        endpoints=(ep("edge-1", port=10262, under_nat=True, config={"b": "2", "a": "1"}),),
    )
    m = model(
        gw,
        node("edge-2", "gw-edge", ip="10.0.0.2", cidrs=("10.244.2.0/24",)),
        node("edge-1", "gw-edge", ip="10.0.0.1", cidrs=("10.244.1.0/24", "fd00:10:244:1::/64")),
        node("edge-3", "other"),
        node("edge-4", "gw-edge", ip=None),
    )
    status = gateway_status(gw, m, (ep("edge-1", port=10262, under_nat=True, config={"b": "2"}),))
    assert status == {
        "nodes": [
            {
                "nodeName": "edge-1",
                "privateIP": "10.0.0.1",
                "subnets": ["10.244.1.0/24", "fd00:10:244:1::/64"],
            },
            {"nodeName": "edge-2", "privateIP": "10.0.0.2", "subnets": ["10.244.2.0/24"]},
            {"nodeName": "edge-4", "privateIP": "", "subnets": []},
        ],
        "activeEndpoints": [
            {
                "nodeName": "edge-1",
                "type": "proxy",
                "port": 10262,
                "underNAT": True,
                "config": {"b": "2"},
            }
        ],
    }


def test_calico_block_affinities_replace_pod_cidrs() -> None:
    gw = gateway("gw-edge")
    m = model(gw, node("edge-1", "gw-edge", cidrs=("10.244.1.0/24",)), node("edge-2", "gw-edge"))
    affinities = {"edge-1": ["192.168.5.64/26", "192.168.1.0/26", "fd00::/122"]}
    status = gateway_status(gw, m, (), block_affinities=affinities)
    assert [(n["nodeName"], n["subnets"]) for n in status["nodes"]] == [
        ("edge-1", ["192.168.1.0/26", "192.168.5.64/26", "fd00::/122"]),
        ("edge-2", []),
    ]


def test_public_ip_order_spec_then_annotation_then_load_balancer() -> None:
    ingress = {("gw", "edge-1"): "203.0.113.9"}
    annotated = node("edge-1", "gw", public_ip="198.51.100.1")
    plain = node("edge-1", "gw")
    assert resolve_public_ip(ep("edge-1", public_ip="192.0.2.1"), annotated, ingress, "gw") == (
        "192.0.2.1"
    )
    assert resolve_public_ip(ep("edge-1"), annotated, ingress, "gw") == "198.51.100.1"
    assert resolve_public_ip(ep("edge-1"), plain, ingress, "gw") == "203.0.113.9"
    assert resolve_public_ip(ep("edge-1"), plain, ingress, "other") == ""
    assert resolve_public_ip(ep("edge-1"), None, None, "gw") == ""


def test_public_ip_changes_are_picked_up_in_the_status() -> None:
    gw = gateway("gw", endpoints=(ep("edge-1"),), expose="LoadBalancer")
    m = model(gw, node("edge-1", "gw"))
    first = desired_state(m, UP, 0.0, lb_ingress={("gw", "edge-1"): "203.0.113.9"})
    assert first.statuses["gw"]["activeEndpoints"][0]["publicIP"] == "203.0.113.9"
    m = model(gw, node("edge-1", "gw", public_ip="198.51.100.1"))
    second = desired_state(m, UP, 0.0, lb_ingress={("gw", "edge-1"): "203.0.113.9"})
    assert second.statuses["gw"]["activeEndpoints"][0]["publicIP"] == "198.51.100.1"


def test_load_balancer_ingress_is_only_for_load_balancer_gateways() -> None:
    gw = gateway("gw", endpoints=(ep("edge-1"),), expose="PublicIP")
    m = model(gw, node("edge-1", "gw"))
    state = desired_state(m, UP, 0.0, lb_ingress={("gw", "edge-1"): "203.0.113.9"})
    assert "publicIP" not in state.statuses["gw"]["activeEndpoints"][0]


def _as_api_object(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "raven.openyurt.io/v1beta1",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {
            "endpoints": [
                {"nodeName": "edge-1", "type": "proxy"},
                {"nodeName": "edge-1", "type": "tunnel"},
            ]
        },
        "status": status,
    }


def test_a_written_status_read_back_needs_no_second_write() -> None:
    gw = parse_gateway(_as_api_object("gw", {}))
    m = model(gw, node("edge-1", "gw", cidrs=("10.244.1.0/24",)))
    state = desired_state(m, UP, 0.0)
    assert state.status_changed == ("gw",)
    written = parse_gateway(_as_api_object("gw", dict(state.statuses["gw"])))
    assert current_status(written) == state.statuses["gw"]
    again = desired_state(model(written, *m.nodes.values()), UP, 1.0)
    assert again.status_changed == ()
    assert again.events == ()


def test_desired_model_carries_the_new_election_for_later_planners() -> None:
    gw = gateway("gw", endpoints=(ep("edge-1"), ep("edge-2")), active=(ep("edge-1"),))
    m = model(gw, node("edge-1", "gw", ready=False), node("edge-2", "gw"))
    state = desired_state(m, UP, 0.0)
    assert [e.node_name for e in state.model.gateways["gw"].active_endpoints] == ["edge-2"]
    assert [(e.node_name, e.elected) for e in state.events] == [("edge-1", False), ("edge-2", True)]


def test_event_object_shape() -> None:
    ev = ElectionEvent("gw", "edge-1", "proxy", False, "NodeNotReady", "gone")
    obj = event_object(ev, 0.0)
    assert obj["involvedObject"] == {
        "apiVersion": "raven.openyurt.io/v1beta1",
        "kind": "Gateway",
        "name": "gw",
    }
    assert obj["type"] == "Warning"
    assert obj["reason"] == "NodeNotReady"
    assert obj["firstTimestamp"] == "1970-01-01T00:00:00Z"
    assert obj["metadata"]["namespace"] == "default"
    assert obj["metadata"]["name"].startswith("gw.")
