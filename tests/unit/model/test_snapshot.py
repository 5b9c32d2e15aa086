"""Model lookups (membership, who may serve whom, proxy endpoints) and the ModelStore."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from ravenproxy.model import (
    GATEWAY_LABEL,
    Endpoint,
    Gateway,
    Model,
    ModelStore,
    Node,
    NodeAddress,
    load_inventory,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "inventory-example.yaml"


def node(name: str, *ips: str, gateway: str | None = None) -> Node:
    return Node(
        name=name,
        labels={GATEWAY_LABEL: gateway} if gateway else {},
        addresses=tuple(NodeAddress("InternalIP", ip) for ip in ips),
    )


@pytest.fixture
def example() -> Model:
    return load_inventory(EXAMPLE)


def test_node_by_ip(example: Model) -> None:
    assert example.node_by_ip("127.0.0.2").name == "edge-2"  # type: ignore[union-attr]
    assert example.node_by_ip("127.0.0.3").name == "edge-3"  # type: ignore[union-attr]
    assert example.node_by_ip("10.9.9.9") is None


def test_node_by_ip_uses_every_internal_ip_and_only_internal_ips() -> None:
    n = Node(
        name="dual",
        addresses=(
            NodeAddress("ExternalIP", "203.0.113.1"),
            NodeAddress("InternalIP", "10.0.0.5"),
            NodeAddress("InternalIP", "fd00::5"),
        ),
    )
    model = Model.build([n])
    assert model.node_by_ip("fd00::5") is n
    assert model.node_by_ip("10.0.0.5") is n
    assert model.node_by_ip("203.0.113.1") is None
    assert n.internal_ip == "10.0.0.5"


def test_members_are_sorted_by_name_and_come_from_labels(example: Model) -> None:
    assert [n.name for n in example.members("gw-edge")] == ["edge-1", "edge-2"]
    assert [n.name for n in example.members("gw-cloud")] == ["cloud-1"]
    assert example.members("gw-none") == ()


def test_peers_of(example: Model) -> None:
    assert [n.name for n in example.peers_of("edge-1")] == ["edge-1", "edge-2"]
    assert [n.name for n in example.peers_of("edge-2")] == ["edge-1", "edge-2"]
    assert [n.name for n in example.peers_of("edge-3")] == ["edge-3"]
    assert example.peers_of("ghost") == ()


@pytest.mark.parametrize(
    ("agent", "target", "allowed"),
    [
        ("edge-1", "edge-1", True),
        ("edge-1", "edge-2", True),
        ("edge-2", "edge-1", True),
        ("edge-1", "edge-3", False),
        ("edge-3", "edge-3", True),
        ("edge-3", "edge-1", False),
        ("edge-1", "cloud-1", False),
        ("cloud-1", "edge-1", False),
        ("ghost", "edge-1", False),
        ("edge-1", "ghost", False),
    ],
)
def test_who_may_serve_whom(example: Model, agent: str, target: str, allowed: bool) -> None:
    """The agent on ``agent`` may carry traffic for ``target``: the rule, in both directions."""
    assert (target in {n.name for n in example.peers_of(agent)}) is allowed
    assert (agent in {n.name for n in example.peers_of(target)}) is allowed


def test_proxy_nodes_spec_when_no_active_endpoints(example: Model) -> None:
    assert example.proxy_nodes("gw-edge") == ("edge-1",)
    assert example.proxy_nodes("gw-cloud") == ("cloud-1",)
    assert example.proxy_nodes("gw-none") == ()


def test_proxy_nodes_prefers_active_endpoints_and_dedups() -> None:
    gw = Gateway(
        name="g",
        endpoints=(
            Endpoint("a", "proxy"),
            Endpoint("b", "proxy"),
            Endpoint("b", "proxy", port=2),
            Endpoint("c", "tunnel"),
        ),
    )
    model = Model.build([], [gw])
    assert model.proxy_nodes("g") == ("a", "b")
    active = Gateway(
        name="g",
        endpoints=gw.endpoints,
        active_endpoints=(Endpoint("b", "proxy"), Endpoint("c", "tunnel")),
    )
    assert Model.build([], [active]).proxy_nodes("g") == ("b",)
    only_tunnel_active = Gateway(
        name="g", endpoints=gw.endpoints, active_endpoints=(Endpoint("c", "tunnel"),)
    )
    assert Model.build([], [only_tunnel_active]).proxy_nodes("g") == ("a", "b")


def test_model_is_immutable() -> None:
    model = Model.build([node("a", "10.0.0.1")])
    with pytest.raises(TypeError):
        model.nodes["b"] = node("b")  # type: ignore[index]


# -- the store ---------------------------------------------------------------------------------
async def test_store_wait_changed() -> None:
    store = ModelStore()
    assert store.version == 0
    first = Model.build([node("a")])
    waiter = asyncio.create_task(store.wait_changed(0))
    await asyncio.sleep(0)
    assert not waiter.done()
    store.update(first)
    assert await asyncio.wait_for(waiter, 1) is first
    assert store.version == 1
    # Already newer than `since`: returns at once.
    assert await asyncio.wait_for(store.wait_changed(0), 1) is first


async def test_store_ignores_equal_models_and_notifies_listeners() -> None:
    store = ModelStore()
    seen: list[Model] = []
    store.subscribe(seen.append)
    store.update(Model.build([node("a")]))
    store.update(Model.build([node("a")]))  # equal: not a change
    assert store.version == 1
    assert len(seen) == 1
    waiter = asyncio.create_task(store.wait_changed(1))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    second = Model.build([node("b")])
    store.update(second)
    assert await asyncio.wait_for(waiter, 1) is second
    assert seen == [seen[0], second]


async def test_store_listener_that_raises_leaves_the_others_following(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in one listener is logged with its traceback; the listeners after it still see
    every update, and the caller (a model source) is not interrupted."""
    store = ModelStore()
    seen: list[tuple[str, Model]] = []

    def broken(model: Model) -> None:
        seen.append(("broken", model))
        raise RuntimeError("listener bug")

    store.subscribe(broken)
    store.subscribe(lambda model: seen.append(("after", model)))
    first, second = Model.build([node("a")]), Model.build([node("b")])
    with caplog.at_level(logging.ERROR, logger="ravenproxy.model.store"):
        store.update(first)
        store.update(second)
    assert seen == [("broken", first), ("after", first), ("broken", second), ("after", second)]
    assert store.model is second and store.version == 2
    failed = [r for r in caplog.records if r.getMessage() == "model listener failed"]
    assert len(failed) == 2
    assert failed[0].exc_info is not None and str(failed[0].exc_info[1]) == "listener bug"
    assert "broken" in failed[0].__dict__["fields"]["listener"]


async def test_store_first_update_counts_even_if_equal_to_initial() -> None:
    store = ModelStore()
    store.update(Model.build())
    assert store.version == 1
