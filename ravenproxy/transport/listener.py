"""A listening address's sockets, bound as asyncio's ``create_server`` binds them: one per
address the host resolves to, ``SO_REUSEADDR``, an IPv6 socket IPv6 only, and a family this host
lacks (a kernel booted with ``ipv6.disable=1`` still resolves ``::`` for every interface) skipped
rather than failing the start. Shared by the tunnel listener and the start-up check of every
listening flag, so the check binds what the listener will."""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence
from typing import Any

AddressInfo = tuple[int, int, int, str, Any]
"""One ``socket.getaddrinfo`` entry: family, type, proto, canonical name, address."""

MISSING_FAMILY = frozenset({errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT})
"""What ``socket()`` fails with for a family or protocol the host does not have."""


class BindError(OSError):
    """An address of the set cannot be bound, or no address's family exists on this host;
    ``strerror`` is the OS's reason, the message names the address as asyncio's does."""

    def __init__(self, exc: OSError, address: Any) -> None:
        super().__init__(exc.errno, exc.strerror or str(exc))
        self.address = address

    def __str__(self) -> str:
        return f"error while attempting to bind on address {self.address!r}: {self.strerror}"


def bind_each(infos: Sequence[AddressInfo]) -> list[socket.socket]:
    """A bound socket for each distinct entry of ``infos`` whose family the host has; a
    :class:`BindError` for the address that cannot be bound (none is left open), or for the
    first address when no entry's family exists here."""
    bound: list[socket.socket] = []
    missing: BindError | None = None
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError as exc:
                if exc.errno not in MISSING_FAMILY:
                    raise
                missing = missing or BindError(exc, address)
                continue
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise BindError(exc, address) from None
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    if not bound and missing is not None:
        raise missing
    return bound
