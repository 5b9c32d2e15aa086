"""The controller reconciling into the API emulator through the real kubernetes_asyncio client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s_client

from ravenproxy.controller.election import Health
from ravenproxy.controller.reconciler import Reconciler
from ravenproxy.controller.runtime import ControllerSettings, run_controller_with
from ravenproxy.controller.services import INTERNAL_SERVICE
from ravenproxy.controller.writer import KubeWriter, NotLeader
from ravenproxy.kube.model import KubeSource
from ravenproxy.kube.reflector import WatchSettings
from ravenproxy.model.store import ModelStore
from tests.helpers import eventually
from tests.integration.kube.apiserver import APIServer

FAST = WatchSettings(watch_timeout=1, resync=3600, backoff_initial=0.05, backoff_max=0.2)
UP = Health.ready_only


def node_obj(name: str, ip: str, gateway: str, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"raven.openyurt.io/gateway": gateway}},
        "spec": {"podCIDRs": [f"10.244.{ip.rsplit('.', 1)[1]}.0/24"]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def gateway_obj(name: str, nodes: list[str], expose: str = "", replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "exposeType": expose,
            "proxyConfig": {"Replicas": replicas, "proxyHTTPPort": "10255,9100"},
            "endpoints": [{"nodeName": n, "type": "proxy", "port": 10262} for n in nodes],
        },
    }


async def cluster(api: APIServer) -> None:
    await api.put("gateways", gateway_obj("gw-cloud", ["cloud-1", "cloud-2"], "LoadBalancer"))
    await api.put("gateways", gateway_obj("gw-edge", ["edge-1"]))
    await api.put("nodes", node_obj("cloud-1", "10.1.0.1", "gw-cloud"))
    await api.put("nodes", node_obj("cloud-2", "10.1.0.2", "gw-cloud"))
    await api.put("nodes", node_obj("edge-1", "10.2.0.1", "gw-edge"))


def api_client(server: APIServer, agent: str = "test") -> k8s_client.ApiClient:
    client = k8s_client.ApiClient(k8s_client.Configuration(host=server.url))
    client.user_agent = agent
    return client


@pytest.fixture
async def api(apiserver: APIServer) -> AsyncIterator[k8s_client.ApiClient]:
    async with api_client(apiserver) as client:
        yield client


@pytest.fixture
async def store(api: k8s_client.ApiClient) -> AsyncIterator[ModelStore]:
    """A model fed by the real list/watch source."""
    store = ModelStore()
    source = KubeSource(api, store, FAST)
    task = asyncio.create_task(source.run())
    try:
        yield store
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def settled(store: ModelStore, apiserver: APIServer) -> None:
    """Wait until the watch has delivered everything written so far."""
    await eventually(
        lambda: (
            all(
                store.model.gateways.get(g["metadata"]["name"]) is not None
                and store.model.gateways[g["metadata"]["name"]].resource_version
                == g["metadata"]["resourceVersion"]
                for g in apiserver.items("gateways")
            )
            and set(store.model.nodes) == {n["metadata"]["name"] for n in apiserver.items("nodes")}
            and all(
                store.model.nodes[n["metadata"]["name"]].resource_version
                == n["metadata"]["resourceVersion"]
                for n in apiserver.items("nodes")
            )
        )
    )


def owned(apiserver: APIServer, resource: str) -> list[str]:
    return sorted(
        o["metadata"]["name"]
        for o in apiserver.items(resource)
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "ravenproxy"
    )


async def test_reconcile_writes_everything_once(
    apiserver: APIServer, api: k8s_client.ApiClient, store: ModelStore
) -> None:
    await apiserver.put(
        "configmaps",
        {
            "metadata": {"name": "edge-tunnel-nodes", "namespace": "kube-system"},
            "data": {"other-key": "kept"},
        },
    )
    await apiserver.put(
        "services",
        {
            "metadata": {"name": "kube-dns", "namespace": "kube-system"},
            "spec": {"ports": [{"port": 53}]},
        },
    )
    await cluster(apiserver)
    await settled(store, apiserver)
    reconciler = Reconciler(KubeWriter(api, lambda: True), store, UP)
    report = await reconciler.reconcile()
    assert sorted(report.statuses) == ["gw-cloud", "gw-edge"]
    assert report.events == 2

    cloud = apiserver.get("gateways", "gw-cloud")
    assert cloud is not None
    assert cloud["status"]["activeEndpoints"] == [
        {"nodeName": "cloud-1", "type": "proxy", "port": 10262}
    ]
    assert [n["nodeName"] for n in cloud["status"]["nodes"]] == ["cloud-1", "cloud-2"]
    assert cloud["status"]["nodes"][0]["subnets"] == ["10.244.1.0/24"]

    svc = apiserver.get("services", INTERNAL_SERVICE, "kube-system")
    assert svc is not None
    # proxyHTTPSPort unset: the kubelet port is served by default.
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http-9100", "https-10250", "http-10255"]
    eps = apiserver.get("endpoints", INTERNAL_SERVICE, "kube-system")
    assert eps is not None
    assert eps["subsets"][0]["addresses"] == [{"ip": "10.1.0.1", "nodeName": "cloud-1"}]
    assert owned(apiserver, "services") == [INTERNAL_SERVICE, "x-raven-proxy-svc-gw-cloud-cloud-1"]
    lb = apiserver.get("services", "x-raven-proxy-svc-gw-cloud-cloud-1", "kube-system")
    assert lb is not None and lb["spec"]["externalTrafficPolicy"] == "Local"

    # The ClusterIP the API just allocated is in the map at once; the foreign key survives.
    cm = apiserver.get("configmaps", "edge-tunnel-nodes", "kube-system")
    assert cm is not None
    ip = svc["spec"]["clusterIP"]
    assert cm["data"] == {
        "other-key": "kept",
        "tunnel-nodes": f"{ip}\tcloud-1\n{ip}\tcloud-2\n{ip}\tedge-1",
    }
    events = apiserver.items("events")
    assert sorted((e["involvedObject"]["name"], e["reason"]) for e in events) == [
        ("gw-cloud", "ActiveEndpointElected"),
        ("gw-edge", "ActiveEndpointElected"),
    ]
    assert apiserver.get("services", "kube-dns", "kube-system") is not None

    await settled(store, apiserver)
    writes = len(apiserver.writes())
    again = await reconciler.reconcile()
    assert not again.wrote, again
    assert len(apiserver.writes()) == writes


async def test_failover_moves_status_and_public_service_without_orphans(
    apiserver: APIServer, api: k8s_client.ApiClient, store: ModelStore
) -> None:
    await cluster(apiserver)
    await settled(store, apiserver)
    reconciler = Reconciler(KubeWriter(api, lambda: True), store, UP)
    await reconciler.reconcile()
    await apiserver.put("nodes", node_obj("cloud-1", "10.1.0.1", "gw-cloud", ready=False))
    await settled(store, apiserver)
    report = await reconciler.reconcile()
    assert report.statuses == ["gw-cloud"]
    cloud = apiserver.get("gateways", "gw-cloud")
    assert cloud is not None
    assert [e["nodeName"] for e in cloud["status"]["activeEndpoints"]] == ["cloud-2"]
    assert owned(apiserver, "services") == [INTERNAL_SERVICE, "x-raven-proxy-svc-gw-cloud-cloud-2"]
    assert owned(apiserver, "endpoints") == [INTERNAL_SERVICE, "x-raven-proxy-svc-gw-cloud-cloud-2"]
    eps = apiserver.get("endpoints", INTERNAL_SERVICE, "kube-system")
    assert eps is not None
    assert eps["subsets"][0]["addresses"] == [{"ip": "10.1.0.2", "nodeName": "cloud-2"}]
    reasons = sorted(e["reason"] for e in apiserver.items("events"))
    assert reasons.count("NodeNotReady") == 1 and reasons.count("ActiveEndpointFailover") == 1

    # Replicas up: both nodes, two public Services; then back to 1.
    await apiserver.put("nodes", node_obj("cloud-1", "10.1.0.1", "gw-cloud", ready=True))
    await apiserver.put(
        "gateways",
        {
            **gateway_obj("gw-cloud", ["cloud-1", "cloud-2"], "LoadBalancer", replicas=2),
            "status": cloud["status"],
        },
    )
    await settled(store, apiserver)
    await reconciler.reconcile()
    assert owned(apiserver, "services") == [
        INTERNAL_SERVICE,
        "x-raven-proxy-svc-gw-cloud-cloud-1",
        "x-raven-proxy-svc-gw-cloud-cloud-2",
    ]
    cloud = apiserver.get("gateways", "gw-cloud")
    assert cloud is not None
    await apiserver.put(
        "gateways",
        {
            **gateway_obj("gw-cloud", ["cloud-1", "cloud-2"], "LoadBalancer", replicas=1),
            "status": cloud["status"],
        },
    )
    await settled(store, apiserver)
    await reconciler.reconcile()
    assert owned(apiserver, "services") == [INTERNAL_SERVICE, "x-raven-proxy-svc-gw-cloud-cloud-2"]
    assert owned(apiserver, "endpoints") == [INTERNAL_SERVICE, "x-raven-proxy-svc-gw-cloud-cloud-2"]


async def test_load_balancer_ingress_becomes_the_public_ip(
    apiserver: APIServer, api: k8s_client.ApiClient, store: ModelStore
) -> None:
    await cluster(apiserver)
    await settled(store, apiserver)
    reconciler = Reconciler(KubeWriter(api, lambda: True), store, UP)
    await reconciler.reconcile()
    name = "x-raven-proxy-svc-gw-cloud-cloud-1"
    svc = apiserver.get("services", name, "kube-system")
    assert svc is not None
    # The cloud provider fills in the ingress.
    await apiserver.put(
        "services", {**svc, "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.5"}]}}}
    )
    await settled(store, apiserver)
    await reconciler.reconcile()
    cloud = apiserver.get("gateways", "gw-cloud")
    assert cloud is not None
    assert cloud["status"]["activeEndpoints"][0]["publicIP"] == "203.0.113.5"
    # An annotation on the node outranks the ingress, and a change is picked up.
    node = node_obj("cloud-1", "10.1.0.1", "gw-cloud")
    node["metadata"]["annotations"] = {"raven.openyurt.io/public-ip": "198.51.100.8"}
    await apiserver.put("nodes", node)
    await settled(store, apiserver)
    await reconciler.reconcile()
    cloud = apiserver.get("gateways", "gw-cloud")
    assert cloud is not None
    assert cloud["status"]["activeEndpoints"][0]["publicIP"] == "198.51.100.8"


async def test_events_are_emitted_once_even_before_the_watch_catches_up(
    apiserver: APIServer, api: k8s_client.ApiClient
) -> None:
    await cluster(apiserver)
    frozen = ModelStore()  # never updated after this: the watch "has not caught up"
    source = KubeSource(api, frozen, FAST)
    await source.nodes.list()
    await source.gateways.list()
    from ravenproxy.kube.model import build_model

    frozen.update(build_model(source.nodes.objects, source.gateways.objects))
    reconciler = Reconciler(KubeWriter(api, lambda: True), frozen, UP)
    first = await reconciler.reconcile()
    assert first.events == 2
    second = await reconciler.reconcile()
    assert not second.wrote, second
    assert len(apiserver.items("events")) == 2


async def test_a_follower_cannot_write(api: k8s_client.ApiClient) -> None:
    writer = KubeWriter(api, lambda: False)
    with pytest.raises(NotLeader):
        await writer.patch_status("gw", {})
    assert await writer.list_owned() == []  # reads are allowed


async def test_two_replicas_one_writer_and_leadership_failover(apiserver: APIServer) -> None:
    await cluster(apiserver)
    settings = {
        name: ControllerSettings(
            interval=0.3,
            lease_duration=3,
            renew_deadline=2.5,
            retry_period=1,
            identity=name,
            watch=FAST,
        )
        for name in ("replica-a", "replica-b")
    }
    clients = {name: api_client(apiserver, name) for name in settings}
    tasks = {
        name: asyncio.create_task(run_controller_with(clients[name], settings[name]))
        for name in settings
    }

    def non_lease_writers() -> set[str]:
        return {r.user_agent for r in apiserver.writes() if "/leases" not in r.path}

    try:
        await eventually(
            lambda: apiserver.get("services", INTERNAL_SERVICE, "kube-system") is not None
        )
        await asyncio.sleep(2.0)  # several reconcile rounds of both replicas
        writers = non_lease_writers()
        assert len(writers) == 1, writers
        (leader,) = writers
        lease = apiserver.get("leases", "ravenproxy-controller", "kube-system")
        assert lease is not None and lease["spec"]["holderIdentity"] == leader
        follower = next(n for n in settings if n != leader)

        # The leader dies without releasing the Lease; the follower takes over after it expires
        # and reconciles the change the dead leader never saw.
        tasks[leader].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[leader]
        await apiserver.put("nodes", node_obj("cloud-1", "10.1.0.1", "gw-cloud", ready=False))
        await eventually(
            lambda: (
                [
                    e["nodeName"]
                    for e in (apiserver.get("gateways", "gw-cloud") or {})
                    .get("status", {})
                    .get("activeEndpoints", [])
                ]
                == ["cloud-2"]
            ),
            within=10,
        )
        assert follower in non_lease_writers()
        lease = apiserver.get("leases", "ravenproxy-controller", "kube-system")
        assert lease is not None and lease["spec"]["holderIdentity"] == follower
        # Status is written before Services within a round: wait for the round to finish.
        await eventually(
            lambda: (
                owned(apiserver, "services")
                == [INTERNAL_SERVICE, "x-raven-proxy-svc-gw-cloud-cloud-2"]
            )
        )
        assert non_lease_writers() == {leader, follower}
    finally:
        for task in tasks.values():
            task.cancel()
        for task in tasks.values():
            with pytest.raises(asyncio.CancelledError):
                await task
        for client in clients.values():
            await client.close()


async def test_calico_block_affinities_become_the_status_subnets(
    apiserver: APIServer, api: k8s_client.ApiClient
) -> None:
    from tests.integration.kube.apiserver import Collection

    apiserver.collections["blockaffinities"] = Collection(
        "BlockAffinity", "crd.projectcalico.org/v1", False
    )
    await cluster(apiserver)
    for name, node, cidr, state in (
        ("a", "edge-1", "192.168.7.0/26", "confirmed"),
        ("b", "edge-1", "192.168.8.0/26", "pending"),
    ):
        await apiserver.put(
            "blockaffinities",
            {"metadata": {"name": name}, "spec": {"node": node, "cidr": cidr, "state": state}},
        )
    store = ModelStore()
    source = KubeSource(api, store, FAST)
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(source.synced.wait(), 5)
        await eventually(lambda: source.block_affinities() is not None)
        reconciler = Reconciler(
            KubeWriter(api, lambda: True), store, UP, block_affinities=source.block_affinities
        )
        await reconciler.reconcile()
        edge = apiserver.get("gateways", "gw-edge")
        assert edge is not None
        assert edge["status"]["nodes"] == [
            {"nodeName": "edge-1", "privateIP": "10.2.0.1", "subnets": ["192.168.7.0/26"]}
        ]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_without_calico_the_pod_cidrs_are_the_subnets(
    apiserver: APIServer, api: k8s_client.ApiClient
) -> None:
    store = ModelStore()
    source = KubeSource(api, store, FAST)
    task = asyncio.create_task(source.run())
    try:
        await asyncio.wait_for(source.synced.wait(), 5)
        await eventually(lambda: source.blocks is not None and source.blocks.absent)
        assert source.block_affinities() is None
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_dry_run_against_the_cluster_writes_nothing(
    apiserver: APIServer, api: k8s_client.ApiClient
) -> None:
    import yaml

    from ravenproxy.controller.runtime import dry_run_with

    await cluster(apiserver)
    text = await dry_run_with(api)
    docs = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(text)]
    assert docs == [
        ("Gateway", "gw-cloud"),
        ("Gateway", "gw-edge"),
        ("Service", INTERNAL_SERVICE),
        ("Endpoints", INTERNAL_SERVICE),
        ("Service", "x-raven-proxy-svc-gw-cloud-cloud-1"),
        ("Endpoints", "x-raven-proxy-svc-gw-cloud-cloud-1"),
        ("ConfigMap", "edge-tunnel-nodes"),
    ]
    assert apiserver.writes() == []


async def test_an_invalid_gateway_gets_one_warning_event_and_no_status(
    apiserver: APIServer, api: k8s_client.ApiClient, store: ModelStore
) -> None:
    await cluster(apiserver)
    # Raven's webhook would refuse this (exposed, yet its endpoint is under NAT); a cluster with
    # Raven's CRD and no webhook lets it in.
    bad = gateway_obj("gw-edge", ["edge-1"], "PublicIP")
    bad["spec"]["endpoints"][0]["underNAT"] = True
    await apiserver.put("gateways", bad)
    await settled(store, apiserver)
    reconciler = Reconciler(KubeWriter(api, lambda: True), store, UP)
    report = await reconciler.reconcile()
    assert report.statuses == ["gw-cloud"]
    edge = apiserver.get("gateways", "gw-edge")
    assert edge is not None and "status" not in edge
    warnings = [e for e in apiserver.items("events") if e["reason"] == "InvalidGatewaySpec"]
    assert len(warnings) == 1
    assert warnings[0]["type"] == "Warning"
    assert warnings[0]["involvedObject"]["name"] == "gw-edge"
    assert "underNAT" in warnings[0]["message"]

    await settled(store, apiserver)
    assert not (await reconciler.reconcile()).wrote  # reported once, not every round

    # Fixed: elected at once.
    await apiserver.put("gateways", gateway_obj("gw-edge", ["edge-1"]))
    await settled(store, apiserver)
    await reconciler.reconcile()
    edge = apiserver.get("gateways", "gw-edge")
    assert edge is not None
    assert [e["nodeName"] for e in edge["status"]["activeEndpoints"]] == ["edge-1"]
