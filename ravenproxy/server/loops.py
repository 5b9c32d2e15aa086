"""Loop prevention: the server never proxies a request to itself.

Two guards, because a loop can close in two ways:

- **Its own listeners.** Before the server dials a target itself, :meth:`OwnListeners.which`
  says whether that address and port is one of its own bound sockets — by the exact bound
  address, or, for a wildcard bind (``0.0.0.0``/``::``), by any address of this host (the node's
  InternalIP, loopback, ...). A front answers ``508 Loop Detected``; other own listeners
  (metrics, health, tunnel) are refused like any target outside the policy.
- **Another hop.** A request can leave through something else (a relay, another proxy) that leads
  back here. Every request the server forwards carries ``Via: 1.1 <token>`` (RFC 9110 §7.6.3),
  the token unique to this process; a request that arrives already carrying it has been here
  before: ``508``.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

FRONTS = frozenset({"http", "https", "egress"})
"""Listeners that proxy what they receive: dialling one of them is a loop."""


@dataclass(frozen=True)
class Listener:
    name: str
    address: IPAddress
    port: int

    @property
    def wildcard(self) -> bool:
        return self.address.is_unspecified


def _plain(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_local_address(ip: IPAddress) -> bool:
    """Whether ``ip`` is an address of this host (a socket can be bound to it)."""
    ip = _plain(ip)
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
    except OSError:
        return False
    return True


class OwnListeners:
    """The server's bound sockets, recorded as they are bound."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def add(self, name: str, socknames: Iterable[tuple[object, ...]]) -> None:
        for sockname in socknames:
            host, port = str(sockname[0]), int(sockname[1])  # type: ignore[call-overload]
            address = _plain(ipaddress.ip_address(host.split("%", 1)[0]))
            self._listeners.append(Listener(name, address, port))

    def __iter__(self) -> object:
        return iter(self._listeners)

    def which(self, ip: IPAddress, port: int) -> str | None:
        """The name of the listener ``ip:port`` reaches, or None when it is none of ours."""
        ip = _plain(ip)
        candidates = [lst for lst in self._listeners if lst.port == port]
        for lst in candidates:
            if lst.address == ip:
                return lst.name
        for lst in candidates:
            # A wildcard socket of either family answers on every local address (an IPv6 one
            # is dual-stack by default): the bind probe tells whether ip is one.
            if lst.wildcard and is_local_address(ip):
                return lst.name
        return None


def via_token(node_name: str | None) -> str:
    """This process's Via pseudonym: readable (the node), and unique (two servers on one node,
    or one restarted, never share it)."""
    return f"ravenproxy-{node_name or socket.gethostname()}-{secrets.token_hex(4)}"


def via_received_by(values: Iterable[str]) -> list[str]:
    """The ``received-by`` of each Via entry (``1.1 proxy-a, HTTP/1.0 proxy-b (comment)``)."""
    seen: list[str] = []
    for value in values:
        for entry in value.split(","):
            parts = entry.split()
            if len(parts) >= 2:
                seen.append(parts[1])
    return seen
