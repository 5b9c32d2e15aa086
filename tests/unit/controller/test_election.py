from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.controller.election import (
    LOST_AGENT_GONE,
    LOST_LEFT_GATEWAY,
    LOST_NODE_DELETED,
    LOST_NOT_IN_SPEC,
    LOST_NOT_READY,
    LOST_REPLICAS,
    REASON_ELECTED,
    REASON_FAILOVER,
    Health,
    elect,
    elect_with_events,
)
from ravenproxy.model.objects import Gateway
from ravenproxy.model.snapshot import Model
from tests.unit.controller.builders import ep, gateway, model, node

ALL_UP = Health(connected=frozenset({"edge-1", "edge-2", "edge-3", "edge-4"}))


def names(eps: tuple[object, ...]) -> list[tuple[str, str]]:
    return [(e.type, e.node_name) for e in eps]  # type: ignore[attr-defined]


def edge_gw(active: tuple[str, ...] = (), replicas: int = 1, nodes: int = 3) -> Gateway:
    spec = tuple(ep(f"edge-{i}") for i in range(nodes, 0, -1))  # spec order is not the rule
    return gateway(
        "gw-edge",
        endpoints=spec,
        active=tuple(ep(n) for n in active),
        proxy_replicas=replicas,
    )


def edge_model(gw: Gateway, **ready: bool) -> Model:
    nodes = [node(f"edge-{i}", "gw-edge", ready=ready.get(f"edge_{i}", True)) for i in (1, 2, 3)]
    return model(gw, *nodes)


def test_initial_election_takes_sorted_healthy_candidates_per_type() -> None:
    gw = gateway(
        "gw-edge",
        endpoints=(ep("edge-2"), ep("edge-1"), ep("edge-2", "tunnel"), ep("edge-3", "tunnel")),
        proxy_replicas=1,
        tunnel_replicas=2,
    )
    m = model(gw, *(node(f"edge-{i}", "gw-edge") for i in (1, 2, 3)))
    result = elect_with_events(gw, m, ALL_UP, 0.0)
    assert names(result.active) == [("proxy", "edge-1"), ("tunnel", "edge-2"), ("tunnel", "edge-3")]
    assert [(e.node_name, e.elected, e.reason) for e in result.events] == [
        ("edge-1", True, REASON_ELECTED),
        ("edge-2", True, REASON_ELECTED),
        ("edge-3", True, REASON_ELECTED),
    ]


def test_candidates_need_the_gateway_label_and_an_existing_node() -> None:
    gw = gateway("gw-edge", endpoints=(ep("edge-1"), ep("edge-2"), ep("edge-3")), proxy_replicas=3)
    m = model(gw, node("edge-1", "other-gw"), node("edge-2", None))  # edge-3 does not exist
    assert elect(gw, m, ALL_UP, 0.0) == ()
    m = model(gw, node("edge-1", "other-gw"), node("edge-2", "gw-edge"))
    assert names(elect(gw, m, ALL_UP, 0.0)) == [("proxy", "edge-2")]


def test_failover_when_the_active_node_goes_not_ready() -> None:
    gw = edge_gw(active=("edge-1",))
    result = elect_with_events(gw, edge_model(gw, edge_1=False), ALL_UP, 0.0)
    assert names(result.active) == [("proxy", "edge-2")]
    assert [(e.node_name, e.elected, e.reason, e.event_type) for e in result.events] == [
        ("edge-1", False, LOST_NOT_READY, "Warning"),
        ("edge-2", True, REASON_FAILOVER, "Normal"),
    ]


def test_failover_when_the_agent_is_gone_past_the_grace_period_and_not_before() -> None:
    gw = edge_gw(active=("edge-1",))
    m = edge_model(gw)
    health = Health(
        connected=frozenset({"edge-2", "edge-3"}), last_seen={"edge-1": 100.0}, grace=30.0
    )
    # Inside the grace period a reconnecting agent keeps its endpoint, with no event at all.
    for now in (100.0, 115.0, 130.0):
        result = elect_with_events(gw, m, health, now)
        assert names(result.active) == [("proxy", "edge-1")]
        assert result.events == ()
    result = elect_with_events(gw, m, health, 130.5)
    assert names(result.active) == [("proxy", "edge-2")]
    assert [(e.node_name, e.reason) for e in result.events] == [
        ("edge-1", LOST_AGENT_GONE),
        ("edge-2", REASON_FAILOVER),
    ]


