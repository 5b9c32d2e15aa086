"""A keep-alive client's route is reused while the registry's generation has not moved
(``Router.route_again`` no longer asks ``AgentRegistry.live`` per request): every change that
ends a registered agent's liveness must move it, at the moment it happens, before the agent is
unregistered. One test per place that ends it — a GOAWAY sent (a drain, a connection error
found outside the wire, a protocol error found by it), a GOAWAY received, the session's end —
each with the real connection (and the real session for its end): with that place's
``on_draining`` call taken out, its test fails."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from pathlib import Path
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
from ravenproxy.wire.errors import ProtocolError
from ravenproxy.wire.frames import Settings, encode

from ..transport.test_session import WAIT, tunnel
from ..wire.harness import Pair
from .test_routing import FakeConn, FakeSession, model

METRICS = Destination("host", "a", 9100, target="/metrics")


def _routed(session: Session) -> tuple[AgentRegistry, Router, RouteMemo]:
    """``session`` registered as node a's only agent, and a keep-alive client's route to a."""
    registry = AgentRegistry()
    registry.add("a", session)
    router = Router(ModelStore(model()), registry, None)
    memo = router.route_again(METRICS, False, None)
    assert memo.route.session is session
    assert router.route_again(METRICS, False, memo) is memo  # reused while nothing changed
    return registry, router, memo


def _not_reused(registry: AgentRegistry, router: Router, memo: RouteMemo) -> None:
    """The agent is still registered, no longer live, and the route is decided anew: no
    agent left for a (503), not the memo's."""
    session = memo.route.session
    assert session is not None
    assert session in registry.sessions()
    assert not registry.live(session)
    with pytest.raises(RoutingError) as info:
        router.route_again(METRICS, False, memo)
    assert info.value.status == 503


def _wire_session(conn: Connection) -> Session:
    return cast(Session, FakeSession("a", conn=cast(FakeConn, conn)))


def _drain(pair: Pair) -> None:
    pair.server.goaway(ErrorCode.OK, "draining")


def _fail(pair: Pair) -> None:
    pair.server.fail(ErrorCode.ENHANCE_YOUR_CALM, "flood")


def _protocol_error(pair: Pair) -> None:
    with pytest.raises(ProtocolError):  # found by the wire: SETTINGS twice
        pair.server.receive_message(encode(Settings(())))


def _goaway_received(pair: Pair) -> None:
    pair.agent.goaway(ErrorCode.OK, "agent draining")
    pair.transfer(pair.agent)


@pytest.mark.parametrize(
    "change",
    [_drain, _fail, _protocol_error, _goaway_received],
    ids=["goaway-sent", "fail", "protocol-error", "goaway-received"],
)
def test_a_wire_change_that_ends_liveness_moves_the_generation(
    change: Callable[[Pair], None],
) -> None:
    pair = Pair()
    registry, router, memo = _routed(_wire_session(pair.server))
    before = registry.generation
    change(pair)
    assert registry.generation > before
    _not_reused(registry, router, memo)


def test_each_change_moves_it_again_and_nobody_asking_is_fine() -> None:
    """Not only the first: a drain after a GOAWAY received moves it too (calls more only cost
    a memo). A connection nobody registered (the agent's) calls nothing."""
    pair = Pair()
    registry, _, _ = _routed(_wire_session(pair.server))
    _goaway_received(pair)
    once = registry.generation
    _drain(pair)
    assert registry.generation == once + 1
    pair.agent.goaway(ErrorCode.OK, "again")  # the agent's side: on_draining None
    pair.agent.ended()
    assert pair.agent.on_draining is None


async def test_the_sessions_end_moves_it_before_it_is_unregistered() -> None:
    """The session ended (the agent's WebSocket closed): ``closed`` is set in ``run``'s
    ``finally``, which still awaits its tasks and the closing handshake before the server's
    tunnel handler unregisters it. Meanwhile its route is not reused."""
    async with tunnel() as t:
        registry, router, memo = _routed(t.cloud)
        await t.edge_ws.close()
        await asyncio.wait_for(t.cloud_run, WAIT)
        assert t.cloud.closed
        _not_reused(registry, router, memo)


async def test_a_real_sessions_goaway_either_way_moves_it() -> None:
    async with tunnel() as t:
        registry, router, memo = _routed(t.cloud)
        t.edge.goaway("agent draining")
        for _ in range(200):
            if t.cloud.conn.goaway_received is not None:
                break
            await asyncio.sleep(0.01)
        _not_reused(registry, router, memo)
    async with tunnel() as t:
        registry, router, memo = _routed(t.cloud)
        t.cloud.goaway("server shutting down")
        _not_reused(registry, router, memo)


def test_liveness_is_ended_only_where_the_generation_hears_of_it() -> None:
    """A new place that sets a GOAWAY or ends a session without ``on_draining`` would let a
    memo outlive its agent: every assignment to ``goaway_sent`` / ``goaway_received`` in the
    package is in wire/drain.py (or ``None``, the connection's start), and the session's one
    ``closed = True`` is followed at once by ``conn.ended()``."""
    package = Path(__file__).resolve().parents[3] / "ravenproxy"
    found: list[str] = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if not isinstance(target, ast.Attribute):
                    continue
                where = f"{path.relative_to(package)}:{node.lineno}"
                if target.attr in ("goaway_sent", "goaway_received"):
                    none = isinstance(node.value, ast.Constant) and node.value.value is None
                    if not none and path.name != "drain.py":
                        found.append(where)
                falsy = isinstance(node.value, ast.Constant) and node.value.value is False
                if target.attr == "closed" and path.name == "session.py" and not falsy:
                    found.append(where)
    session = package / "transport" / "session.py"
    assert len([f for f in found if f.startswith("transport/session.py")]) == 1, found
    assert [f for f in found if not f.startswith("transport/session.py")] == [], found
    line = int(found[0].rpartition(":")[2])
    lines = session.read_text().splitlines()
    assert lines[line - 1].strip() == "self.closed = True"
    assert lines[line].strip().startswith("self.conn.ended()")
