"""CIDR sets: parse, split by family, merge (collapse) without ever widening.

Skip-SNAT rules, routes and traffic selectors are built from merged subnets. Merging only joins
adjacent siblings and drops contained networks, so the merged set covers exactly the input
addresses — never a supernet that reaches into someone else's address space (Raven's /12
"supernet" plan does, which is why a fixed supernet is only taken from configuration).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from ravenproxy.l3.errors import CidrError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_network(text: str, *, strict: bool = False) -> Network:
    """``"10.16.0.0/24"`` → network. A bare address is a host network (/32 or /128).

    With ``strict=False`` host bits are masked off (``10.16.0.5/24`` → ``10.16.0.0/24``), as
    Kubernetes itself does for podCIDRs written by hand.
    """
    try:
        return ipaddress.ip_network(text.strip(), strict=strict)
    except ValueError as exc:
        raise CidrError(f"{text!r} is not a CIDR: {exc}") from None


def collapse_networks(networks: Iterable[Network]) -> tuple[Network, ...]:
    """Merged networks, IPv4 first then IPv6, each family sorted by address."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for net in networks:
        if isinstance(net, ipaddress.IPv4Network):
            v4.append(net)
        else:
            v6.append(net)
    return _collapse_split(v4, v6)


def _collapse_split(
    v4: list[ipaddress.IPv4Network], v6: list[ipaddress.IPv6Network]
) -> tuple[Network, ...]:
    out: list[Network] = []
    out.extend(ipaddress.collapse_addresses(v4))
    out.extend(ipaddress.collapse_addresses(v6))
    return tuple(out)


def collapse(cidrs: Iterable[str]) -> tuple[str, ...]:
    """Merge CIDR strings: adjacent siblings join, contained networks vanish, nothing widens.

    Result: canonical strings, IPv4 first then IPv6, sorted by address; empty input → ``()``.
    """
    return tuple(str(n) for n in collapse_networks(parse_network(c) for c in cidrs))


def family_of(cidr: str) -> int:
    """4 or 6."""
    return parse_network(cidr).version


def of_family(cidrs: Iterable[str], family: int) -> tuple[str, ...]:
    return tuple(c for c in cidrs if family_of(c) == family)


def subtract(cidrs: Iterable[str], remove: Iterable[str]) -> tuple[str, ...]:
    """Addresses of ``cidrs`` that are not in ``remove``, merged."""
    remaining: list[Network] = [parse_network(c) for c in collapse(cidrs)]
    for r in collapse(remove):
        cut = parse_network(r)
        nxt: list[Network] = []
        for net in remaining:
            if net.version != cut.version or not net.overlaps(cut):
                nxt.append(net)
            elif cut.supernet_of(net):  # type: ignore[arg-type]
                continue
            else:
                # ``net`` strictly contains ``cut``: keep the pieces around it.
                nxt.extend(net.address_exclude(cut))  # type: ignore[arg-type]
        remaining = nxt
    return collapse(str(n) for n in remaining)


def contains(outer: Iterable[str], inner: str) -> bool:
    """Is every address of ``inner`` inside the union of ``outer``?"""
    return not subtract([inner], outer)
