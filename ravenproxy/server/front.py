"""What a front is given: the router, the connector, its limits, its metrics and a task owner —
never the server itself, so the request path runs one way (front → router → connector →
session) and :class:`~ravenproxy.server.app.ProxyServer` stays lifecycle only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.metrics import ServerMetrics, Tallied
from ravenproxy.server.connector import Connector
from ravenproxy.server.limits import ClientStreams, ConnectionGate, StreamLease, client_key
from ravenproxy.server.router import Router
from ravenproxy.transport.relay import RelayResult
from ravenproxy.transport.socket_stream import SocketWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrontLimits:
    """The settings values the fronts read (see ServerSettings for each)."""

    max_header_size: int
    header_timeout: float
    idle_timeout: float
    via: str
    """This process's Via pseudonym (loop detection, :func:`ravenproxy.server.loops.via_token`)."""


class Front(Protocol):
    """What the keep-alive callback path (:mod:`ravenproxy.server.http_callbacks`) uses of its
    front's proxy."""

    front: str
    over_tls: bool
    egress: str | None
    counters: dict[int, list[Tallied]]

    def count(self, status: int) -> None: ...


class Waiter(Protocol):
    """A client connection the drain follows (:meth:`Drain.follow`): ``waiting`` while it
    waits for a next request, whether its task or callbacks serve it."""

    waiting: bool
    writer: SocketWriter


class Drain:
    """The fronts' side of a server drain. A client connection kept alive between requests is
    closed at once when the drain starts if it waits for a next request then (it holds no
    request, and would otherwise hold the drain open up to --drain-timeout); a connection in
    the middle of an exchange finishes it, then closes instead of waiting for another request.

    One mechanism for both ways a connection is served (its task, or callbacks): a connection
    is followed once, for its life (:meth:`follow`, :meth:`unfollow`), and says whether it
    waits by its own ``waiting`` flag, an attribute it sets per request — no set operation per
    request. The drain reads the flags when it starts."""

    def __init__(self) -> None:
        self.draining = False
        self._followed: set[Waiter] = set()

    def start(self) -> int:
        """Start draining; returns how many idle kept-alive connections it closed."""
        self.draining = True
        idle = [waiter.writer for waiter in self._followed if waiter.waiting]
        for writer in idle:
            writer.close()  # the reader sees EOF: the connection ends as if the client left
        return len(idle)

    def follow(self, waiter: Waiter) -> None:
        """Close ``waiter``'s connection when the drain starts if it is ``waiting`` then."""
        self._followed.add(waiter)

    def unfollow(self, waiter: Waiter) -> None:
        self._followed.discard(waiter)


@dataclass(frozen=True)
class FrontContext:
    router: Router
    connector: Connector
    limits: FrontLimits
    gate: ConnectionGate
    """Connections open over all fronts (--max-front-connections)."""
    client_streams: ClientStreams
    """Concurrent streams per client address (--max-streams-per-client)."""
    metrics: ServerMetrics
    track: Callable[[asyncio.Task[Any]], None]
    """Owns a connection task: collected (cancelled after the drain timeout) at shutdown."""
    drain: Drain = field(default_factory=Drain)
    """Set when the server drains: kept-alive connections stop waiting for a next request."""

    def stream_lease(self, front: str, peer: object) -> StreamLease:
        """A stream slot of the client at ``peer`` (--max-streams-per-client); refused with
        :class:`RoutingError` 429 (counted) while that address holds all of its slots."""
        client = client_key(peer)
        lease = self.client_streams.acquire(client)
        if lease is None:
            self.metrics.client_stream_limit.labels(front=front).inc()
            raise RoutingError(
                429,
                "",
                f"too many concurrent streams from {client} (limit {self.client_streams.limit})",
            )
        return lease

    def relay_done(self, front: str, relay: str, result: RelayResult, **fields: object) -> None:
        """Account for a finished relay (``relay``: connect, upgrade, passthrough, request):
        one closed for --idle-timeout is counted and logged."""
        if result.idle:
            self.metrics.idle_timeouts.labels(front=front, relay=relay).inc()
            log.info(
                f"{front} front: idle connection closed",
                extra=kv(relay=relay, idle_timeout=f"{self.limits.idle_timeout:g}s", **fields),
            )
        else:
            log.debug(f"{front} front: {relay} done", extra=kv(error=result.error, **fields))
