"""Which servers an agent dials: the addresses of ``--discover-servers`` (pure, from the model),
and the address a tunnel slot dials next. No I/O."""

from __future__ import annotations

from ravenproxy.model.objects import ENDPOINT_PROXY
from ravenproxy.model.snapshot import Model

REDIAL_AFTER_UP = 1.0
"""A tunnel that was up is re-dialled within this many seconds (uniformly jittered): its
server is draining or restarting, and most likely back at once, or another server is."""

QUICK_REDIAL_WINDOW = 10.0
"""After a tunnel that was up is lost, failed dials keep being retried about
:data:`REDIAL_AFTER_UP` apart (0.5-1.5 times it) until the waits add up to this many seconds
(a restart takes a few); then the exponential backoff (``--backoff-base``, ``--backoff-cap``)
takes over."""

HEALTHY_AFTER = 1.0
"""A tunnel that ended sooner than this after it came up counts as a failed dial (so a server
that accepts and drops at once is re-dialled with the backoff, not every second)."""


def discovered_servers(model: Model) -> tuple[str, ...]:
    """The tunnel address of every server, as Raven's agent finds them: the public IP and port
    of every active proxy endpoint of every exposed gateway, sorted, without duplicates.
    Endpoints without both are skipped (the controller fills them in once it has elected)."""
    found: set[str] = set()
    for gateway in model.gateways.values():
        if not gateway.exposed:
            continue
        for endpoint in gateway.active_of(ENDPOINT_PROXY):
            if endpoint.public_ip and 0 < endpoint.public_port < 65536:
                host = (
                    f"[{endpoint.public_ip}]" if ":" in endpoint.public_ip else endpoint.public_ip
                )
                found.add(f"wss://{host}:{endpoint.public_port}")
    return tuple(sorted(found))


def slot_address(addresses: tuple[str, ...], slot: int, turn: int) -> str:
    """The address slot ``slot`` dials on its ``turn``-th try: its own address first (slot i
    → address i, so with one address per server each slot stays with its server and returns to
    it after a restart), then the next ones in order. A slot moves on (``turn`` + 1) after a
    duplicate, and after a failed dial only when there are more addresses than slots."""
    return addresses[(slot + turn) % len(addresses)]
