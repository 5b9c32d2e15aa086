from __future__ import annotations

from ravenproxy.kube.calico import confirmed_block_affinities


def affinity(node: str, cidr: str, state: str = "confirmed", deleted: str = "false") -> dict:  # type: ignore[type-arg]
    return {"spec": {"node": node, "cidr": cidr, "state": state, "deleted": deleted}}


def test_only_confirmed_live_affinities_count() -> None:
    objs = [
        affinity("edge-1", "192.168.10.0/26"),
        affinity("edge-1", "192.168.10.64/26"),
        affinity("edge-1", "192.168.10.0/26"),  # listed twice: once
        affinity("edge-1", "192.168.99.0/26", state="pending"),
        affinity("edge-2", "192.168.20.0/26", deleted="true"),
        affinity("edge-3", "fd00:10::/122"),
        {"spec": {"node": "edge-4"}},
        {},
    ]
    assert confirmed_block_affinities(objs) == {
        "edge-1": ["192.168.10.0/26", "192.168.10.64/26"],
        "edge-3": ["fd00:10::/122"],
    }