def test_an_agent_never_seen_gets_the_grace_period_from_the_start_of_tracking() -> None:
    gw = edge_gw()
    m = edge_model(gw)
    nobody = Health(connected=frozenset(), since=1000.0, grace=30.0)
    assert names(elect(gw, m, nobody, 1010.0)) == [("proxy", "edge-1")]
    assert elect(gw, m, nobody, 1031.0) == ()
    only_3 = Health(connected=frozenset({"edge-3"}), since=1000.0, grace=30.0)
    assert names(elect(gw, m, only_3, 1031.0)) == [("proxy", "edge-3")]


def test_ready_only_health_ignores_agents_like_raven() -> None:
    gw = edge_gw()
    assert names(elect(gw, edge_model(gw), Health.ready_only(), 1e9)) == [("proxy", "edge-1")]


def test_exposed_gateways_are_judged_by_ready_alone() -> None:
    # The cloud gateway hosts the server; no agent of it ever dials in.
    gw = gateway("gw-cloud", endpoints=(ep("cloud-1"),), expose="LoadBalancer")
    m = model(gw, node("cloud-1", "gw-cloud"))
    no_agents = Health(connected=frozenset(), since=0.0, grace=1.0)
    assert names(elect(gw, m, no_agents, 1e6)) == [("proxy", "cloud-1")]
    m = model(gw, node("cloud-1", "gw-cloud", ready=False))
    assert elect(gw, m, no_agents, 1e6) == ()


def test_sticky_current_endpoint_stays_even_if_not_first_in_order() -> None:
    gw = edge_gw(active=("edge-3",))
    result = elect_with_events(gw, edge_model(gw), ALL_UP, 0.0)
    assert names(result.active) == [("proxy", "edge-3")]
    assert result.events == ()


def test_no_flapping_over_many_repeated_elections_while_healthy() -> None:
    gw = edge_gw(replicas=2)
    m = edge_model(gw)
    seen = []
    for i in range(200):
        result = elect_with_events(gw, m, ALL_UP, float(i))
        seen.append(names(result.active))
        if i > 0:
            assert result.events == ()
        gw = replace(gw, active_endpoints=result.active)
        m = model(gw, *m.nodes.values())
    assert all(s == [("proxy", "edge-1"), ("proxy", "edge-2")] for s in seen)


def test_a_recovered_node_does_not_take_back_its_endpoint() -> None:
    gw = edge_gw(active=("edge-1",))
    active = elect(gw, edge_model(gw, edge_1=False), ALL_UP, 0.0)
    gw = replace(gw, active_endpoints=active)
    result = elect_with_events(gw, edge_model(gw), ALL_UP, 1.0)
    assert names(result.active) == [("proxy", "edge-2")]
    assert result.events == ()


def test_replicas_up_keeps_current_and_adds_next_sorted() -> None:
    gw = edge_gw(active=("edge-2",), replicas=3)
    result = elect_with_events(gw, edge_model(gw), ALL_UP, 0.0)
    assert names(result.active) == [("proxy", "edge-2"), ("proxy", "edge-1"), ("proxy", "edge-3")]
    assert [(e.node_name, e.reason) for e in result.events] == [
        ("edge-1", REASON_ELECTED),
        ("edge-3", REASON_ELECTED),
    ]


def test_replicas_down_keeps_the_first_current_ones() -> None:
    gw = edge_gw(active=("edge-3", "edge-1", "edge-2"), replicas=1)
    result = elect_with_events(gw, edge_model(gw), ALL_UP, 0.0)
    assert names(result.active) == [("proxy", "edge-3")]
    assert [(e.node_name, e.reason, e.event_type) for e in result.events] == [
        ("edge-1", LOST_REPLICAS, "Normal"),
        ("edge-2", LOST_REPLICAS, "Normal"),
    ]


def test_replicas_zero_elects_nothing() -> None:
    gw = edge_gw(active=("edge-1",), replicas=0)
    result = elect_with_events(gw, edge_model(gw), ALL_UP, 0.0)
    assert result.active == ()
    assert [(e.node_name, e.reason) for e in result.events] == [("edge-1", LOST_REPLICAS)]


