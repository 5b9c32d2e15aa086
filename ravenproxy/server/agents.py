"""``GET /agents`` on the server's metrics address (``--metrics-addr``, never the health
address): which agents hold a tunnel, since when.

``[{"node", "connected_since", "connections"}]``, for ``ravenproxy controller --agents-url``
(servers without API access) and for people. With API access the server says the same through
agent Leases (:mod:`ravenproxy.server.liveness`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from ravenproxy.kube.leases import micro_time


def agents_report(
    sessions: Iterable[Any],
    now: float | None = None,
    monotonic_now: float | None = None,
) -> list[dict[str, Any]]:
    """One entry per connected node: since when (its oldest tunnel), and how many tunnels.
    ``sessions`` are the registry's sessions: ``.name`` is the node, ``.started`` the
    ``time.monotonic()`` of the connect."""
    wall = time.time() if now is None else now
    mono = time.monotonic() if monotonic_now is None else monotonic_now
    oldest: dict[str, float] = {}
    count: dict[str, int] = {}
    for s in sessions:
        oldest[s.name] = min(oldest.get(s.name, s.started), s.started)
        count[s.name] = count.get(s.name, 0) + 1
    return [
        {
            "node": node,
            "connected_since": micro_time(wall - (mono - oldest[node])),
            "connections": count[node],
        }
        for node in sorted(oldest)
    ]


def agents_handler(
    sessions: Callable[[], Iterable[Any]],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``GET /agents`` for the server's metrics app: ``sessions`` is ``registry.sessions``."""

    async def handler(_: web.Request) -> web.Response:
        return web.json_response({"agents": agents_report(sessions())})

    return handler


def add_agents_route(app: web.Application, sessions: Callable[[], Iterable[Any]]) -> None:
    app.router.add_get("/agents", agents_handler(sessions))
