"""The lab's plan is pure data from its NAME: two labs share no host-wide name, the inventory
is a model the real loader reads, and a bad NAME is refused naming --name."""

from __future__ import annotations

from pathlib import Path

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.lab import plan as p
from ravenproxy.model.inventory import load_inventory


def test_two_labs_share_no_host_wide_name():
    a, b = p.LabPlan("lab"), p.LabPlan("lab2")
    assert set(a.namespaces.values()).isdisjoint(b.namespaces.values())
    wg_a = {a.wireguard_interface(n) for n in ("cloud-gw", "edge-gw")}
    wg_b = {b.wireguard_interface(n) for n in ("cloud-gw", "edge-gw")}
    assert wg_a.isdisjoint(wg_b) and len(wg_a) == 2
    assert all(len(name) <= 15 for name in wg_a | wg_b)  # IFNAMSIZ
    assert a.namespace("cloud-gw") == "lab-cloud-gw"


@pytest.mark.parametrize("bad", ["", "Lab", "1lab", "lab-x", "a" * 13, "lab/../x"])
def test_a_bad_name_is_refused_naming_the_flag(bad: str):
    with pytest.raises(ConfigError) as info:
        p.check_name(bad)
    assert info.value.field == "--name"


def test_the_inventory_is_the_planned_model(tmp_path: Path):
    path = tmp_path / "inventory.yaml"
    path.write_text(p.inventory({"gw-cloud": "Y2xvdWQ=", "gw-edge": "ZWRnZQ=="}))
    model = load_inventory(str(path))
    assert {n: model.nodes[n].internal_ips for n in model.nodes} == {
        n.name: (n.ip,) for n in p.NODES
    }
    assert {n.name: n.gateway for n in model.nodes.values()} == {n.name: n.gateway for n in p.NODES}
    for pod in p.PODS:
        found = model.pod("default", pod.name)
        assert found is not None and (found.node_name, found.pod_ip) == (pod.node, pod.ip)
    assert model.gateways["gw-edge"].endpoints[0].under_nat


def test_every_address_lives_in_a_planned_host_and_pods_sit_in_their_node_cidr():
    import ipaddress

    for a in p.ADDRESSES:
        assert a.host in p.HOSTS
    for pod in p.PODS:
        cidr = ipaddress.ip_network(p.node(pod.node).pod_cidr)
        assert ipaddress.ip_address(pod.ip) in cidr
    assert p.LabPlan("x").addresses("edge-node") == ["192.168.1.11/24", "10.16.11.1/24"]
