"""Review of branch gendrain (issue 15): ``Router.route_again`` keeps a keep-alive client's route
across a move of the registry's generation when the route's own agent is still one routing
would choose (``AgentRegistry.candidates``), instead of routing anew at every agent's coming,
GOAWAY or end as ebcf73b did.

Held here against ebcf73b's ``route_again`` (kept verbatim below, only made a function) over
generated histories in one world where every tier of routing is reachable: a node's own agents
(several: HA, a reconnect), its gateway's proxy endpoints (the spec's, or the elected active
ones after a model change), any member of the gateway, a node outside any gateway, and nodes
the server dials itself (its own gateway: direct routes). The changes are the real ones on
real wire connections (``goaway`` sent, one received from the agent, a connection error,
``ended``, ``remove``), mixed with load, model swaps and keep-alive clients asking between any
two of them, over TLS or not, for the same node or another.

For every request, new against ebcf73b on the same router:

- the same refusal (status, node, reason) exactly when ebcf73b refuses;
- what ebcf73b reuses as is (nothing moved), the new code returns as is (the same memo);
- a route the new code keeps although the generation moved is one ebcf73b could have chosen
  from now: its agent registered, live (ebcf73b's ``live``, verbatim) and among the
  candidates, and the same node, target and TLS as ebcf73b's fresh route;
- a route the new code makes anew names what ebcf73b's fresh one names (node, target, TLS; an
  agent among the same candidates);
- the rule at its edges: the memo is kept exactly when the model, TLS and destination are the
  same and its agent (if any) is still a candidate — so another agent's drain keeps it, the
  memo's own agent draining or leaving, a better agent's coming (the node's own, an elected
  proxy) or a model change moves it.

Hand-made breaks of gendrain's code, each failing ``test_route_again_against_ebcf73b``:
``_still`` answering True always (a drained agent kept); ``_still`` asking
``registry.live(session)`` only (a better agent's coming ignored: the node's own agent after a
proxy's route); ``_still`` answering False always (the intended edge: another agent's drain
moves the client); the re-stamp returning ``memo`` itself (its stale generation: the next
request asks again: the stamp checked fails); ``memo.model is model`` dropped from the
memo's test (a swapped model keeps the old route).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.errors import RoutingError
from ravenproxy.model.store import ModelStore
from ravenproxy.server.podroutes import Destination
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import RouteMemo, Router
from ravenproxy.transport.session import Session
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.errors import ProtocolError
from ravenproxy.wire.frames import Settings, Target, encode

from ..wire.harness import Pair
from .test_routing import model

# -- ebcf73b's Router.route_again and AgentRegistry.live, verbatim (only made functions) --------


def _ebc_live(self: AgentRegistry, session: Session) -> bool:
    """The session may carry new streams (open, no GOAWAY either way). A registered
    session stops being live only by a change that moves :attr:`generation`."""
    conn = session.conn
    return not session.closed and conn.goaway_received is None and conn.goaway_sent is None


def _ebc_route_again(
    self: Router, dest: Destination, over_tls: bool, memo: RouteMemo | None
) -> RouteMemo:
    """:meth:`route_request`, or ``memo`` (a keep-alive connection's last route) when the
    request names the same node, port, pod and scheme, and neither the model nor the
    connected agents changed since (nor did any of them stop taking streams: the
    registry's generation moves then too): the next request of a connection goes where
    the last one went without routing it again. Positional (the callbacks call it per
    request: a call with keywords is not specialized)."""
    model, agents = self.store.model, self.registry.generation
    if (
        memo is not None
        and memo.model is model
        and memo.agents == agents  # its agent, if any, is still live (AgentRegistry.generation)
        and memo.over_tls is over_tls
    ):
        last = memo.dest
        # What routing read of a destination, compared field by field with the one the
        # memo was made for (no key tuple made per request that differs).
        if last is dest or (
            last.host == dest.host
            and last.port == dest.port
            and last.pod == dest.pod
            and last.scheme == dest.scheme
        ):
            return memo
    route = self.route_request(dest, over_tls=over_tls)
    return RouteMemo(over_tls, model, agents, route, dest)


# -- the world ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Agent:
    """A session as the registry and router see it, over a real wire connection whose peer is
    the agent's."""

    name: str
    pair: Pair = field(default_factory=Pair)
    closed: bool = False
    close_reason: str = ""

    @property
    def conn(self) -> Connection:
        return self.pair.server


AGENT_NODES = ("a", "b", "c", "d", "solo")
"""gw's members a, b, c, d (proxy endpoints in the spec: b and c; d a tunnel endpoint) and solo,
in no gateway (test_routing.model)."""
MODELS = ((), ("c",), ("b",), ("d",))
"""The gateway's elected proxy endpoints (none: the spec's b and c) of the models swapped in."""


def _dest(node: str, port: int) -> Destination:
    return Destination("host", node, port, target="/metrics")


def _refusal(exc: RoutingError) -> tuple[int, str, str]:
    return exc.status, exc.node, exc.reason


@dataclass
class _World:
    own_node: str | None
    registry: AgentRegistry = field(default_factory=AgentRegistry)
    agents: list[_Agent] = field(default_factory=list)
    memos: dict[int, RouteMemo | None] = field(default_factory=dict)
    router: Router = field(init=False)

    def __post_init__(self) -> None:
        self.router = Router(ModelStore(model()), self.registry, self.own_node)

    def step(self, step: tuple[Any, ...]) -> None:
        what = step[0]
        if what == "add":
            agent = _Agent(step[1])
            self.agents.append(agent)
            self.registry.add(agent.name, cast(Session, agent))
            return
        if what == "model":  # a new model object (the watch's next snapshot), maybe elected
            self.router.store.model = model(MODELS[step[1]])  # type: ignore[misc]
            return
        if not self.agents:
            return
        agent = self.agents[step[1] % len(self.agents)]
        conn, pair = agent.conn, agent.pair
        if what == "remove":  # the tunnel handler's finally, after the session's end
            if not agent.closed:
                agent.closed = True
                conn.ended()
            self.registry.remove(agent.name, cast(Session, agent))
        elif what == "drain":
            conn.goaway(step[2], "draining")
        elif what == "fail":
            if not conn.closed:
                conn.fail(ErrorCode.ENHANCE_YOUR_CALM, "flood")
        elif what == "protocol-error":
            if not conn.closed:
                with pytest.raises(ProtocolError):  # SETTINGS twice
                    conn.receive_message(encode(Settings(())))
        elif what == "peer-goaway":
            if not pair.agent.closed and not conn.closed:
                pair.agent.goaway(step[2], "agent draining")
                pair.transfer(pair.agent)
        elif what == "end":  # Session.run's finally
            if not agent.closed:
                agent.closed = True
                conn.ended()
        elif what == "load":  # a stream the server opens through it
            if not conn.closed and conn.goaway_received is None and conn.goaway_sent is None:
                conn.open_stream(Target(agent.name, "10.0.0.1", 9100))
                if not pair.agent.closed:
                    pair.transfer(conn)
        else:
            raise AssertionError(what)

    def request(self, client: int, node: str, port: int, over_tls: bool) -> None:
        memo = self.memos.get(client)
        dest = _dest(node, port)
        registry, router = self.registry, self.router
        model_now, generation = router.store.model, registry.generation
        new: RouteMemo | None = None
        old: RouteMemo | None = None
        try:
            new = router.route_again(dest, over_tls, memo)
        except RoutingError as exc:
            new_refused: tuple[int, str, str] | None = _refusal(exc)
        else:
            new_refused = None
        try:  # on the same router, after the new rule (its pick may move the round-robin only)
            old = _ebc_route_again(router, dest, over_tls, memo)
        except RoutingError as exc:
            old_refused: tuple[int, str, str] | None = _refusal(exc)
        else:
            old_refused = None
        assert new_refused == old_refused, (new_refused, old_refused)
        if new is None:
            event("refused")
            return  # the client's memo stays what it was: its next request asks again
        assert old is not None
        route = new.route
        if route.session is not None:
            session = route.session
            assert any(s is session for s in registry.sessions()), "an unregistered agent"
            assert _ebc_live(registry, session), "an agent that stopped taking streams"
            candidates = registry.candidates(model_now, route.node.name)
            assert any(s is session for s in candidates), "an agent routing would not choose"
            assert old.route.session is not None
            assert any(s is old.route.session for s in candidates)
        else:
            assert old.route.session is None
        assert (route.node, route.target, route.tls) == (
            old.route.node,
            old.route.target,
            old.route.tls,
        )
        assert new.model is model_now and new.agents == generation and new.over_tls is over_tls
        if old is memo:
            assert new is memo, "ebcf73b reused it as is"
            event("reused as is")
        # The rule at its edges: kept exactly when nothing routing reads changed and its agent
        # is still a candidate.
        same = (
            memo is not None
            and memo.model is model_now
            and memo.over_tls is over_tls
            and (memo.dest.host, memo.dest.port) == (node, port)
        )
        still = memo is not None and (
            memo.route.session is None
            or any(
                s is memo.route.session
                for s in registry.candidates(model_now, memo.route.node.name)
            )
        )
        if same and still:
            assert memo is not None and route is memo.route, "a route that stands moved"
            if old is not memo:
                event("kept where ebcf73b routed anew")
                if old.route.session is not memo.route.session:
                    event("kept where ebcf73b moved the client to another agent")
        else:
            assert memo is None or route is not memo.route, "a route that moved was kept"
        self.memos[client] = new


_index = st.integers(0, 9)
_codes = st.sampled_from([ErrorCode.OK, ErrorCode.GOING_AWAY, ErrorCode.INTERNAL_ERROR])
_ask = st.tuples(
    st.just("request"),
    st.integers(0, 2),
    st.sampled_from(AGENT_NODES),
    st.sampled_from([9100, 9100, 10250]),
    st.booleans(),
)
_steps = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(AGENT_NODES)),
    st.tuples(st.just("add"), st.sampled_from(AGENT_NODES[:2])),
    _ask,
    st.tuples(st.just("remove"), _index),
    st.tuples(st.just("drain"), _index, _codes),
    st.tuples(st.just("peer-goaway"), _index, _codes),
    st.tuples(st.sampled_from(["fail", "protocol-error", "end", "load", "load"]), _index),
    st.tuples(st.just("model"), st.integers(0, len(MODELS) - 1)),
)


