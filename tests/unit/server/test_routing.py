"""Which agent serves a node: the registry's preference order and load spreading, and routing."""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from ravenproxy.errors import RoutingError
from ravenproxy.model import GATEWAY_LABEL, Endpoint, Gateway, Model, Node, NodeAddress
from ravenproxy.model.store import ModelStore
from ravenproxy.server.podroutes import Destination
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import HTTP_STATUS, REASONS, Router, find_node, route
from ravenproxy.transport.session import Session
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import Target


@dataclass
class FakeConn:
    open_streams: int = 0
    goaway_received: Any = None
    goaway_sent: Any = None
    on_draining: Any = None
    """Set by the registry; called by :func:`stop` as the real connection calls it."""


@dataclass
class FakeSession:
    name: str
    closed: bool = False
    close_reason: str = ""
    conn: FakeConn = field(default_factory=FakeConn)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


def fake(name: str, streams: int = 0) -> Session:
    return cast(Session, FakeSession(name, conn=FakeConn(open_streams=streams)))


def stop(session: Session, how: str) -> None:
    """A fake session stops taking streams (``close``, ``goaway-received`` or
    ``goaway-sent``) as a real one does: the change, then its connection's ``on_draining``
    (wire/drain.py, Session.run; test_drain_generation.py checks the real ones call it)."""
    fake = cast(FakeSession, session)
    if how == "close":
        fake.closed = True
    elif how == "goaway-received":
        fake.conn.goaway_received = 0
    else:
        assert how == "goaway-sent", how
        fake.conn.goaway_sent = 0
    if fake.conn.on_draining is not None:
        fake.conn.on_draining()


def node(name: str, ip: str | None, gateway: str | None = None) -> Node:
    return Node(
        name=name,
        labels={GATEWAY_LABEL: gateway} if gateway else {},
        addresses=(NodeAddress("InternalIP", ip),) if ip else (),
    )


def model(active: tuple[str, ...] = ()) -> Model:
    """gw: members a, b, c, d (proxy endpoints in the spec: b and c); solo: not in a gateway."""
    return Model.build(
        [
            node("a", "10.0.0.1", "gw"),
            node("b", "10.0.0.2", "gw"),
            node("c", "10.0.0.3", "gw"),
            node("d", "10.0.0.4", "gw"),
            node("solo", "10.0.1.1"),
            node("noip", None, "gw"),
            Node(
                name="dual",
                addresses=(NodeAddress("Hostname", "dual"), NodeAddress("InternalIP", "fd00::9")),
            ),
        ],
        [
            Gateway(
                name="gw",
                endpoints=(Endpoint("b", "proxy"), Endpoint("c", "proxy"), Endpoint("d", "tunnel")),
                active_endpoints=tuple(Endpoint(n, "proxy") for n in active),
            )
        ],
    )


def registry(**sessions: list[Session]) -> AgentRegistry:
    reg = AgentRegistry()
    for name, ss in sessions.items():
        for s in ss:
            reg.add(name, s)
    return reg


# -- candidates --------------------------------------------------------------------------------
def test_own_agent_first() -> None:
    own, proxy, member = fake("a"), fake("b"), fake("d")
    reg = registry(a=[own], b=[proxy], d=[member])
    assert reg.candidates(model(), "a") == [own]


def test_then_the_gateway_proxy_endpoints() -> None:
    b, c, d = fake("b"), fake("c"), fake("d")
    reg = registry(b=[b], c=[c], d=[d])
    assert reg.candidates(model(), "a") == [b, c]
    # Elected (active) endpoints replace the spec's list.
    assert reg.candidates(model(active=("c",)), "a") == [c]


def test_then_any_gateway_member() -> None:
    d = fake("d")
    reg = registry(d=[d], solo=[fake("solo")])
    assert reg.candidates(model(), "a") == [d]


def test_a_proxy_endpoint_target_without_its_agent_uses_the_other_proxies() -> None:
    c, d = fake("c"), fake("d")
    reg = registry(c=[c], d=[d])
    assert reg.candidates(model(), "b") == [c]


def test_no_candidates_for_solo_unknown_or_other_gateway() -> None:
    reg = registry(a=[fake("a")], b=[fake("b")])
    assert reg.candidates(model(), "solo") == []
    assert reg.candidates(model(), "ghost") == []
    assert reg.pick(model(), "solo") is None


