"""What :class:`~ravenproxy.server.exchange.Exchange` asks its driver to do: the commands of the
sans-I/O HTTP exchange, as data."""

from __future__ import annotations

from dataclasses import dataclass

from ravenproxy.server.podroutes import Destination
from ravenproxy.server.router import Route


@dataclass(slots=True)  # not frozen: one per request that differs, set without __setattr__
class RouteRequest:
    """Route the request to ``dest``; answer with :meth:`Exchange.routed` or
    :meth:`Exchange.refused`."""

    dest: Destination


@dataclass(frozen=True)
class Tunnel:
    """CONNECT: route ``dest`` (no TLS of ours), answer 200, relay raw bytes; ``rest`` was read
    from the client past the head."""

    dest: Destination
    rest: bytes


@dataclass(frozen=True)
class OpenUpstream:
    """Open a target connection for ``route``; then :meth:`Exchange.upstream_opened`."""

    route: Route


@dataclass(frozen=True)
class CloseUpstream:
    """Close the target connection (it cannot carry anything more)."""

    stray: bool = False
    """The target sent bytes past its answer's end or while no request was outstanding (logged
    and counted as the connection is let go: it misbehaves)."""


# The two made per request (the others are made once, or per refusal): slotted, not frozen —
# a frozen dataclass's __init__ sets its field through object.__setattr__, twice the cost. No
# one changes or hashes an action. Where the exchange makes one per request or answer it
# builds it by ``object.__new__`` and stores EVERY field (no __init__ runs: a field left unset
# would raise AttributeError when read; status's default is not applied either).
@dataclass(slots=True)
class WriteUpstream:
    data: bytes


@dataclass(slots=True)
class WriteClient:
    data: bytes
    status: int = 0
    """The status of the final answer (200 and up) whose head ``data`` holds: counted once, as
    it goes to the client; 0 for none (a body's bytes, an interim answer). Not an action of its
    own: one fewer an answer to make and to carry out."""


@dataclass(frozen=True)
class Looped:
    """The request already passed through this server (its Via): counted as a loop."""


@dataclass(frozen=True)
class ReadBody:
    """The rest of the request body is to be read from the client (into
    :meth:`Exchange.receive_client`) while the response is read."""


@dataclass(frozen=True)
class SwitchProtocols:
    """The target answered 101: once the request body is through, take
    :meth:`Exchange.switch` and relay raw bytes both ways."""


@dataclass(frozen=True)
class Refuse:
    """Answer ``status`` with a one-line body naming the node and the reason, then close."""

    status: int
    node: str
    reason: str


@dataclass(frozen=True)
class Close:
    """End the client connection (mid-response: no status can be given any more)."""

    reason: str


Action = (
    RouteRequest
    | Tunnel
    | OpenUpstream
    | CloseUpstream
    | WriteUpstream
    | WriteClient
    | Looped
    | ReadBody
    | SwitchProtocols
    | Refuse
    | Close
)
