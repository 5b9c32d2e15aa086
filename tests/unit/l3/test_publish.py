from __future__ import annotations

import copy
from typing import Any

from ravenproxy.l3.publish import with_public_key

GATEWAY: dict[str, Any] = {
    "metadata": {"name": "gw-edge", "resourceVersion": "7"},
    "spec": {
        "endpoints": [
            {"nodeName": "edge-1", "type": "proxy"},
            {"nodeName": "edge-1", "type": "tunnel", "underNAT": True},
            {"nodeName": "edge-2", "type": "tunnel", "config": {"publicKey": "other"}},
        ]
    },
}


def test_the_key_goes_into_this_nodes_tunnel_endpoints_only() -> None:
    before = copy.deepcopy(GATEWAY)
    updated = with_public_key(GATEWAY, "edge-1", "KEY")
    assert GATEWAY == before  # never modified in place
    assert updated is not None
    endpoints = updated["spec"]["endpoints"]
    assert endpoints[0] == {"nodeName": "edge-1", "type": "proxy"}
    assert endpoints[1]["config"] == {"publicKey": "KEY"} and endpoints[1]["underNAT"] is True
    assert endpoints[2]["config"] == {"publicKey": "other"}
    assert updated["metadata"]["resourceVersion"] == "7"  # the replace is conditional on it


def test_nothing_to_write_when_published_or_not_a_tunnel_node() -> None:
    published = with_public_key(GATEWAY, "edge-1", "KEY")
    assert published is not None
    assert with_public_key(published, "edge-1", "KEY") is None
    assert with_public_key(GATEWAY, "edge-9", "KEY") is None
    assert with_public_key({"metadata": {"name": "x"}}, "edge-1", "KEY") is None
