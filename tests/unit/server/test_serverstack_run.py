"""Branch serverstack (issue 15): ``CallbackPath._run`` without its written-out copies of
``_route_again`` and of ``HttpProxy.count``'s usual case (each piece of logic in one place),
against 1bb5933's, differentially.

1bb5933's ``_run`` is kept below VERBATIM in a subclass of today's :class:`CallbackPath`
(everything else the same): two like connections served by their callbacks (test_review24's
world: a real :class:`SocketStream` for the client, a stand-in tunnel stream offering chunks as
:meth:`TunnelStream._feed` does) are fed the same generated events — answers of every framing
cut anywhere, requests kept on the stream, pipelined, sent to another node or to none (a 404
refusal), a client that stops reading or goes — and after each both wrote the same bytes, hold
the same state (test_review24's view), routed the same requests with the same memo handed
back, and counted the same statuses in the same ``ravenproxy_requests_total`` series (a real
:class:`HttpProxy`'s counters over :class:`ServerMetrics`, not a stand-in). Nothing is
imported from a baseline checkout.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.errors import RoutingError
from ravenproxy.server.exchange_actions import (
    Action,
    CloseUpstream,
    Looped,
    RouteRequest,
    WriteClient,
    WriteUpstream,
)
from ravenproxy.server.http_callbacks import CallbackPath
from ravenproxy.server.http_proxy import HttpProxy
from tests.helpers import examples

from .test_review24_callbacks import (
    _ROUTES,
    _connection,
    _Event,
    _events,
    _outcome,
    _World,
)


class _OldRun(CallbackPath):
    """Today's callback path with 1bb5933's ``_run``."""

    # -- 1bb5933's CallbackPath._run, verbatim ----------------------------------------------------
    def _run(self, actions: list[Action]) -> None:
        """Carry out the actions that need no waiting, in order; from the first that does,
        leave them to the task."""
        # A list's iterator takes what is appended while it runs (a route's actions). Counted
        # by hand, not by enumerate (an object made per call, twice a request).
        done = -1
        for action in actions:
            done += 1
            # By exact type (no action class is subclassed): a comparison each, not a call.
            if type(action) is WriteClient:
                status = action.status
                if status:  # an answer's head: counted (HttpProxy.count's common case inline)
                    counters = self.proxy.counters.get(status)
                    if counters is None:
                        self.proxy.count(status)
                    else:
                        for counter in counters:
                            counter.n += 1
                write = self._write
                if write is not None:
                    write(action.data)
                else:  # between requests, in the task's time (a kept connection's end)
                    self.writer.write(action.data)
            elif type(action) is WriteUpstream:
                stream, data = self._hooked, action.data
                sent = stream.try_write(data) if stream is not None else 0
                if sent < len(data):
                    rest = WriteUpstream(data[sent:]) if sent else action
                    return self._leave([rest, *actions[done + 1 :]])
            elif type(action) is RouteRequest and self.proxy.egress is None:
                # _route_again inline (a call a request).
                try:
                    self.routed = memo = self.ctx.router.route_again(
                        action.dest, self.proxy.over_tls, self.routed
                    )
                except RoutingError as exc:
                    actions.extend(self.ex.refused(exc.status, exc.node, exc.reason))
                else:
                    actions.extend(self.ex.routed(memo.route))
            elif type(action) is CloseUpstream:
                if action.stray:
                    self._count_stray()
                self._unhook()
                self._close_upstream()
            elif type(action) is Looped:
                self.ctx.metrics.loops.labels(kind="via").inc()
            else:
                return self._leave(actions[done:])
        return None


class _Router:
    """Routes as test_review24's stand-in does, numbering the memos it hands out and recording
    each call: what was asked, with which memo handed back."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, int | None]] = []

    def route_again(self, dest: Any, over_tls: bool, memo: Any) -> SimpleNamespace:
        self.calls.append((dest.host, over_tls, None if memo is None else memo.n))
        to = _ROUTES.get(dest.host)
        if to is None:
            raise RoutingError(404, dest.host, "no such node")
        return SimpleNamespace(route=to, n=len(self.calls))


def _world(base: type, egress: str | None = None) -> _World:
    world = _World(_connection(base))
    conn = world.conn
    conn.ctx.router = _Router()
    # Its own count over real series (an egress listener's count in two).
    conn.proxy = HttpProxy(conn.ctx, "http", over_tls=False, egress=egress)
    return world


def _state(world: _World) -> tuple[object, ...]:
    conn = world.conn
    metrics = conn.ctx.metrics
    counted = sorted(
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for tally in (metrics.requests, metrics.egress_requests)
        for family in tally.collect()
        for s in family.samples
        if s.name.endswith("_total")
    )
    memo = conn.routed.n if conn.routed is not None else None
    return (*world.state(), counted, list(conn.ctx.router.calls), memo)


async def _both(events: list[_Event], egress: str | None) -> None:
    worlds = [_world(_OldRun, egress), _world(CallbackPath, egress)]
    old, new = worlds
    for _ in range(2):
        await asyncio.sleep(0)
    assert _state(new) == _state(old)
    for i, event in enumerate(events):
        for world in worlds:
            world.step(event)
        for _ in range(3):  # the task, once the callbacks left: it returns
            await asyncio.sleep(0)
        assert _state(new) == _state(old), (i, event)
        if old.task.done() or old.conn._exit is None:
            old.sock.resume_writing()
            new.sock.resume_writing()
            assert await _outcome(new.task) == await _outcome(old.task)
            assert _state(new) == _state(old)
            return
    for world in worlds:
        world.sock.resume_writing()
        world.conn._leave([])
        await world.task


@settings(max_examples=examples(800), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_events(), st.sampled_from([None, "uds"]))
def test_the_callbacks_route_and_count_as_1bb5933s(
    events: list[_Event], egress: str | None
) -> None:
    asyncio.run(_both(events, egress))


def test_the_oracle_counts_in_the_real_series() -> None:
    """The view compares what matters: a request served counts 200 in the front's series."""

    async def main() -> None:
        world = _world(CallbackPath)
        await asyncio.sleep(0)
        world.step(("client", "get"))
        await asyncio.sleep(0)
        world.step(("chunk", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
        await asyncio.sleep(0)
        labels = (("front", "http"), ("status", "200"))
        assert _state(world)[-3] == [("ravenproxy_server_front_requests_total", labels, 1.0)]
        world.conn._leave([])
        await world.task

    asyncio.run(main())
