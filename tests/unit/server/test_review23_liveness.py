"""Review of branch gen (issue 15): a keep-alive client's route memo is reused without asking
``AgentRegistry.live`` per request, on the promise that the registry's generation moves at
every change that ends a registered session's liveness (a GOAWAY sent or received, a
connection error either way, the session's end).

gen's own tests (test_drain_generation.py) take each change alone, and the earlier reviews'
differential tests (review20/21) drive fake connections whose ``stop`` helper calls
``on_draining`` itself. Here the sessions' connections are real wire
:class:`~ravenproxy.wire.connection.Connection` objects, each with its agent's peer (a
:class:`tests.unit.wire.harness.Pair`), and generated histories mix, in any order and any
number of times: agents registered for a node (several per node, a reconnect of the same node
while the old one is still registered), unregistered, a GOAWAY sent by the server (OK or not,
twice), a connection error found outside the wire (``fail``) or by it (a protocol error), a
GOAWAY received from the agent (its opens above last_stream_id refused), a session's end with
or without a GOAWAY before it (what ``Session.run``'s ``finally`` does: the real one is held
by gen's test and by :func:`test_a_real_session_ended_by_cancellation_moves_it` below), load
(streams the server opens), pings; and keep-alive clients asking between any two of them.

For every request: the route (reused or not) names a registered, live agent (e115ebc's
``live``, kept verbatim), and a reused memo is one e115ebc's ``route_again`` (kept verbatim)
reuses too. Nothing is imported from a baseline checkout.

Hand-made breaks of gen's code, each made ``test_no_request_goes_to_an_agent_that_stopped``
and the reconnect test fail: ``on_draining`` not called in ``Drain._recv_goaway``; nor in
``Drain._send_goaway``; a no-op ``Drain.ended``; ``AgentRegistry.add`` not setting
``on_draining``. The cancellation test fails with ``self.conn.ended()`` taken out of
``Session.run``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, event, given, settings
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
from tests.helpers import examples

from ..transport.test_session import WAIT, tunnel
from ..wire.harness import Pair
from .test_routing import model

# -- e115ebc's AgentRegistry.live and Router.route_again, verbatim (only made functions) --------


def _old_live(self: AgentRegistry, session: Session) -> bool:
    """The session may carry new streams (open, no GOAWAY either way). A method, not a
    staticmethod: the router asks it per request, and 3.11 does not specialize the load
    of a staticmethod called on an instance."""
    conn = session.conn
    return not session.closed and conn.goaway_received is None and conn.goaway_sent is None


def _old_route_again(
    self: Router, dest: Destination, over_tls: bool, memo: RouteMemo | None
) -> RouteMemo:
    """:meth:`route_request`, or ``memo`` (a keep-alive connection's last route) when the
    request names the same node, port, pod and scheme, and neither the model nor the
    connected agents changed since, and its agent still takes streams: the next request
    of a connection goes where the last one went without routing it again. Positional
    (the callbacks call it per request: a call with keywords is not specialized)."""
    model, agents = self.store.model, self.registry.generation
    if (
        memo is not None
        and memo.model is model
        and memo.agents == agents
        and (memo.route.session is None or _old_live(self.registry, memo.route.session))
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
    """A session as the registry and router see it (name, closed, close_reason, conn), over a
    real wire connection whose peer is the agent's."""

    name: str
    pair: Pair = field(default_factory=Pair)
    closed: bool = False
    close_reason: str = ""

    @property
    def conn(self) -> Connection:
        return self.pair.server


NODES = ("a", "b", "c", "d", "solo")
TARGET = Target("a", "10.0.0.1", 9100)


@dataclass
class _World:
    registry: AgentRegistry = field(default_factory=AgentRegistry)
    agents: list[_Agent] = field(default_factory=list)
    memos: dict[int, RouteMemo | None] = field(default_factory=dict)
    comings: int = 0
    """Agents added and removed: e115ebc's generation (its only moves)."""
    made_at: dict[int, int] = field(default_factory=dict)
    """A client's memo's :attr:`comings`."""
    note: Any = lambda _: None  # hypothesis's event, in a generated test
    router: Router = field(init=False)

    def __post_init__(self) -> None:
        self.router = Router(ModelStore(model()), self.registry, None)

    def agent(self, i: int) -> _Agent | None:
        return self.agents[i % len(self.agents)] if self.agents else None

    def step(self, step: tuple[Any, ...]) -> None:
        what = step[0]
        if what == "add":
            agent = _Agent(step[1])
            self.agents.append(agent)
            self.registry.add(agent.name, cast(Session, agent))
            self.comings += 1
            return
        if what == "request":
            self.request(step[1], step[2], step[3])
            return
        agent = self.agent(step[1])
        if agent is None:
            return
        conn, pair = agent.conn, agent.pair
        if what == "remove":  # the tunnel handler's finally, after the session's end
            self.registry.remove(agent.name, cast(Session, agent))
            self.comings += 1
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
        elif what == "end":  # Session.run's finally: the session carries nothing more
            if not agent.closed:
                agent.closed = True
                conn.ended()
        elif what == "load":  # a stream the server opens through it (its load)
            if not conn.closed and conn.goaway_received is None and conn.goaway_sent is None:
                conn.open_stream(TARGET)
                if not pair.agent.closed:
                    pair.transfer(conn)
        elif what == "ping":
            if not conn.closed and not pair.agent.closed:
                conn.ping()
                pair.transfer(conn)
                pair.transfer(pair.agent)
        else:
            raise AssertionError(what)

    def request(self, client: int, node: str, over_tls: bool) -> None:
        memo = self.memos.get(client)
        dest = Destination("host", node, 9100, target="/metrics")
        registry, router = self.registry, self.router
        # Would e115ebc reuse it? Its generation moved only by agents coming and going.
        old_reuses = (
            memo is not None
            and self.made_at.get(client) == self.comings
            and memo.route.session is not None
            and _old_live(registry, memo.route.session)
            and memo.over_tls is over_tls
            and memo.dest.host == node
        )
        try:
            got = router.route_again(dest, over_tls, memo)
        except RoutingError:
            self.note("refused")
            return  # the client's memo stays what it was (its next request asks again)
        session = got.route.session
        assert session is not None  # no own node: every route is an agent's
        assert any(s is session for s in registry.sessions()), "an unregistered agent"
        assert _old_live(registry, session), "an agent that stopped taking streams"
        if got is memo:
            self.note("reused")
            # e115ebc reuses it too (and, reusing, changes nothing: no routing, no round-robin).
            assert _old_route_again(router, dest, over_tls, memo) is memo
        else:
            assert (
                memo is None
                or memo.agents != registry.generation
                or not (memo.over_tls is over_tls and memo.dest.host == node)
            ), "a memo that could be reused was not"
            if old_reuses:
                # Benign: another agent's drain or end moved the generation; e115ebc kept it.
                self.note("routed anew where e115ebc reused (another agent stopped)")
            self.made_at[client] = self.comings
        self.memos[client] = got


_index = st.integers(0, 7)
_codes = st.sampled_from(
    [ErrorCode.OK, ErrorCode.OK, ErrorCode.GOING_AWAY, ErrorCode.INTERNAL_ERROR]
)
_steps = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(NODES[:4])),
    st.tuples(st.just("add"), st.sampled_from(NODES[:4])),
    st.tuples(st.just("request"), st.integers(0, 3), st.sampled_from(NODES), st.booleans()),
    st.tuples(st.just("request"), st.integers(0, 3), st.sampled_from(NODES[:4]), st.booleans()),
    st.tuples(st.just("remove"), _index),
    st.tuples(st.just("drain"), _index, _codes),
    st.tuples(st.just("fail"), _index),
    st.tuples(st.just("protocol-error"), _index),
    st.tuples(st.just("peer-goaway"), _index, _codes),
    st.tuples(st.just("end"), _index),
    st.tuples(st.sampled_from(["load", "ping"]), _index),
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(NODES[:4]), min_size=1, max_size=5),
    st.lists(st.tuples(st.sampled_from(NODES[:4]), st.booleans()), min_size=2, max_size=2),
    st.lists(_steps, max_size=40),
)
def test_no_request_goes_to_an_agent_that_stopped(
    nodes: list[str], first: list[tuple[str, bool]], steps: list[tuple[Any, ...]]
) -> None:
    world = _World(note=event)
    for name in nodes:  # agents up, then two keep-alive clients routed, then the history
        world.step(("add", name))
    for client, (name, over_tls) in enumerate(first):
        world.request(client, name, over_tls)
    for step in steps:
        world.step(step)
        # Every client asks again after every step: the step's change is seen at once.
        for client in range(2):
            memo = world.memos.get(client)
            if memo is not None:
                world.request(client, memo.dest.host, memo.over_tls)


