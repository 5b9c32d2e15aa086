"""A node's pod CIDRs (spec.podCIDRs and the Gateway status subnets, where confirmed Calico
blocks go), the pod-IP lookup the router uses, and the ``--allow-pods`` policy built on them."""

from __future__ import annotations

import ipaddress

import pytest

from ravenproxy.model import GATEWAY_LABEL, Gateway, Model, Node, NodeAddress
from ravenproxy.model.allowlist import gateway_allowlist
from ravenproxy.model.objects import NodeInfo

ip = ipaddress.ip_address
net = ipaddress.ip_network


def node(name: str, address: str, gateway: str | None, *cidrs: str) -> Node:
    return Node(
        name=name,
        labels={GATEWAY_LABEL: gateway} if gateway else {},
        addresses=(NodeAddress("InternalIP", address),),
        pod_cidrs=cidrs,
    )


def model() -> Model:
    """gw: a (podCIDRs 10.16.0.0/16, a Calico block 10.16.7.0/26 of b's inside it: the more
    specific wins) and b (status subnets only; one bad text); solo (IPv6 pods); other gateway
    ``gw2`` with c."""
    return Model.build(
        [
            node("a", "192.168.0.1", "gw", "10.16.0.0/16"),
            node("b", "192.168.0.2", "gw"),
            node("solo", "192.168.0.3", None, "fd00:16::/64"),
            node("c", "192.168.0.4", "gw2", "10.17.0.0/24", "not-a-cidr"),
        ],
        [
            Gateway(
                name="gw",
                status_nodes=(
                    NodeInfo("a", "192.168.0.1", ("10.16.0.0/16",)),
                    NodeInfo("b", "192.168.0.2", ("10.16.7.0/26", "bogus", "10.18.0.0/24")),
                ),
            )
        ],
    )


def test_pod_cidrs_merge_spec_and_status_without_duplicates() -> None:
    m = model()
    assert m.pod_cidrs_of("a") == (net("10.16.0.0/16"),)
    assert m.pod_cidrs_of("b") == (net("10.16.7.0/26"), net("10.18.0.0/24"))
    assert m.pod_cidrs_of("c") == (net("10.17.0.0/24"),)
    assert m.pod_cidrs_of("ghost") == ()


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.16.3.4", "a"),
        ("10.16.7.5", "b"),  # inside a's /16, but b's /26 is more specific
        ("10.16.7.64", "a"),  # just past b's block
        ("10.18.0.9", "b"),
        ("10.17.0.200", "c"),
        ("fd00:16::5", "solo"),
        ("::ffff:10.17.0.1", "c"),
        ("10.19.0.1", None),
        ("192.168.0.1", None),  # a node address is not a pod address
        ("a", None),
        ("", None),
    ],
)
def test_node_by_pod_ip(address: str, expected: str | None) -> None:
    found = model().node_by_pod_ip(address)
    assert (found.name if found else None) == expected


def test_allow_pods_admits_the_gateways_pods_on_any_port_only_when_asked() -> None:
    m = model()
    without = gateway_allowlist(m, "a")
    with_pods = gateway_allowlist(m, "a", pods=True)
    for address in ("10.16.3.4", "10.16.7.5", "10.18.0.9"):  # a's and its peer b's pods
        assert not without.permits(ip(address), 8080)
        assert with_pods.permits(ip(address), 8080)
        assert with_pods.permits(ip(address), 1)
    assert not with_pods.permits(ip("10.17.0.1"), 8080)  # another gateway's pods
    assert with_pods.permits(ip("192.168.0.2"), 10250)  # the nodes stay as before
    assert not with_pods.permits(ip("192.168.0.2"), 8080)


def test_allow_pods_never_admits_link_local_or_metadata() -> None:
    m = Model.build([node("x", "192.168.0.9", None, "169.254.0.0/16", "100.100.100.0/24")])
    policy = gateway_allowlist(m, "x", pods=True)
    assert not policy.permits(ip("169.254.169.254"), 80)
    assert not policy.permits(ip("100.100.100.200"), 80)
    assert policy.permits(ip("100.100.100.1"), 80)
