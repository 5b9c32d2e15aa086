"""The agent's WireGuard key reaches its Gateway through the API (emulator), and the model the
remote gateways plan from then carries it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ravenproxy.kube.sources import model_source
from ravenproxy.l3 import wireguard
from ravenproxy.l3.publish import KeyPublisher, publish_public_key
from ravenproxy.l3.settings import L3Settings
from ravenproxy.model.store import ModelStore
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import kubeconfig, rest_client
from tests.integration.kube.test_controller import node_obj

EDGE_GW = {
    "metadata": {"name": "gw-edge"},
    "spec": {
        "endpoints": [
            {"nodeName": "edge-1", "type": "proxy", "underNAT": True},
            {"nodeName": "edge-1", "type": "tunnel", "underNAT": True},
        ]
    },
}


def published(apiserver: APIServer) -> list[str]:
    gw = apiserver.get("gateways", "gw-edge") or {}
    return [
        (e.get("config") or {}).get("publicKey", "")
        for e in gw["spec"]["endpoints"]
        if e["type"] == "tunnel"
    ]


async def test_publish_writes_once_and_keeps_the_rest(apiserver: APIServer) -> None:
    await apiserver.put("gateways", EDGE_GW)
    async with rest_client(apiserver, agent="agent-edge-1") as api:
        assert await publish_public_key(api, "gw-edge", "edge-1", "KEY") is True
        assert published(apiserver) == ["KEY"]
        gw = apiserver.get("gateways", "gw-edge")
        assert gw is not None and gw["spec"]["endpoints"][0]["type"] == "proxy"
        writes = len(apiserver.writes("gateways"))
        assert await publish_public_key(api, "gw-edge", "edge-1", "KEY") is False
        assert len(apiserver.writes("gateways")) == writes  # nothing to write: no write


async def test_the_agents_publisher_follows_the_model(apiserver: APIServer, tmp_path: Path) -> None:
    await apiserver.put("gateways", EDGE_GW)
    await apiserver.put("nodes", node_obj("edge-1", "10.2.0.1", "gw-edge"))
    settings = L3Settings(vpn_driver="wireguard", wireguard_key_dir=str(tmp_path / "wg"))
    key = wireguard.public_key(settings)
    store = ModelStore()
    config = str(kubeconfig(tmp_path / "kubeconfig", apiserver))
    async with model_source(store, kube=True, kubeconfig=config):
        async with rest_client(apiserver, agent="agent-edge-1") as api:
            task = asyncio.create_task(KeyPublisher(store, api, "edge-1", settings).run())
            try:
                for _ in range(100):
                    gw = store.model.gateways.get("gw-edge")
                    keys = [e.config.get("publicKey") for e in gw.endpoints] if gw else []
                    if key in keys:
                        break
                    await asyncio.sleep(0.05)
                assert published(apiserver) == [key]
                # The model the remote gateways plan from now has it.
                gw = store.model.gateways["gw-edge"]
                assert [e.config.get("publicKey") for e in gw.endpoints if e.type == "tunnel"] == [
                    key
                ]
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
