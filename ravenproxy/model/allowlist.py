"""What a gateway may dial: an allowlist of ``HOST:PORT`` entries, and addresses never dialled.

One policy for every dialler: the agent (streams the cloud opens) and the proxy server's own
dials to targets in its gateway both use :func:`gateway_allowlist` and
:func:`ravenproxy.transport.dialer.dial`, so the two can never disagree.

An entry's host is an IP, a CIDR or a name; its port a number, a range ``A-B`` or ``*``.
Names in entries are resolved when the allowlist is built; a name in a *request* is resolved at
dial time and every address it resolves to is checked, then the checked address is dialled, so
a DNS answer cannot smuggle a forbidden address past the check.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ravenproxy.errors import ConfigError
from ravenproxy.model.snapshot import Model

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Link-local covers the 169.254.169.254 metadata service of most clouds; the rest are the other
# well-known metadata endpoints (Alibaba, AWS IPv6) and addresses that are never a real target.
ALWAYS_DENIED: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.0.0/16",
        "fe80::/10",
        "100.100.100.200/32",
        "fd00:ec2::254/128",
        "0.0.0.0/8",
        "::/128",
        "224.0.0.0/4",
        "ff00::/8",
        "255.255.255.255/32",
    )
)


@dataclass(frozen=True)
class AllowEntry:
    """One allowed network and port range (``--allow``)."""

    network: IPNetwork
    port_lo: int
    port_hi: int
    text: str

    def matches(self, ip: IPAddress, port: int) -> bool:
        return self.port_lo <= port <= self.port_hi and ip in self.network


def denied_always(ip: IPAddress) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in net for net in ALWAYS_DENIED)


def _digits(text: str) -> bool:
    # str.isdigit() admits "²" and other non-ASCII digits that int() refuses.
    return text.isascii() and text.isdigit()


def parse_entry(text: str, field: str = "--allow") -> list[AllowEntry]:
    """``HOST:PORT`` → entries (a name may resolve to several addresses)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(field, f"{text!r} is not HOST:PORT")
    host = host.strip("[]")
    if port_text == "*":
        lo, hi = 1, 65535
    else:
        lo_text, dash, hi_text = port_text.partition("-")
        if not _digits(lo_text) or (dash and not _digits(hi_text)):
            raise ConfigError(field, f"{text!r}: port must be N, N-M or *")
        lo = int(lo_text)
        hi = int(hi_text) if dash else lo
        if not 1 <= lo <= hi <= 65535:
            raise ConfigError(field, f"{text!r}: port out of range")
    try:
        networks: list[IPNetwork] = [ipaddress.ip_network(host, strict=False)]
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except socket.gaierror as exc:
            raise ConfigError(field, f"{text!r}: cannot resolve {host}: {exc.strerror}") from None
        networks = list(dict.fromkeys(ipaddress.ip_network(str(info[4][0])) for info in infos))
    return [AllowEntry(net, lo, hi, text) for net in networks]


class Allowlist:
    def __init__(self, entries: Iterable[AllowEntry] = ()) -> None:
        self.entries = tuple(entries)

    @classmethod
    def parse(cls, texts: Sequence[str], field: str = "--allow") -> Allowlist:
        entries: list[AllowEntry] = []
        for text in texts:
            entries.extend(parse_entry(text, field))
        return cls(entries)

    @classmethod
    def from_model(cls, model: Model, node_name: str, extra_ports: Sequence[int] = ()) -> Allowlist:
        """The default: the InternalIPs of the nodes this agent serves, on their kubelet port
        and on any extra (metrics) ports."""
        entries: list[AllowEntry] = []
        for node in model.peers_of(node_name):
            for ip in node.internal_ips:
                net = ipaddress.ip_network(ip)
                for port in (node.kubelet_port, *extra_ports):
                    entries.append(AllowEntry(net, port, port, f"{node.name}:{port}"))
        return cls(entries)

    @classmethod
    def pods_of(cls, model: Model, node_name: str) -> Allowlist:
        """``--allow-pods``: the pod CIDRs (:meth:`Model.pod_cidrs_of`) of the nodes this
        agent serves, on any port."""
        return cls(
            AllowEntry(net, 1, 65535, f"pods of {node.name}")
            for node in model.peers_of(node_name)
            for net in model.pod_cidrs_of(node.name)
        )

    def __add__(self, other: Allowlist) -> Allowlist:
        return Allowlist(self.entries + other.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def permits(self, ip: IPAddress, port: int) -> bool:
        if denied_always(ip):
            return False
        return any(entry.matches(ip, port) for entry in self.entries)

    def describe(self) -> list[str]:
        return [
            f"{e.network}:{e.port_lo}" + (f"-{e.port_hi}" if e.port_hi != e.port_lo else "")
            for e in self.entries
        ]


def gateway_allowlist(
    model: Model,
    node_name: str,
    metrics_ports: Sequence[int] = (),
    extra: Allowlist | None = None,
    *,
    pods: bool = False,
) -> Allowlist:
    """The policy of ``node_name``'s dialler: its gateway's nodes (itself only, in no gateway)
    on their kubelet port and on ``metrics_ports``, with ``pods`` their pod IPs on any port,
    plus the ``--allow`` entries in ``extra``. Link-local and metadata addresses are refused
    whatever the entries say."""
    policy = Allowlist.from_model(model, node_name, metrics_ports)
    if pods:
        policy += Allowlist.pods_of(model, node_name)
    return policy + extra if extra is not None else policy
