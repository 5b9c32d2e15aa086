"""The agent's allowlist: entry syntax, always-denied addresses, and the model default."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.errors import ConfigError
from ravenproxy.model import load_inventory
from ravenproxy.model.allowlist import ALWAYS_DENIED, Allowlist, denied_always, parse_entry

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "inventory-example.yaml"
ip = ipaddress.ip_address


@pytest.mark.parametrize(
    ("text", "network", "lo", "hi"),
    [
        ("10.0.0.1:10250", "10.0.0.1/32", 10250, 10250),
        ("10.0.0.0/8:80-90", "10.0.0.0/8", 80, 90),
        ("10.1.2.3/8:*", "10.0.0.0/8", 1, 65535),
        ("[::1]:80", "::1/128", 80, 80),
        ("[fd00::/64]:443", "fd00::/64", 443, 443),
        ("192.168.1.1:1-65535", "192.168.1.1/32", 1, 65535),
    ],
)
def test_parse_entry(text: str, network: str, lo: int, hi: int) -> None:
    (entry,) = parse_entry(text)
    assert entry.network == ipaddress.ip_network(network)
    assert (entry.port_lo, entry.port_hi) == (lo, hi)
    assert entry.text == text


def test_hostname_entry_resolves() -> None:
    entries = parse_entry("localhost:8080")
    assert entries
    assert all(e.network.num_addresses == 1 for e in entries)
    assert any(e.network.network_address.is_loopback for e in entries)
    allow = Allowlist(entries)
    assert allow.permits(ip("127.0.0.1"), 8080) or allow.permits(ip("::1"), 8080)


@pytest.mark.parametrize(
    "text",
    [
        "10.0.0.1",
        ":80",
        "10.0.0.1:",
        "10.0.0.1:x",
        "10.0.0.1:0",
        "10.0.0.1:65536",
        "10.0.0.1:90-80",
        "10.0.0.1:80-",
        "10.0.0.1:-80",
        "10.0.0.1:+80",
        "no-such-host.invalid:80",
    ],
)
def test_bad_entries_name_the_flag(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        Allowlist.parse([text])
    assert info.value.field == "--allow"
    assert "--allow" in str(info.value)


def test_bad_entry_names_the_given_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_entry("nope", field="allow[2]")
    assert info.value.field == "allow[2]"


def test_superscript_digit_port_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_entry("10.0.0.1:²")


def test_permits_ip_and_port_ranges() -> None:
    allow = Allowlist.parse(["10.0.0.0/24:80-90", "[fd00::1]:443", "192.168.0.7:*"])
    assert allow.permits(ip("10.0.0.9"), 80)
    assert allow.permits(ip("10.0.0.9"), 90)
    assert not allow.permits(ip("10.0.0.9"), 91)
    assert not allow.permits(ip("10.0.1.9"), 80)
    assert allow.permits(ip("fd00::1"), 443)
    assert not allow.permits(ip("fd00::2"), 443)
    assert allow.permits(ip("192.168.0.7"), 1)
    assert allow.permits(ip("192.168.0.7"), 65535)
    assert len(allow) == 3
    assert allow.describe() == ["10.0.0.0/24:80-90", "fd00::1/128:443", "192.168.0.7/32:1-65535"]


def test_empty_allowlist_permits_nothing() -> None:
    assert not Allowlist().permits(ip("127.0.0.1"), 80)


DENIED = [
    "169.254.169.254",
    "169.254.0.1",
    "fe80::1",
    "fe80::1%eth0",
    "100.100.100.200",
    "fd00:ec2::254",
    "::ffff:169.254.169.254",
    "::ffff:100.100.100.200",
    "0.0.0.0",
    "::",
    "224.0.0.1",
    "ff02::1",
    "255.255.255.255",
]


@pytest.mark.parametrize("address", DENIED)
def test_always_denied_even_when_allowed(address: str) -> None:
    allow = Allowlist.parse(["0.0.0.0/0:*", "[::/0]:*", f"[{address.split('%')[0]}]:*"])
    assert denied_always(ip(address))
    assert not allow.permits(ip(address), 80)


def test_wide_entries_still_permit_ordinary_addresses() -> None:
    allow = Allowlist.parse(["0.0.0.0/0:*", "[::/0]:*"])
    assert allow.permits(ip("10.1.2.3"), 10250)
    assert allow.permits(ip("127.0.0.1"), 22)
    assert allow.permits(ip("2001:db8::1"), 443)
    assert not denied_always(ip("100.100.100.201"))
    assert not denied_always(ip("fd00:ec2::253"))


def _denied_addresses() -> st.SearchStrategy[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    def inside(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> st.SearchStrategy[int]:
        return st.integers(int(net.network_address), int(net.broadcast_address))

    plain = st.one_of(
        *(
            inside(net).map(
                lambda n, v=net.version: (
                    ipaddress.ip_address(n) if v == 4 else ipaddress.IPv6Address(n)
                )
            )
            for net in ALWAYS_DENIED
        )
    )
    mapped = plain.filter(lambda a: a.version == 4).map(
        lambda a: ipaddress.IPv6Address(f"::ffff:{a}")
    )
    return st.one_of(plain, mapped)


@given(
    address=_denied_addresses(),
    port=st.integers(1, 65535),
    entries=st.lists(
        st.sampled_from(
            ["0.0.0.0/0:*", "[::/0]:*", "169.254.0.0/16:*", "[::ffff:0:0/96]:*", "[fe80::/10]:*"]
        ),
        min_size=1,
    ),
)
def test_permits_never_admits_an_always_denied_address(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, entries: list[str]
) -> None:
    assert not Allowlist.parse(entries).permits(address, port)


def test_from_model_serves_gateway_peers_on_kubelet_and_extra_ports() -> None:
    model = load_inventory(EXAMPLE)
    allow = Allowlist.from_model(model, "edge-1", extra_ports=[9100])
    # edge-1 and edge-2 (same gateway), kubelet port 20250 from the inventory, plus 9100.
    assert allow.permits(ip("127.0.0.1"), 20250)
    assert allow.permits(ip("127.0.0.2"), 20250)
    assert allow.permits(ip("127.0.0.2"), 9100)
    assert not allow.permits(ip("127.0.0.2"), 10250)
    assert not allow.permits(ip("127.0.0.3"), 20250)  # edge-3 is in no gateway
    assert sorted(e.text for e in allow.entries) == [
        "edge-1:20250",
        "edge-1:9100",
        "edge-2:20250",
        "edge-2:9100",
    ]


def test_from_model_solo_node_serves_only_itself() -> None:
    model = load_inventory(EXAMPLE)
    allow = Allowlist.from_model(model, "edge-3")
    assert allow.permits(ip("127.0.0.3"), 20250)
    assert not allow.permits(ip("127.0.0.2"), 20250)
    assert len(Allowlist.from_model(model, "ghost")) == 0


def test_allowlists_add() -> None:
    both = Allowlist.parse(["10.0.0.1:80"]) + Allowlist.parse(["10.0.0.2:81"])
    assert len(both) == 2
    assert both.permits(ip("10.0.0.2"), 81)
