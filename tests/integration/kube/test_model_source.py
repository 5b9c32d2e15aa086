"""Server and agent on the Kubernetes model (`--kube-model`): real processes through the CLI
read Nodes and Gateways from the API emulator, route through the tunnel, and follow changes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ravenproxy.client import ConnectRefused
from ravenproxy.errors import InventoryError
from ravenproxy.kube.sources import model_source
from ravenproxy.model.store import ModelStore
from tests.integration.cluster import Cluster, free_port
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import kubeconfig
from tests.integration.kube.test_controller import gateway_obj, node_obj
from tests.integration.targets import echo, tcp_server

pytestmark = pytest.mark.timeout(120)


async def test_model_source_lists_then_follows_the_api(
    apiserver: APIServer, tmp_path: Path
) -> None:
    await apiserver.put("gateways", gateway_obj("gw-edge", ["edge-1"]))
    await apiserver.put("nodes", node_obj("edge-1", "127.0.0.1", "gw-edge"))
    store = ModelStore()
    config = str(kubeconfig(tmp_path / "kubeconfig", apiserver))
    async with model_source(store, kube=True, kubeconfig=config, pods=True):
        # The first complete model is there when the block starts.
        assert set(store.model.nodes) == {"edge-1"}
        assert set(store.model.gateways) == {"gw-edge"}
        await apiserver.put("nodes", node_obj("edge-2", "127.0.0.2", "gw-edge"))
        for _ in range(100):
            if "edge-2" in store.model.nodes:
                break
            await asyncio.sleep(0.05)
        assert "edge-2" in {n.name for n in store.model.peers_of("edge-1")}


async def test_no_model_source_is_an_error() -> None:
    with pytest.raises(InventoryError, match="--inventory or --kube-model"):
        async with model_source(ModelStore()):
            pass


async def test_server_and_agent_route_from_the_kubernetes_model(
    apiserver: APIServer, tmp_path: Path
) -> None:
    await apiserver.put("gateways", gateway_obj("gw-edge", ["edge-1"]))
    await apiserver.put("nodes", node_obj("edge-1", "127.0.0.1", "gw-edge"))
    config = str(kubeconfig(tmp_path / "kubeconfig", apiserver))
    cluster = Cluster(tmp_path)
    try:
        async with tcp_server(echo) as port, tcp_server(echo, host="127.0.0.2") as port2:
            ports = {k: free_port() for k in ("tunnel", "http", "https", "metrics", "health")}
            cluster.start_server(ports=ports, extra_source=("--kube-model", "--kubeconfig", config))
            cluster.start_agent(
                "edge-1",
                f"127.0.0.1:{port}",
                f"127.0.0.2:{port2}",
                extra=("--kube-model", "--kubeconfig", config),
            )
            await cluster.wait_routable(f"edge-1:{port}")
            reader, writer = await cluster.connect(f"edge-1:{port}")
            writer.write(b"from the API")
            assert await reader.readexactly(12) == b"from the API"
            writer.close()

            # edge-2 is not in the cluster yet: unknown. Once created, it is served by edge-1's
            # agent (same gateway), without restarting anything.
            with pytest.raises(ConnectRefused) as info:
                await cluster.connect(f"edge-2:{port2}")
            assert info.value.status == 404
            await apiserver.put("nodes", node_obj("edge-2", "127.0.0.2", "gw-edge"))
            await cluster.wait_routable(f"edge-2:{port2}")
    finally:
        cluster.stop_all()