def test_a_proxy_endpoint_outside_the_gateway_never_serves_it() -> None:
    """The spec names ``solo`` as a proxy endpoint of ``gw`` but the node is not labelled into
    the gateway: its agent may not serve gw's nodes (``Model.peers_of``), even as the only one."""
    base = model()
    gw = base.gateways["gw"]
    listed = Model.build(
        base.nodes.values(),
        [Gateway(name="gw", endpoints=(Endpoint("solo", "proxy"), *gw.endpoints))],
    )
    outsider, member = fake("solo"), fake("d")
    assert registry(solo=[outsider]).candidates(listed, "a") == []
    assert registry(solo=[outsider], d=[member]).candidates(listed, "a") == [member]


def test_closed_and_draining_sessions_are_skipped() -> None:
    closed, sent, received, live = fake("a"), fake("a"), fake("a"), fake("b")
    cast(FakeSession, closed).closed = True
    cast(FakeSession, sent).conn.goaway_sent = object()
    cast(FakeSession, received).conn.goaway_received = object()
    reg = registry(a=[closed, sent, received], b=[live])
    assert reg.candidates(model(), "a") == [live]
    assert reg.pick(model(), "a") is live


# -- pick --------------------------------------------------------------------------------------
def test_pick_least_loaded() -> None:
    busy, idle = fake("b", streams=5), fake("c", streams=1)
    reg = registry(b=[busy], c=[idle])
    assert all(reg.pick(model(), "a") is idle for _ in range(5))


def test_pick_spreads_equals_round_robin() -> None:
    s1, s2, s3 = fake("a", 2), fake("a", 2), fake("a", 7)
    reg = registry(a=[s1, s2, s3])
    picks = collections.Counter(id(reg.pick(model(), "a")) for _ in range(10))
    assert picks == {id(s1): 5, id(s2): 5}


def test_own_agent_wins_even_when_busier() -> None:
    own, proxy = fake("a", streams=100), fake("b", streams=0)
    reg = registry(a=[own], b=[proxy])
    assert reg.pick(model(), "a") is own


# -- bookkeeping -------------------------------------------------------------------------------
def test_add_remove_and_counts() -> None:
    s1, s2 = fake("a"), fake("a")
    reg = registry(a=[s1, s2], b=[fake("b")])
    assert len(reg) == 3
    assert reg.connected_nodes() == {"a", "b"}
    reg.remove("a", s1)
    assert reg.connected_nodes() == {"a", "b"}
    reg.remove("a", s2)
    reg.remove("a", s2)  # idempotent
    reg.remove("nobody", s2)
    assert reg.connected_nodes() == {"b"}
    assert len(reg) == 1
    assert len(reg.sessions()) == 1


# -- routing -----------------------------------------------------------------------------------
def test_route_targets_the_internal_ip_never_the_name() -> None:
    agent = fake("b")
    r = route(model(), registry(b=[agent]), "a", 10250)
    assert r.node.name == "a"
    assert r.target == Target("a", "10.0.0.1", 10250)
    assert r.session is agent


def test_route_by_ip_and_case_insensitive_name() -> None:
    agent = fake("dual")
    reg = registry(dual=[agent], a=[fake("a")])
    assert route(model(), reg, "fd00::9", 80).target == Target("dual", "fd00::9", 80)
    assert route(model(), reg, "10.0.0.1", 80).node.name == "a"
    assert route(model(), reg, "A", 80).node.name == "a"
    assert find_node(model(), "10.0.0.4").name == "d"


@pytest.mark.parametrize(
    ("host", "status", "node_name"),
    [
        ("ghost", 404, "ghost"),
        ("10.9.9.9", 404, "10.9.9.9"),
        ("solo", 503, "solo"),
        ("noip", 502, "noip"),
    ],
)
def test_route_errors(host: str, status: int, node_name: str) -> None:
    reg = registry(a=[fake("a")])
    with pytest.raises(RoutingError) as info:
        route(model(), reg, host, 10250)
    assert info.value.status == status
    assert info.value.node == node_name


def test_route_no_agent_when_all_sessions_closed() -> None:
    s = fake("a")
    cast(FakeSession, s).closed = True
    with pytest.raises(RoutingError) as info:
        route(model(), registry(a=[s]), "a", 10250)
    assert info.value.status == 503


