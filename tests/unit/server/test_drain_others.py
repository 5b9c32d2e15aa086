"""Another agent's GOAWAY or end leaves a keep-alive client's route be (gendrain, issue 15).

The registry's generation moves at every agent's coming, GOAWAY (either way) and end, so a memo
is reused without asking only while it has not moved. When it has, ``Router.route_again``
checks the memo's own agent once (still one routing would choose) and re-stamps the memo:
routing again would pick the least loaded agent of the node, and for a node served by several
agents (HA) that is another one than the agent already carrying the client's kept target
connection (its stream counts as load), which the exchange then drops. At ebcf73b every
drain or end of any agent moved every such client.

The sessions' connections are real wire :class:`~ravenproxy.wire.connection.Connection`
objects, each with its agent's peer (:class:`tests.unit.wire.harness.Pair`); the changes are
the real ones (``goaway``, a GOAWAY received, ``ended``, ``remove``), which call
``on_draining`` themselves (test_drain_generation.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import pytest

from ravenproxy.errors import RoutingError
from ravenproxy.model.store import ModelStore
from ravenproxy.server.podroutes import Destination
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import RouteMemo, Router
from ravenproxy.transport.session import Session
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.frames import Target

from ..wire.harness import Pair
from .test_routing import model


@dataclass(eq=False)
class _Agent:
    """A session as the registry and router see it, over a real wire connection."""

    name: str
    pair: Pair = field(default_factory=Pair)
    closed: bool = False
    close_reason: str = ""

    @property
    def conn(self) -> Connection:
        return self.pair.server

    @property
    def session(self) -> Session:
        return cast(Session, self)


def _dest(node: str) -> Destination:
    return Destination("host", node, 9100, target="/metrics")


class _World:
    def __init__(self, own_node: str | None = None) -> None:
        self.registry = AgentRegistry()
        self.router = Router(ModelStore(model()), self.registry, own_node)

    def add(self, node: str) -> _Agent:
        agent = _Agent(node)
        self.registry.add(node, agent.session)
        return agent

    def ask(self, node: str, memo: RouteMemo | None) -> RouteMemo:
        return self.router.route_again(_dest(node), False, memo)

    def kept(self, memo: RouteMemo) -> None:
        """The client's kept target connection: a stream open on the memo's agent (its load)."""
        session = memo.route.session
        assert session is not None
        session.conn.open_stream(Target(memo.route.node.name, "10.0.0.1", 9100))


def _goaway_sent(world: _World, x: _Agent) -> None:
    x.conn.goaway(ErrorCode.OK, "draining")


def _goaway_received(world: _World, x: _Agent) -> None:
    x.pair.agent.goaway(ErrorCode.OK, "agent draining")
    x.pair.transfer(x.pair.agent)


def _ended(world: _World, x: _Agent) -> None:  # Session.run's finally
    x.closed = True
    x.conn.ended()


def _removed(world: _World, x: _Agent) -> None:  # the tunnel handler's, after the end
    _ended(world, x)
    world.registry.remove(x.name, x.session)


def _joined(world: _World, x: _Agent) -> None:  # another node's agent (a reconnect of x's)
    world.add(x.name)


CHANGES = [_goaway_sent, _goaway_received, _ended, _removed, _joined]
IDS = ["goaway-sent", "goaway-received", "ended", "removed", "another-joined"]


def _reused(world: _World, node: str, memo: RouteMemo) -> RouteMemo:
    """The next request goes where the last went (the same route object: the exchange keeps
    its target connection), re-stamped at the new generation; the one after is that memo."""
    got = world.ask(node, memo)
    assert got.route is memo.route
    assert got.agents == world.registry.generation
    assert world.ask(node, got) is got
    return got


@pytest.mark.parametrize("change", CHANGES, ids=IDS)
def test_another_nodes_agent_leaves_an_ha_clients_route_and_kept_connection_be(
    change: Callable[[_World, _Agent], None],
) -> None:
    """Node a served by two agents, solo by x. A client kept alive to a holds a stream on its
    agent, so routing again would pick a's other agent (least loaded): x's change must not."""
    world = _World()
    y1, y2 = world.add("a"), world.add("a")
    x = world.add("solo")
    memo = world.ask("a", None)
    world.kept(memo)
    other = y2 if memo.route.session is y1.session else y1
    before = world.registry.generation
    change(world, x)
    assert world.registry.generation > before  # the change is one the generation hears of
    memo = _reused(world, "a", memo)
    # ... and routing anew would have moved it: the other agent is the least loaded.
    assert world.registry.pick(world.router.store.model, "a") is other.session


@pytest.mark.parametrize("change", CHANGES, ids=IDS)
def test_a_peer_in_the_same_gateway_leaves_it_be(change: Callable[[_World, _Agent], None]) -> None:
    """a has no agent: served by its gateway's proxy endpoints b and c; d (a member, not a
    proxy) changes."""
    world = _World()
    world.add("b"), world.add("c")
    x = world.add("d")
    memo = world.ask("a", None)
    world.kept(memo)
    change(world, x)
    _reused(world, "a", memo)


def test_a_same_node_agents_coming_leaves_it_be_a_better_one_moves_it() -> None:
    """A second agent of a's (HA, or a's agent reconnecting) is as good as the memo's: kept.
    a's own agent coming while a client is served by its gateway's proxy b: moved to it
    (routing prefers the node's own agent; e115ebc moved it too, at any agent's coming)."""
    world = _World()
    world.add("a")
    memo = world.ask("a", None)
    world.kept(memo)
    world.add("a")
    _reused(world, "a", memo)

    world = _World()
    world.add("b")
    memo = world.ask("a", None)
    assert memo.route.session is not None and cast(_Agent, memo.route.session).name == "b"
    own = world.add("a")
    assert world.ask("a", memo).route.session is own.session


@pytest.mark.parametrize("change", CHANGES[:4], ids=IDS[:4])
def test_its_own_agents_drain_or_end_moves_it(change: Callable[[_World, _Agent], None]) -> None:
    """The memo's own agent stops taking streams: the next request goes to a's other agent;
    a's only agent: no agent left, 503 (no request to an agent that stopped)."""
    world = _World()
    world.add("a"), world.add("a")
    memo = world.ask("a", None)
    mine = cast(_Agent, memo.route.session)
    change(world, mine)
    got = world.ask("a", memo)
    assert got.route.session is not mine.session
    assert world.registry.live(cast(Session, got.route.session))

    world = _World()
    only = world.add("a")
    memo = world.ask("a", None)
    change(world, only)
    with pytest.raises(RoutingError) as info:
        world.ask("a", memo)
    assert info.value.status == 503


def test_a_direct_route_is_reused_across_any_agents_change() -> None:
    """A route the server dials itself (its own gateway) depends on the model only."""
    world = _World(own_node="b")
    x = world.add("solo")
    memo = world.ask("a", None)
    assert memo.route.direct
    _goaway_sent(world, x)
    _reused(world, "a", memo)


def test_a_changed_model_or_destination_still_routes_anew() -> None:
    world = _World()
    world.add("a"), world.add("b")
    x = world.add("solo")
    memo = world.ask("a", None)
    _goaway_sent(world, x)
    assert world.ask("b", memo).route.node.name == "b"
    world.router.store.model = model()  # type: ignore[misc]
    assert world.ask("a", memo).route is not memo.route