@pytest.mark.parametrize(
    "order",
    [
        ("drain", "end"),
        ("peer-goaway", "end"),
        ("end",),
        ("end", "drain"),
        ("fail", "end"),
        ("protocol-error", "end"),
    ],
)
def test_a_reconnect_of_the_same_node_takes_over_at_each_step(order: tuple[str, ...]) -> None:
    """Node a's agent reconnects: the new session is registered while the old one is still
    there (the old unregistered only after its end). At each step of the old one's end —
    whatever the order, a GOAWAY either way or none — a client of the old route goes to the
    new agent from its next request on, before the old is unregistered."""
    world = _World()
    world.step(("add", "a"))
    world.request(0, "a", False)
    old = world.agents[0]
    memo = world.memos[0]
    assert memo is not None and memo.route.session is cast(Session, old)
    world.step(("add", "a"))  # the reconnect
    new = world.agents[1]
    world.step(("load", 1))  # the new one busier: the old one, least loaded, is picked
    world.request(0, "a", False)
    memo = world.memos[0]
    assert memo is not None and memo.route.session is cast(Session, old)
    world.request(0, "a", False)
    assert world.memos[0] is memo  # reused while nothing changes
    for what in order:
        world.step((what, 0, ErrorCode.OK))
        world.request(0, "a", False)
        memo = world.memos[0]
        assert memo is not None and memo.route.session is cast(Session, new), what
    world.step(("remove", 0))
    world.request(0, "a", False)
    assert world.memos[0] is not None and world.memos[0].route.session is cast(Session, new)


async def test_a_real_session_ended_by_cancellation_moves_it() -> None:
    """The session's end by its task cancelled (the server shutting down, the handler's task
    cancelled), no GOAWAY and no close handshake first: ``Session.run``'s ``finally`` moves
    the generation, before the handler unregisters it."""
    async with tunnel() as t:
        registry = AgentRegistry()
        registry.add("a", t.cloud)
        router = Router(ModelStore(model()), registry, None)
        dest = Destination("host", "a", 9100, target="/metrics")
        memo = router.route_again(dest, False, None)
        assert memo.route.session is t.cloud
        before = registry.generation
        # websockets' task for the connection, which awaits tunnel()'s handler, which awaits
        # the server session's run.
        runs = [
            task
            for task in asyncio.all_tasks()
            if task.get_coro().__qualname__.endswith("protocol_handler")  # type: ignore[union-attr]
        ]
        assert len(runs) == 1
        runs[0].cancel()
        await asyncio.wait_for(t.cloud_run, WAIT)
        assert t.cloud.closed
        assert registry.generation > before
        assert t.cloud.conn.goaway_sent is None and t.cloud.conn.goaway_received is None
        with pytest.raises(RoutingError) as info:
            router.route_again(dest, False, memo)
        assert info.value.status == 503