def test_loss_reasons_removed_from_spec_deleted_and_relabelled() -> None:
    gw = gateway(
        "gw-edge",
        endpoints=(ep("edge-2"), ep("edge-3")),
        active=(ep("edge-1"), ep("edge-2"), ep("edge-3")),
        proxy_replicas=3,
    )
    m = model(gw, node("edge-1", "gw-edge"), node("edge-3", "gw-other"))
    result = elect_with_events(gw, m, ALL_UP, 0.0)
    assert result.active == ()
    assert [(e.node_name, e.reason) for e in result.events] == [
        ("edge-1", LOST_NOT_IN_SPEC),
        ("edge-2", LOST_NODE_DELETED),
        ("edge-3", LOST_LEFT_GATEWAY),
    ]


def test_spec_edits_reach_the_active_endpoint_without_an_election() -> None:
    gw = gateway(
        "gw-edge",
        endpoints=(ep("edge-1", port=10262, public_ip="1.2.3.4"),),
        active=(ep("edge-1", port=1, public_ip="9.9.9.9"),),
    )
    result = elect_with_events(gw, model(gw, node("edge-1", "gw-edge")), ALL_UP, 0.0)
    assert result.active == (ep("edge-1", port=10262, public_ip="1.2.3.4"),)
    assert result.events == ()


def test_a_node_listed_twice_is_one_candidate() -> None:
    gw = gateway(
        "gw-edge", endpoints=(ep("edge-1", port=1), ep("edge-1", port=2)), proxy_replicas=2
    )
    assert elect(gw, model(gw, node("edge-1", "gw-edge")), ALL_UP, 0.0) == (ep("edge-1", port=1),)


def test_types_are_elected_independently() -> None:
    gw = gateway(
        "gw-edge",
        endpoints=(ep("edge-1", "tunnel"), ep("edge-2", "proxy")),
        active=(ep("edge-1", "tunnel"),),
    )
    m = model(gw, node("edge-1", "gw-edge"), node("edge-2", "gw-edge", ready=False))
    result = elect_with_events(gw, m, ALL_UP, 0.0)
    assert names(result.active) == [("tunnel", "edge-1")]
    assert result.events == ()


def test_health_connected_agents_are_alive_and_gone_ones_expire_after_grace() -> None:
    # (AgentTracker, which built these snapshots from connect reports, is gone: the servers'
    # Leases and /agents feed Health now. The rule it was checked against stays.)
    health = Health(connected=frozenset({"edge-1"}), since=0.0, grace=10.0)
    assert health.agent_alive("edge-1", 1000.0)
    health = Health(last_seen={"edge-1": 60.0}, since=0.0, grace=10.0)
    assert health.connected == frozenset()
    assert health.agent_alive("edge-1", 70.0)
    assert not health.agent_alive("edge-1", 70.1)


# --- properties -------------------------------------------------------------------------------

NODE_NAMES = [f"edge-{i}" for i in range(1, 6)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Gateway, Model, Health]:
    spec = draw(st.lists(st.sampled_from(NODE_NAMES), unique=True))
    active = draw(st.lists(st.sampled_from(NODE_NAMES), unique=True))
    replicas = draw(st.integers(0, 4))
    gw = gateway(
        "gw",
        endpoints=tuple(ep(n) for n in spec),
        active=tuple(ep(n) for n in active),
        proxy_replicas=replicas,
    )
    nodes = [
        node(n, draw(st.sampled_from(["gw", "gw", "other", None])), ready=draw(st.booleans()))
        for n in NODE_NAMES
        if draw(st.booleans()) or n in spec
    ]
    connected = frozenset(draw(st.lists(st.sampled_from(NODE_NAMES), unique=True)))
    return gw, model(gw, *nodes), Health(connected=connected, since=0.0, grace=10.0)


def healthy(gw: Gateway, m: Model, health: Health, name: str) -> bool:
    n = m.node(name)
    return (
        any(e.node_name == name for e in gw.endpoints)
        and n is not None
        and n.gateway == gw.name
        and n.ready
        and name in health.connected
    )


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_election_properties(case: tuple[Gateway, Model, Health]) -> None:
    gw, m, health = case
    active = [e.node_name for e in elect(gw, m, health, 100.0)]
    candidates = sorted({e.node_name for e in gw.endpoints if healthy(gw, m, health, e.node_name)})
    replicas = gw.proxy_config.replicas
    assert len(active) == len(set(active)) == min(replicas, len(candidates))
    assert set(active) <= set(candidates)
    kept = [e.node_name for e in gw.active_endpoints if e.node_name in candidates][:replicas]
    assert active[: len(kept)] == kept
    # Election is a fixed point: feeding the result back changes nothing.
    again = replace(gw, active_endpoints=elect(gw, m, health, 100.0))
    assert elect_with_events(again, m, health, 100.0).events == ()
