from __future__ import annotations

from ravenproxy.controller.dnsmap import (
    KEY,
    configmap,
    dns_map,
    hosts_text,
    needs_write,
    node_addresses,
    parse_hosts,
    tunnel_nodes_data,
)
from tests.unit.controller.builders import gateway, model, node


def cluster(exposed: bool = True):  # type: ignore[no-untyped-def]
    return model(
        gateway("gw-cloud", expose="PublicIP" if exposed else ""),
        node("edge-2", "gw-edge", ip="10.0.0.2"),
        node("edge-10", "gw-edge", ip="10.0.0.10"),
        node("cloud-1", "gw-cloud", ip=("10.0.0.1", "fd00::1")),
        node("solo", None, ip=None),
    )


def test_internal_ip_lines_sorted_tab_separated_without_trailing_newline() -> None:
    data = tunnel_nodes_data(cluster(exposed=False))
    # Sorted as strings (like Raven's sort.Strings), so 10.0.0.10 precedes 10.0.0.2; a node
    # without an address has no line; a dual-stack node has one line per address.
    assert data == {
        KEY: "10.0.0.1\tcloud-1\n10.0.0.10\tedge-10\n10.0.0.2\tedge-2\nfd00::1\tcloud-1"
    }


def test_every_node_maps_to_the_cluster_ip_when_l7_is_on() -> None:
    text = tunnel_nodes_data(cluster(), "10.96.0.20")[KEY]
    assert text == (
        "10.96.0.20\tcloud-1\n10.96.0.20\tedge-10\n10.96.0.20\tedge-2\n10.96.0.20\tsolo"
    )


def test_cluster_ip_is_ignored_when_no_gateway_is_exposed() -> None:
    assert node_addresses(cluster(exposed=False), "10.96.0.20")["edge-2"] == ("10.0.0.2",)


def test_empty_cluster_gives_empty_text() -> None:
    assert hosts_text({}) == ""
    assert tunnel_nodes_data(model()) == {KEY: ""}


def test_configmap_object() -> None:
    assert configmap(model(node("a", ip="10.0.0.1"))) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "edge-tunnel-nodes", "namespace": "kube-system"},
        "data": {"tunnel-nodes": "10.0.0.1\ta"},
    }


def test_rewrite_only_when_our_content_changes() -> None:
    desired = tunnel_nodes_data(cluster())
    assert needs_write(None, desired)  # ConfigMap missing
    assert needs_write({}, desired)  # key missing
    assert not needs_write(dict(desired), desired)
    assert not needs_write({**desired, "someone-else": "x"}, desired)
    assert needs_write({KEY: desired[KEY] + "\n"}, desired)  # hand edit is put back
    changed = tunnel_nodes_data(
        model(
            *cluster().gateways.values(), *cluster().nodes.values(), node("edge-3", ip="10.0.0.3")
        )
    )
    assert needs_write(desired, changed)


def test_parse_hosts_round_trip_and_tolerance() -> None:
    m = cluster(exposed=False)
    assert dns_map(m) == {
        "cloud-1": ["10.0.0.1", "fd00::1"],
        "edge-10": ["10.0.0.10"],
        "edge-2": ["10.0.0.2"],
    }
    text = "# comment\r\n\n10.0.0.1 A.example. b   # trailing\nnot-an-ip c\n10.0.0.1\ta.example\n"
    assert parse_hosts(text) == {"a.example": ["10.0.0.1"], "b": ["10.0.0.1"]}
