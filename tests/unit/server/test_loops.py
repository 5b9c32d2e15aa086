"""Loop prevention as data: which of the server's own listeners an address reaches, and Via."""

from __future__ import annotations

import ipaddress

from ravenproxy.server.loops import (
    OwnListeners,
    is_local_address,
    via_received_by,
    via_token,
)


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_an_exact_bind_matches_only_its_address_and_port() -> None:
    own = OwnListeners()
    own.add("http", [("127.0.0.1", 10264)])
    own.add("metrics", [("127.0.0.1", 10266)])
    assert own.which(ip("127.0.0.1"), 10264) == "http"
    assert own.which(ip("127.0.0.1"), 10266) == "metrics"
    assert own.which(ip("127.0.0.2"), 10264) is None  # another address, same port
    assert own.which(ip("127.0.0.1"), 10265) is None
    assert own.which(ip("::ffff:127.0.0.1"), 10264) == "http"  # IPv4-mapped is the same


def test_a_wildcard_bind_matches_every_local_address_and_nothing_else() -> None:
    own = OwnListeners()
    own.add("https", [("::", 10263, 0, 0)])  # dual-stack wildcard
    own.add("http", [("0.0.0.0", 10264)])
    assert own.which(ip("127.0.0.1"), 10263) == "https"
    assert own.which(ip("127.0.0.53"), 10264) == "http"  # all of 127/8 is this host's
    assert own.which(ip("::1"), 10264) == "http"
    # TEST-NET-3 is never assigned to this machine: not ours, even on our port.
    assert own.which(ip("203.0.113.7"), 10264) is None


def test_is_local_address() -> None:
    assert is_local_address(ip("127.0.0.1"))
    assert is_local_address(ip("::1"))
    assert not is_local_address(ip("203.0.113.7"))
    assert not is_local_address(ip("2001:db8::1"))


def test_via_entries_are_parsed_by_received_by() -> None:
    assert via_received_by(["1.1 proxy-a, HTTP/1.0 proxy-b (squid)", "1.1 c"]) == [
        "proxy-a",
        "proxy-b",
        "c",
    ]
    assert via_received_by(["", " , garbage"]) == []


def test_via_tokens_are_unique_per_process_and_one_token() -> None:
    a, b = via_token("cloud-1"), via_token("cloud-1")
    assert a != b and a.startswith("ravenproxy-cloud-1-")
    assert via_received_by([f"1.1 {a}"]) == [a]
