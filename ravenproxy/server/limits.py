"""The fronts' resource limits as plain objects (no I/O, no asyncio): the connection gate over
all fronts, the concurrent streams of each client address, and a throttle for log lines that
could otherwise flood (accept failures).

Why these exist: one client holding thousands of half-sent heads, or thousands of idle
``CONNECT`` tunnels, must not take the descriptors, the agents' stream slots or the event loop
from everyone else (and from ``/healthz`` and ``/metrics``, which share the process).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable

DEFAULT_MAX_FRONT_CONNECTIONS = 8192
DEFAULT_MAX_STREAMS_PER_CLIENT = 1000
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_IDLE_TIMEOUT = 4 * 3600.0
"""Like the kubelet's streaming idle timeout (``--streaming-connection-idle-timeout``)."""

FDS_PER_FRONT_CONNECTION = 2
"""A front connection may hold two descriptors: the client's and a target the server dialled
itself (a node in its own gateway); a stream through an agent holds none of its own."""


def front_connection_cap(configured: int, fd_limit: int | None) -> int:
    """The cap actually enforced: ``configured``, lowered so that the fronts at their cap leave
    an eighth of the descriptor limit (at least 64) to everything else — agent tunnels, the
    health and metrics listeners, inventory reloads, logs. ``fd_limit`` None: unlimited."""
    if fd_limit is None or fd_limit <= 0:
        return configured
    reserve = max(64, fd_limit // 8)
    room = (fd_limit - reserve) // FDS_PER_FRONT_CONNECTION
    return max(1, min(configured, room))


def client_key(peer: object) -> str:
    """The address a per-client count is kept under: the peer's IP, an IPv4-mapped IPv6
    address as the IPv4 one (a dual-stack listener sees ``::ffff:10.0.0.1``), anything that is
    not an IP socket address as its text (a Unix socket peer is one client)."""
    host = peer[0] if isinstance(peer, tuple) and peer else peer
    text = str(host)
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class ConnectionGate:
    """Connections open on the fronts, over all of them, and the cap on their number."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the connection cap must be at least 1")
        self.limit = limit
        self.open = 0

    def try_enter(self) -> bool:
        """Take a slot; False (nothing taken) when all are in use."""
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        if self.open <= 0:
            raise RuntimeError("ConnectionGate.leave without a matching try_enter")
        self.open -= 1


class StreamLease:
    """One stream slot of one client address; :meth:`release` gives it back (idempotent, so
    every path that ends a stream may call it)."""

    __slots__ = ("_owner", "client")

    def __init__(self, owner: ClientStreams, client: str) -> None:
        self._owner: ClientStreams | None = owner
        self.client = client

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._release(self.client)


class ClientStreams:
    """Concurrent streams (CONNECT tunnels, upgraded streams, SNI passthroughs, connections to
    targets carrying requests) per client address, capped at ``limit`` each (None: counted,
    never refused — the egress listeners, whose one client is an authenticated kube-apiserver)."""

    def __init__(self, limit: int | None) -> None:
        if limit is not None and limit < 1:
            raise ValueError("the per-client stream cap must be at least 1")
        self.limit = limit
        self._open: dict[str, int] = {}

    def acquire(self, client: str) -> StreamLease | None:
        """A slot for ``client``, or None when it holds ``limit`` already."""
        count = self._open.get(client, 0)
        if self.limit is not None and count >= self.limit:
            return None
        self._open[client] = count + 1
        return StreamLease(self, client)

    def count(self, client: str) -> int:
        return self._open.get(client, 0)

    def __len__(self) -> int:
        """Client addresses holding at least one stream (entries are dropped at zero, so the
        table is bounded by the streams open, not by every address ever seen)."""
        return len(self._open)

    def _release(self, client: str) -> None:
        count = self._open.get(client, 0) - 1
        if count > 0:
            self._open[client] = count
        else:
            self._open.pop(client, None)


class Throttle:
    """At most one event per ``interval`` seconds passes; the others are counted, so the line
    that does pass can say how many were held back."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._next = float("-inf")
        self.suppressed = 0

    def allow(self) -> int | None:
        """None: hold this one back. Otherwise it may pass; the number held back since the
        last one that passed is returned (and reset)."""
        now = self._clock()
        if now < self._next:
            self.suppressed += 1
            return None
        self._next = now + self.interval
        held, self.suppressed = self.suppressed, 0
        return held