def _run(own_node: str | None, agents: list[str], steps: list[tuple[Any, ...]]) -> None:
    world = _World(own_node)
    for name in agents:
        world.step(("add", name))
    for step in steps:
        if step[0] == "request":
            world.request(*step[1:])
            continue
        world.step(step)
        # Every client asks again for what it asked last: the change is seen at once.
        for client, memo in list(world.memos.items()):
            if memo is not None:
                world.request(client, memo.dest.host, memo.dest.port, memo.over_tls)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([None, None, "b", "solo"]),
    st.lists(st.sampled_from(AGENT_NODES), min_size=1, max_size=5),
    st.lists(_steps, max_size=30),
)
# a served by its gateway's proxy b; a's own agent comes: moved to it (a better one).
@example(None, ["b"], [("request", 0, "a", 9100, False), ("add", "a")])
# a's two agents, the client on one; solo's agent drains: kept (ebcf73b moved it).
@example(
    None,
    ["a", "a", "solo"],
    [("request", 0, "a", 9100, False), ("load", 0), ("drain", 2, ErrorCode.OK)],
)
# The client's own agent drains: moved to a's other one.
@example(None, ["a", "a"], [("request", 0, "a", 9100, False), ("drain", 0, ErrorCode.OK)])
# Served by d (no proxy endpoint up); c is elected and its agent comes: moved to c.
@example(
    None,
    ["d"],
    [("request", 0, "a", 9100, True), ("model", 1), ("add", "c"), ("model", 1)],
)
# A direct route (own gateway) across agents' changes; solo's through its agent.
@example(
    "b",
    ["solo", "a"],
    [("request", 0, "a", 10250, False), ("request", 1, "solo", 9100, False), ("end", 1)],
)
def test_route_again_against_ebcf73b(
    own_node: str | None, agents: list[str], steps: list[tuple[Any, ...]]
) -> None:
    _run(own_node, agents, steps)
