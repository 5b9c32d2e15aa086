"""Dial a target on behalf of the cloud: resolve, check against the policy, then connect to the
checked IP. The agent dials with it, and so does the server for targets in its own gateway."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ravenproxy.model.allowlist import Allowlist, IPAddress, denied_always
from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.socket_stream import SocketReader, SocketStream, SocketWriter
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.errors import WireError


class DialError(WireError):
    """Why a target was not dialled; ``code`` goes into OPEN_RESULT."""


@dataclass(frozen=True)
class Dialed:
    """A target dialled: its socket's two halves and the address reached."""

    reader: SocketReader
    writer: SocketWriter
    address: str


async def resolve(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise DialError(f"cannot resolve {host}: {exc.strerror}", ErrorCode.DIAL_FAILED) from None
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0])) for info in infos))


P = TypeVar("P", bound=asyncio.Protocol)


async def dial(
    host: str, port: int, allowlist: Allowlist, timeout: float, *, owner: str = "the agent"
) -> Dialed:
    """Connect to the first permitted address of ``host``; ``owner`` names whose allowlist it is
    in refusals."""
    stream, address = await dial_protocol(
        host, port, allowlist, timeout, lambda: SocketStream(READ_LIMIT), owner=owner
    )
    return Dialed(stream, stream, address)


async def dial_protocol(
    host: str,
    port: int,
    allowlist: Allowlist,
    timeout: float,
    factory: Callable[[], P],
    *,
    owner: str = "the agent",
) -> tuple[P, str]:
    """:func:`dial` with the connection served by ``factory()``'s protocol: (it, the address
    dialled)."""
    addresses = await resolve(host, port)
    permitted = [ip for ip in addresses if allowlist.permits(ip, port)]
    if not permitted:
        shown = ", ".join(str(ip) for ip in addresses)
        if any(denied_always(ip) for ip in addresses):
            why = f"{host}:{port} resolves to an address that is never dialled ({shown})"
        else:
            why = f"{host}:{port} is not in {owner}'s allowlist"
        raise DialError(why, ErrorCode.REFUSED)
    errors: list[str] = []
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            for ip in permitted:
                try:
                    _, protocol = await loop.create_connection(factory, str(ip), port)
                except OSError as exc:
                    errors.append(f"{ip}:{port}: {exc.strerror or exc}")
                    continue
                return protocol, f"{ip}:{port}"
    except TimeoutError:
        raise DialError(
            f"dial {host}:{port} timed out after {timeout:g}s", ErrorCode.DIAL_TIMEOUT
        ) from None
    raise DialError(f"dial {host}:{port} failed: " + "; ".join(errors), ErrorCode.DIAL_FAILED)
