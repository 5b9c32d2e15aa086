"""The agent-liveness Lease names and times both the server and the controller use."""

from __future__ import annotations

from ravenproxy.kube.leases import ANNOTATION_NODE, lease_name, lease_node, micro_time, parse_time


def test_lease_names_and_times() -> None:
    assert lease_name("edge-1") == "ravenproxy-agent-edge-1"
    long = "n" * 250
    name = lease_name(long)
    assert len(name) <= 253 and name.startswith("ravenproxy-agent-nnn")
    assert name != lease_name("n" * 251)
    assert lease_node({"metadata": {"name": name, "annotations": {ANNOTATION_NODE: long}}}) == long
    assert lease_node({"metadata": {"name": "ravenproxy-agent-edge-7"}}) == "edge-7"
    assert micro_time(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"
    assert parse_time("2023-11-14T22:13:20.250000Z") == 1_700_000_000.25
    assert parse_time("garbage") is None and parse_time(None) is None