def test_every_status_code_has_a_reason() -> None:
    assert set(HTTP_STATUS) == set(REASONS)
    assert HTTP_STATUS[ErrorCode.REFUSED] == 403
    assert all(400 <= s < 600 for s in HTTP_STATUS.values())


def test_route_again_reuses_the_last_route_until_something_it_depends_on_changes() -> None:
    first, second = fake("a"), fake("a")
    reg = registry(a=[first])
    store = ModelStore(model())
    router = Router(store, reg, None)
    metrics = Destination("host", "a", 9100, target="/metrics")
    memo = router.route_again(metrics, over_tls=False, memo=None)
    assert memo.route.session is first
    # The same destination again (the exchange's same request), or another path to the same
    # node and port: the same route, not decided again.
    assert router.route_again(metrics, over_tls=False, memo=memo) is memo
    other_path = dataclasses.replace(metrics, target="/healthz")
    assert router.route_again(other_path, over_tls=False, memo=memo) is memo
    # Another port, or TLS from the client: routed anew.
    assert (
        router.route_again(
            dataclasses.replace(metrics, port=9101), over_tls=False, memo=memo
        ).route.target.port
        == 9101
    )
    assert router.route_again(metrics, over_tls=True, memo=memo).route.tls
    # Another scheme (an absolute URI's https://), or a pod's path: routed anew. Each field
    # routing reads is compared with the memo's destination, one by one.
    https = dataclasses.replace(metrics, scheme="https")
    assert router.route_again(https, over_tls=False, memo=memo).route.tls
    assert router.route_again(https, over_tls=False, memo=memo) is not memo
    same_https = router.route_again(https, over_tls=False, memo=None)
    assert router.route_again(metrics, over_tls=False, memo=same_https) is not same_https
    other_host = dataclasses.replace(metrics, host="b")
    assert router.route_again(other_host, over_tls=False, memo=memo).route.node.name == "b"
    # An agent came (or went): routed anew.
    reg.add("a", second)
    again = router.route_again(metrics, over_tls=False, memo=memo)
    assert again is not memo and again.route.node.name == "a"
    # The model changed: routed anew.
    store.update(model(active=("b",)))
    assert router.route_again(metrics, over_tls=False, memo=again) is not again
    # Its agent went away without the registry hearing yet: routed anew, to a live one.
    memo = router.route_again(metrics, over_tls=False, memo=None)
    gone = memo.route.session
    assert gone is not None
    stop(gone, "close")
    live = router.route_again(metrics, over_tls=False, memo=memo).route.session
    assert live in (first, second) and live is not gone


def test_routing_reads_the_stores_model_even_when_a_listener_before_it_raised() -> None:
    """The router reads the store's model per request (no copy of its own kept by a listener):
    a listener that raises in update() (logged, the update goes on) does not leave routing on
    the old model."""

    def broken(_model: Model) -> None:
        raise RuntimeError("a listener's bug")

    store = ModelStore(model())
    store.subscribe(broken)
    router = Router(store, registry(a=[fake("a")], b=[fake("b")]), None)
    metrics = Destination("host", "a", 9100, target="/metrics")
    memo = router.route_again(metrics, over_tls=False, memo=None)
    store.update(model(active=("b",)))
    assert router.route_again(metrics, over_tls=False, memo=memo) is not memo
    assert router.route_again(metrics, over_tls=False, memo=None).model is store.model
    store.update(model())  # the old model again (equal, not the same object)
    assert router.route_again(metrics, over_tls=False, memo=None).model is store.model


def test_registry_counts_its_sessions_as_they_come_and_go() -> None:
    registry = AgentRegistry()
    a1, a2, b = fake("a1"), fake("a2"), fake("b")
    registry.add("a", a1)
    registry.add("a", a2)
    registry.add("b", b)
    assert len(registry) == 3 == len(registry.sessions())
    registry.remove("a", fake("stranger"))  # never added: nothing changes
    registry.remove("c", b)  # under another node: nothing changes
    assert len(registry) == 3
    registry.remove("a", a1)
    registry.remove("a", a1)  # twice: counted once
    assert len(registry) == 2 == len(registry.sessions())
    registry.remove("a", a2)
    registry.remove("b", b)
    assert len(registry) == 0
    assert registry.connected_nodes() == frozenset()
