from __future__ import annotations

import dataclasses

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.l3.settings import L3Settings


def test_defaults_are_valid_and_frozen():
    s = L3Settings()
    assert s.vpn_driver == "strongswan"
    assert s.cni_interface == "flannel.1"
    assert s.vxlan_mtu == 1450
    assert s.reconcile_period == 60.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.fwmark = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vpn_driver", "libreswan"),
        ("cni_interface", "../../../../etc"),
        ("cni_interface", "a-name-that-is-too-long"),
        ("cni_interface", ""),
        ("wireguard_interface", "wg 0"),
        ("service_cidr", "10.96.0.1/12"),
        ("service_cidr", "nope"),
        ("skip_nat_cidrs", ("10.16.0.0/12", "x")),
        ("skip_nat_cidrs", "10.16.0.0/12"),
        ("underlay_mtu", 500),
        ("vxlan_vni", 0),
        ("vxlan_vni", 2**24),
        ("vxlan_port", 0),
        ("vpn_port", 70000),
        ("route_table", 254),
        ("route_table", 0),
        ("fwmark", 0),
        ("rule_priority", 32766),
        ("reconcile_period", 0),
    ],
)
def test_invalid_values_name_their_field(field: str, value: object):
    with pytest.raises(ConfigError) as exc:
        L3Settings(**{field: value})  # type: ignore[arg-type]
    assert exc.value.field == field
    assert field in str(exc.value)


def test_valid_non_defaults():
    s = L3Settings(
        vpn_driver="wireguard",
        cni_interface="cni0",
        service_cidr="fd00:96::/108",
        skip_nat_cidrs=("10.16.0.0/12",),
        underlay_mtu=9000,
    )
    assert s.vxlan_mtu == 8950
