from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.l3.cidrs import collapse, contains, family_of, of_family, parse_network, subtract
from ravenproxy.l3.errors import CidrError


def test_adjacent_siblings_merge():
    assert collapse(["10.16.10.0/24", "10.16.11.0/24"]) == ("10.16.10.0/23",)


def test_contained_network_disappears():
    assert collapse(["10.16.0.0/16", "10.16.3.0/24"]) == ("10.16.0.0/16",)


def test_adjacent_but_not_siblings_do_not_widen():
    # 10.16.1.0/24 + 10.16.2.0/24 are adjacent but their /23 supernets differ: joining them
    # would need 10.16.0.0/22, which covers two foreign /24s.
    assert collapse(["10.16.1.0/24", "10.16.2.0/24"]) == ("10.16.1.0/24", "10.16.2.0/24")


def test_families_are_kept_apart_v4_first():
    got = collapse(["fd00:1::/64", "10.0.1.0/24", "fd00:0::/64", "10.0.0.0/24"])
    assert got == ("10.0.0.0/23", "fd00::/64", "fd00:1::/64")
    assert of_family(got, 6) == ("fd00::/64", "fd00:1::/64")
    assert family_of("fd00::/64") == 6


def test_host_bits_are_masked_and_bare_address_is_host():
    assert collapse(["10.16.0.5/24", "10.0.0.1"]) == ("10.0.0.1/32", "10.16.0.0/24")


def test_strict_parse_refuses_host_bits():
    with pytest.raises(CidrError):
        parse_network("10.16.0.5/24", strict=True)


@pytest.mark.parametrize("bad", ["", "10.16.0.0/33", "banana", "10.16.0.0/24/1"])
def test_garbage_is_a_typed_error(bad: str):
    with pytest.raises(CidrError):
        collapse([bad])


def test_subtract_cuts_holes_and_contains():
    assert subtract(["10.16.0.0/22"], ["10.16.1.0/24"]) == ("10.16.0.0/24", "10.16.2.0/23")
    assert subtract(["10.16.0.0/24"], ["10.0.0.0/8"]) == ()
    assert contains(["10.16.0.0/24", "10.16.1.0/24"], "10.16.0.0/23")
    assert not contains(["10.16.0.0/24"], "10.16.0.0/23")


# --- properties --------------------------------------------------------------------------

# Small address spaces so that overlaps, adjacency and containment are frequent.
v4_nets = st.builds(
    lambda addr, plen: str(ipaddress.ip_network(f"10.16.{addr >> 8}.{addr & 255}/{plen}", False)),
    st.integers(0, 2**16 - 1),
    st.integers(16, 32),
)
v6_nets = st.builds(
    lambda addr, plen: str(ipaddress.ip_network(f"fd00::{addr:x}/{plen}", False)),
    st.integers(0, 2**16 - 1),
    st.integers(112, 128),
)
mixed = st.lists(st.one_of(v4_nets, v6_nets), max_size=30)


def intervals(cidrs: tuple[str, ...] | list[str]) -> list[tuple[int, int, int]]:
    """Union of the networks as sorted, disjoint, non-touching (family, first, last) runs."""
    spans = sorted(
        (n.version, int(n.network_address), int(n.broadcast_address))
        for n in (ipaddress.ip_network(c) for c in cidrs)
    )
    out: list[tuple[int, int, int]] = []
    for fam, lo, hi in spans:
        if out and out[-1][0] == fam and lo <= out[-1][2] + 1:
            out[-1] = (fam, out[-1][1], max(out[-1][2], hi))
        else:
            out.append((fam, lo, hi))
    return out


@given(mixed)
def test_merged_set_covers_exactly_the_input_addresses(cidrs: list[str]):
    assert intervals(collapse(cidrs)) == intervals(cidrs)


@given(mixed)
def test_merged_set_is_minimal_and_disjoint(cidrs: list[str]):
    nets = [ipaddress.ip_network(c) for c in collapse(cidrs)]
    for i, a in enumerate(nets):
        for b in nets[i + 1 :]:
            assert not (a.version == b.version and a.overlaps(b))  # type: ignore[arg-type]
            if a.version == b.version and a.prefixlen == b.prefixlen and a.prefixlen > 0:
                # Two siblings would have merged into their common supernet.
                assert a.supernet() != b.supernet()


@given(mixed)
def test_merge_is_idempotent_and_order_free(cidrs: list[str]):
    once = collapse(cidrs)
    assert collapse(once) == once
    assert collapse(reversed(cidrs)) == once


@given(mixed, mixed)
def test_subtract_removes_exactly(cidrs: list[str], remove: list[str]):
    left = subtract(cidrs, remove)
    # Nothing removed survives, and what is left plus what was removed is the whole.
    for x in left:
        for r in collapse(remove):
            a, b = ipaddress.ip_network(x), ipaddress.ip_network(r)
            assert not (a.version == b.version and a.overlaps(b))  # type: ignore[arg-type]
    assert intervals(collapse([*left, *remove])) == intervals(collapse([*cidrs, *remove]))
