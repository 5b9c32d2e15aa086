"""The model source against the list/watch emulator, on both clients it takes: our REST client
(the agent's and the server's) and the real kubernetes_asyncio client (the controller's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import dns.asyncquery
import dns.message
import dns.rcode
import pytest
from kubernetes_asyncio import client as k8s_client

from ravenproxy.controller.dns import DNSServer
from ravenproxy.controller.dnsfeed import serve_configmap_dns
from ravenproxy.kube.model import KubeSource
from ravenproxy.kube.reflector import WatchSettings
from ravenproxy.kube.rest import RestClient
from ravenproxy.model.store import ModelStore
from tests.helpers import eventually
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import rest_client

FAST = WatchSettings(watch_timeout=1, resync=3600, backoff_initial=0.05, backoff_max=0.2)


def node_obj(name: str, ip: str, gateway: str | None = "gw-edge") -> dict[str, Any]:
    labels = {"raven.openyurt.io/gateway": gateway} if gateway else {}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


GATEWAY = {
    "metadata": {"name": "gw-edge"},
    "spec": {"endpoints": [{"nodeName": "edge-1", "type": "proxy"}]},
}


Client = RestClient | k8s_client.ApiClient


@pytest.fixture
async def k8s_api(apiserver: APIServer) -> AsyncIterator[k8s_client.ApiClient]:
    cfg = k8s_client.Configuration(host=apiserver.url)
    async with k8s_client.ApiClient(cfg) as client:
        yield client


@pytest.fixture(params=["rest", "kubernetes_asyncio"])
async def api(
    request: pytest.FixtureRequest, apiserver: APIServer, k8s_api: Client
) -> AsyncIterator[Client]:
    if request.param != "rest":
        yield k8s_api
        return
    async with rest_client(apiserver) as client:
        yield client


async def running(source: KubeSource) -> asyncio.Task[None]:
    task = asyncio.create_task(source.run())
    await asyncio.wait_for(source.synced.wait(), 5)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_list_then_watch_feeds_the_model(apiserver: APIServer, api: Client) -> None:
    await apiserver.put("nodes", node_obj("edge-1", "10.0.0.1"))
    await apiserver.put("gateways", GATEWAY)
    store = ModelStore()
    task = await running(KubeSource(api, store, FAST))
    try:
        assert sorted(store.model.nodes) == ["edge-1"]
        assert store.model.gateways["gw-edge"].endpoints[0].node_name == "edge-1"
        listed_rv = apiserver.lists("nodes")[0]
        await eventually(lambda: bool(apiserver.watches("nodes")))
        # The watch starts from the list's resourceVersion, so nothing between is lost.
        assert apiserver.watches("nodes")[0]["resourceVersion"] == str(apiserver.rv)
        assert listed_rv.get("watch") is None

        await apiserver.put("nodes", node_obj("edge-2", "10.0.0.2"))
        await eventually(lambda: "edge-2" in store.model.nodes)
        await apiserver.put("nodes", node_obj("edge-2", "10.0.0.22"))
        await eventually(lambda: store.model.nodes["edge-2"].internal_ip == "10.0.0.22")
        await apiserver.delete("nodes", "edge-1")
        await eventually(lambda: "edge-1" not in store.model.nodes)
        assert store.model.members("gw-edge")[0].name == "edge-2"
    finally:
        await stop(task)


async def test_a_timed_out_watch_resumes_from_the_last_version_without_relisting(
    apiserver: APIServer, api: Client
) -> None:
    await apiserver.put("nodes", node_obj("edge-1", "10.0.0.1"))
    store = ModelStore()
    source = KubeSource(api, store, FAST)
    task = await running(source)
    try:
        await apiserver.put("nodes", node_obj("edge-2", "10.0.0.2"))
        seen = apiserver.rv
        await eventually(lambda: len(apiserver.watches("nodes")) >= 3, within=6)
        assert len(apiserver.lists("nodes")) == 1
        assert apiserver.watches("nodes")[-1]["resourceVersion"] == str(seen)
        assert "edge-2" in store.model.nodes
    finally:
        await stop(task)


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
async def test_410_gone_relists(apiserver: APIServer, api: Client, as_http: bool) -> None:
    apiserver.gone_as_http = as_http
    await apiserver.put("nodes", node_obj("edge-1", "10.0.0.1"))
    store = ModelStore()
    source = KubeSource(api, store, FAST)
    task = await running(source)
    try:
        await eventually(lambda: bool(apiserver.watches("nodes")))
        # The connection drops; while the client is away the history it would resume from is
        # compacted, so its next watch must fail with 410 and it must relist.
        await apiserver.cut_watches()
        await apiserver.delete("nodes", "edge-1")
        await apiserver.put("nodes", node_obj("edge-3", "10.0.0.3"))
        await apiserver.put("nodes", node_obj("edge-4", "10.0.0.4"))
        apiserver.compact()
        await eventually(lambda: len(apiserver.watches("nodes")) >= 2)
        assert len(apiserver.lists("nodes")) == 1
        apiserver.release_watches()
        await eventually(lambda: len(apiserver.lists("nodes")) >= 2, within=6)
        await eventually(lambda: sorted(store.model.nodes) == ["edge-3", "edge-4"])
    finally:
        await stop(task)


async def test_periodic_resync_relists(apiserver: APIServer, api: Client) -> None:
    settings = WatchSettings(watch_timeout=1, resync=1.0, backoff_initial=0.05)
    store = ModelStore()
    task = await running(KubeSource(api, store, settings))
    try:
        await eventually(lambda: len(apiserver.lists("nodes")) >= 3, within=6)
    finally:
        await stop(task)


async def test_an_invalid_object_is_skipped_not_fatal(apiserver: APIServer, api: Client) -> None:
    await apiserver.put("gateways", GATEWAY)
    await apiserver.put(
        "gateways", {"metadata": {"name": "bad"}, "spec": {"exposeType": "Nonsense"}}
    )
    store = ModelStore()
    task = await running(KubeSource(api, store, FAST))
    try:
        assert sorted(store.model.gateways) == ["gw-edge"]
    finally:
        await stop(task)


async def test_dns_answers_from_the_published_configmap(
    apiserver: APIServer, k8s_api: k8s_client.ApiClient
) -> None:
    started: asyncio.Future[DNSServer] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve_configmap_dns(k8s_api, ("127.0.0.1", 0), settings=FAST, started=started.set_result)
    )
    try:
        port = (await asyncio.wait_for(started, 5)).port

        async def answer(name: str) -> dns.message.Message:
            q = dns.message.make_query(name, "A")
            return await dns.asyncquery.udp(q, "127.0.0.1", port=port, timeout=2)

        assert (await answer("edge-1")).rcode() == dns.rcode.NXDOMAIN
        cm = {
            "metadata": {"name": "edge-tunnel-nodes", "namespace": "kube-system"},
            "data": {"tunnel-nodes": "10.96.0.20\tedge-1\n10.96.0.20\tedge-2"},
        }
        await apiserver.put("configmaps", cm)
        # A ConfigMap of the same name elsewhere is not ours.
        await apiserver.put(
            "configmaps",
            {
                "metadata": {"name": "edge-tunnel-nodes", "namespace": "default"},
                "data": {"tunnel-nodes": "10.9.9.9\tedge-9"},
            },
        )
        start = time.monotonic()
        while (await answer("edge-2")).rcode() != dns.rcode.NOERROR:
            assert time.monotonic() - start < 1.0, "ConfigMap change not answered within 1 s"
            await asyncio.sleep(0.02)
        reply = await answer("edge-1")
        assert [r.to_text() for rrset in reply.answer for r in rrset] == ["10.96.0.20"]
        assert (await answer("edge-9")).rcode() == dns.rcode.NXDOMAIN
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
