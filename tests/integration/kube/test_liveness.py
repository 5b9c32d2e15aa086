"""Agent liveness end to end through the API emulator: the server's Lease publisher, the
controller's Lease watch, and the failover it drives (after the grace period, not before)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from ravenproxy.controller.agents import AgentLeases, AgentPoller, agents_url
from ravenproxy.controller.runtime import ControllerSettings, run_controller_with
from ravenproxy.kube.leases import ANNOTATION_NODE, LABELS, NAMESPACE, lease_name, parse_time
from ravenproxy.kube.rest import RestClient
from ravenproxy.server import liveness
from ravenproxy.server.agents import add_agents_route, agents_report
from ravenproxy.server.liveness import LivenessPublisher
from tests.helpers import eventually
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import kubeconfig, rest_client
from tests.integration.kube.test_controller import (
    FAST,
    api_client,
    gateway_obj,
    node_obj,
)

NS = NAMESPACE


def lease(apiserver: APIServer, node: str) -> dict[str, Any] | None:
    return apiserver.get("leases", lease_name(node), NS)


def holder(apiserver: APIServer, node: str) -> str | None:
    obj = lease(apiserver, node)
    return None if obj is None else (obj["spec"].get("holderIdentity") or "")


def publisher(api: RestClient, connected: set[str], identity: str, **kw: Any) -> LivenessPublisher:
    kw = {"renew_interval": 0.2, "poll_interval": 0.05, "lease_duration": 1, **kw}
    return LivenessPublisher(lambda: set(connected), api, identity, **kw)


@pytest.fixture
async def api(apiserver: APIServer) -> AsyncIterator[RestClient]:
    """The publishers' client: our REST client, as the server runs it."""
    async with rest_client(apiserver, agent="server-a") as client:
        yield client


async def stop(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_connected_agent_gets_a_lease_renewed_and_released(
    apiserver: APIServer, api: RestClient
) -> None:
    connected: set[str] = set()
    pub = publisher(api, connected, "server-a")
    task = asyncio.create_task(pub.run())
    try:
        await asyncio.sleep(0.2)
        assert apiserver.items("leases") == []  # nobody connected, nothing written

        connected.add("edge-1")
        await eventually(lambda: holder(apiserver, "edge-1") == "server-a", within=2)
        first = lease(apiserver, "edge-1")
        assert first is not None
        meta = first["metadata"]
        assert meta["labels"] == dict(LABELS)
        assert meta["annotations"] == {ANNOTATION_NODE: "edge-1"}
        assert first["spec"]["leaseDurationSeconds"] == 1
        renewed = first["spec"]["renewTime"]
        await eventually(
            lambda: (lease(apiserver, "edge-1") or {})["spec"]["renewTime"] != renewed, within=2
        )

        connected.discard("edge-1")
        await eventually(lambda: holder(apiserver, "edge-1") == "", within=2)
        writes = len(apiserver.writes("leases"))
        await asyncio.sleep(0.5)
        assert len(apiserver.writes("leases")) == writes  # a released Lease is left alone
    finally:
        await stop(task)
    # Only what rbac.yaml grants the server: get, create, patch.
    methods = {r.method for r in apiserver.requests if "/leases" in r.path}
    assert methods <= {"GET", "POST", "PATCH"}


async def test_cancelling_the_server_releases_its_leases(
    apiserver: APIServer, api: RestClient
) -> None:
    pub = publisher(api, {"edge-1", "edge-2"}, "server-a")
    task = asyncio.create_task(pub.run())
    await eventually(
        lambda: bool(holder(apiserver, "edge-1")) and bool(holder(apiserver, "edge-2"))
    )
    await stop(task)
    assert holder(apiserver, "edge-1") == "" and holder(apiserver, "edge-2") == ""


async def test_two_servers_with_one_agent_share_the_lease_without_fighting(
    apiserver: APIServer, api: RestClient
) -> None:
    a_nodes = {"edge-1"}
    b_nodes = {"edge-1"}
    async with rest_client(apiserver, agent="server-b") as api_b:
        a = asyncio.create_task(publisher(api, a_nodes, "server-a").run())
        await eventually(lambda: holder(apiserver, "edge-1") == "server-a")
        b = asyncio.create_task(publisher(api_b, b_nodes, "server-b").run())
        try:
            await asyncio.sleep(1.5)  # several renewals, longer than the lease duration
            assert holder(apiserver, "edge-1") == "server-a"
            b_writes = [r for r in apiserver.writes("leases") if r.user_agent == "server-b"]
            assert b_writes == []  # b saw a live holder and kept out

            # The agent leaves a; b still has it and takes the Lease over within a renewal.
            a_nodes.clear()
            await eventually(lambda: holder(apiserver, "edge-1") == "server-b", within=3)
            obj = lease(apiserver, "edge-1")
            assert obj is not None and obj["spec"]["leaseTransitions"] == 1
        finally:
            await stop(a)
            await stop(b)


async def test_an_expired_lease_of_a_dead_server_is_taken_over(
    apiserver: APIServer, api: RestClient
) -> None:
    dead = publisher(api, {"edge-1"}, "server-dead")
    await dead.sync()
    assert holder(apiserver, "edge-1") == "server-dead"
    # It crashes (no release). After leaseDurationSeconds another server may take over.
    async with rest_client(apiserver, agent="server-b") as api_b:
        b = publisher(api_b, {"edge-1"}, "server-b")
        await b.sync()
        assert holder(apiserver, "edge-1") == "server-dead"
        await asyncio.sleep(1.1)
        b._deferred.clear()  # skip the retry pause
        await b.sync()
        assert holder(apiserver, "edge-1") == "server-b"


# --- the controller side ----------------------------------------------------------------------


async def edge_cluster(apiserver: APIServer) -> None:
    await apiserver.put("gateways", gateway_obj("gw-edge", ["edge-1", "edge-2"]))
    await apiserver.put("nodes", node_obj("edge-1", "10.2.0.1", "gw-edge"))
    await apiserver.put("nodes", node_obj("edge-2", "10.2.0.2", "gw-edge"))


def active(apiserver: APIServer) -> list[str]:
    gw = apiserver.get("gateways", "gw-edge") or {}
    return [e["nodeName"] for e in (gw.get("status") or {}).get("activeEndpoints", [])]


def event_reasons(apiserver: APIServer) -> list[str]:
    return sorted(e["reason"] for e in apiserver.items("events"))


GRACE = 2.0


def controller_settings() -> ControllerSettings:
    return ControllerSettings(
        interval=0.1,
        lease_duration=3,
        renew_deadline=2.5,
        retry_period=1,
        identity="controller-a",
        watch=FAST,
        agent_grace=GRACE,
    )


async def failover_after(apiserver: APIServer, gone_at: float) -> float:
    """Wait for the failover to edge-2, checking it does not happen within the grace period;
    returns how long after ``gone_at`` it happened."""
    # The Lease's last renewal seen may be one renew interval (0.2 s) before ``gone_at``.
    while time.monotonic() - gone_at < GRACE - 0.3:
        assert active(apiserver) == ["edge-1"], "failed over before the grace period"
        await asyncio.sleep(0.05)
    await eventually(lambda: active(apiserver) == ["edge-2"], within=GRACE + 3)
    return time.monotonic() - gone_at


async def test_agent_gone_fails_the_gateway_over_after_the_grace_period(
    apiserver: APIServer, api: RestClient
) -> None:
    await edge_cluster(apiserver)
    connected = {"edge-1", "edge-2"}
    pub = asyncio.create_task(publisher(api, connected, "server-a").run())
    async with api_client(apiserver, "controller-a") as api_c:
        ctl = asyncio.create_task(run_controller_with(api_c, controller_settings()))
        try:
            await eventually(lambda: active(apiserver) == ["edge-1"], within=5)
            # Connected agents keep it there, well past the grace period.
            await asyncio.sleep(GRACE + 0.5)
            assert active(apiserver) == ["edge-1"]
            assert event_reasons(apiserver) == ["ActiveEndpointElected"]

            connected.discard("edge-1")
            await eventually(lambda: holder(apiserver, "edge-1") == "", within=2)
            took = await failover_after(apiserver, time.monotonic())
            assert GRACE - 0.3 <= took <= GRACE + 1.5, took
            # Events follow the status write within the same round.
            await eventually(
                lambda: (
                    event_reasons(apiserver)
                    == ["ActiveEndpointElected", "ActiveEndpointFailover", "AgentGone"]
                )
            )
        finally:
            await stop(ctl)
            await stop(pub)


async def test_a_server_that_dies_without_releasing_fails_its_agents_over(
    apiserver: APIServer, api: RestClient
) -> None:
    await edge_cluster(apiserver)
    # edge-2's agent sits on a server that keeps running; edge-1's on one that crashes.
    async with rest_client(apiserver, agent="server-b") as api_b:
        crashing = publisher(api, {"edge-1"}, "server-a")
        a = asyncio.create_task(crashing.run())
        b = asyncio.create_task(publisher(api_b, {"edge-2"}, "server-b").run())
        async with api_client(apiserver, "controller-a") as api_c:
            ctl = asyncio.create_task(run_controller_with(api_c, controller_settings()))
            try:
                await eventually(lambda: active(apiserver) == ["edge-1"], within=5)
                crashing.held.clear()  # a crash: nothing is released, renewals just stop
                await stop(a)
                renewed = (lease(apiserver, "edge-1") or {})["spec"]["renewTime"]
                took = await failover_after(apiserver, time.monotonic())
                assert GRACE - 0.3 <= took <= GRACE + 1.5, took
                # Nobody touched the Lease: the controller went by renewals it did not see.
                assert (lease(apiserver, "edge-1") or {})["spec"]["renewTime"] == renewed
                assert holder(apiserver, "edge-1") == "server-a"
            finally:
                await stop(ctl)
                await stop(b)


async def test_without_any_agent_lease_ready_alone_decides(
    apiserver: APIServer,
) -> None:
    await edge_cluster(apiserver)
    async with api_client(apiserver, "controller-a") as api_c:
        agents = AgentLeases(api_c, grace=0.1, settings=FAST)
        task = asyncio.create_task(agents.run())
        try:
            await eventually(agents.reflector.synced.is_set)
            await asyncio.sleep(0.3)
            assert not agents.health().tracks_agents
            # The controller's own leader Lease is not an agent Lease.
            await apiserver.put(
                "leases",
                {
                    "metadata": {"name": "ravenproxy-controller", "namespace": NS},
                    "spec": {"holderIdentity": "controller-a"},
                },
            )
            await asyncio.sleep(0.2)
            assert not agents.health().tracks_agents
        finally:
            await stop(task)


# --- GET /agents and the poller ----------------------------------------------------------------


class FakeSession:
    def __init__(self, name: str, started: float) -> None:
        self.name = name
        self.started = started


def test_agents_report_lists_each_node_once_since_its_oldest_tunnel() -> None:
    sessions = [FakeSession("edge-2", 90.0), FakeSession("edge-1", 50.0), FakeSession("edge-2", 95)]
    report = agents_report(sessions, now=1_700_000_000.0, monotonic_now=100.0)
    assert report == [
        {"node": "edge-1", "connected_since": "2023-11-14T22:12:30.000000Z", "connections": 1},
        {"node": "edge-2", "connected_since": "2023-11-14T22:13:10.000000Z", "connections": 2},
    ]


def test_agents_url_accepts_an_address_or_a_url() -> None:
    assert agents_url("10.0.0.1:10266") == "http://10.0.0.1:10266/agents"
    assert agents_url("http://srv:10266/") == "http://srv:10266/agents"
    assert agents_url("https://srv/agents") == "https://srv/agents"


async def test_the_poller_sees_agents_through_the_servers_endpoint() -> None:
    sessions: list[FakeSession] = [FakeSession("edge-1", time.monotonic())]
    app = web.Application()
    add_agents_route(app, lambda: list(sessions))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    clock = [1000.0]
    poller = AgentPoller(
        [agents_url(f"127.0.0.1:{port}"), "http://127.0.0.1:1/agents"],
        grace=10,
        clock=lambda: clock[0],
    )
    import aiohttp

    try:
        async with aiohttp.ClientSession() as http:
            await poller.poll_once(http)  # the second server is down: logged, skipped
            health = poller.health()
            assert health.agent_alive("edge-1", 1005.0)
            assert health.agent_alive("edge-2", 1005.0)  # never seen: grace from the start
            assert not health.agent_alive("edge-2", 1011.0)

            sessions.clear()
            clock[0] = 1008.0
            await poller.poll_once(http)
            health = poller.health()
            assert health.agent_alive("edge-1", 1010.0)  # last listed at 1000
            assert not health.agent_alive("edge-1", 1010.5)
    finally:
        await runner.cleanup()


async def test_the_inventory_controller_fails_over_by_the_servers_agents_report(
    tmp_path: Any,
) -> None:
    import yaml

    from ravenproxy.controller.dryrun import run_inventory_controller

    inventory = tmp_path / "inventory.yaml"
    docs = [
        {
            "apiVersion": "raven.openyurt.io/v1beta1",
            "kind": "Gateway",
            **gateway_obj("gw-edge", ["edge-1", "edge-2"]),
        },
        {"apiVersion": "v1", "kind": "Node", **node_obj("edge-1", "10.2.0.1", "gw-edge")},
        {"apiVersion": "v1", "kind": "Node", **node_obj("edge-2", "10.2.0.2", "gw-edge")},
    ]
    inventory.write_text(yaml.safe_dump_all(docs))
    app = web.Application()
    add_agents_route(app, lambda: [FakeSession("edge-2", time.monotonic())])
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = agents_url(f"127.0.0.1:{runner.addresses[0][1]}")
    outputs: list[list[str]] = []

    def write(text: str) -> None:
        gw = next(d for d in yaml.safe_load_all(text) if d["kind"] == "Gateway")
        outputs.append([e["nodeName"] for e in gw["status"]["activeEndpoints"]])

    task = asyncio.create_task(
        run_inventory_controller(inventory, write, interval=0.1, agents_urls=[url], agent_grace=0.5)
    )
    try:
        # edge-1 never dials in: elected at first (the grace period), then failed over.
        await eventually(lambda: outputs[-1:] == [["edge-2"]], within=5)
        assert outputs[0] == ["edge-1"]
    finally:
        await stop(task)
        await runner.cleanup()


async def test_the_server_hook_publishes_through_a_kubeconfig(
    apiserver: APIServer, tmp_path: Any
) -> None:
    config = kubeconfig(tmp_path / "kubeconfig", apiserver)
    connected = {"edge-1"}
    hook = liveness.KubeLiveness(lambda: set(connected), config, "server-pod-1", poll_interval=0.05)
    await hook.start()
    try:
        await eventually(lambda: holder(apiserver, "edge-1") == "server-pod-1")
    finally:
        await hook.stop()
    assert holder(apiserver, "edge-1") == ""  # released on stop


async def test_a_real_agent_connecting_to_a_real_server_gets_its_lease(
    apiserver: APIServer, api: RestClient, tmp_path: Any
) -> None:
    """The publisher on the real registry (what server/app.py hands it): connect, report,
    disconnect, release."""
    from ravenproxy.agent.app import Agent
    from ravenproxy.agent.settings import AgentSettings
    from ravenproxy.model.inventory import load_inventory
    from ravenproxy.model.store import ModelStore
    from ravenproxy.pki import init_pki
    from ravenproxy.server.app import ProxyServer
    from ravenproxy.server.settings import ServerSettings
    from tests.integration.cluster import INVENTORY

    init_pki(tmp_path, ("127.0.0.1",), ("edge-1",))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    settings = ServerSettings.from_mapping(
        {
            "inventory": str(inventory),
            "ca_file": str(tmp_path / "ca.crt"),
            "cert_file": str(tmp_path / "server.crt"),
            "key_file": str(tmp_path / "server.key"),
            **{k: "127.0.0.1:0" for k in ("tunnel_addr", "https_addr", "http_addr")},
            **{k: "127.0.0.1:0" for k in ("metrics_addr", "health_addr")},
        }
    )
    server = ProxyServer(settings, ModelStore(load_inventory(inventory)))
    await server.start()
    pub = asyncio.create_task(
        LivenessPublisher(
            server.registry.connected_nodes, api, "server-a", poll_interval=0.05
        ).run()
    )
    agent = Agent(
        AgentSettings.from_mapping(
            {
                "node_name": "edge-1",
                "server_addr": f"wss://127.0.0.1:{server.ports['tunnel']}",
                "ca_file": str(tmp_path / "ca.crt"),
                "cert_file": str(tmp_path / "edge-1.crt"),
                "key_file": str(tmp_path / "edge-1.key"),
            }
        )
    )
    agent_task = asyncio.create_task(agent.run())
    try:
        await eventually(lambda: holder(apiserver, "edge-1") == "server-a", within=10)
        (entry,) = agents_report(server.registry.sessions())
        assert entry["node"] == "edge-1" and entry["connections"] == 1
        since = parse_time(entry["connected_since"])
        assert since is not None and abs(since - time.time()) < 10
        await stop(agent_task)
        await eventually(lambda: holder(apiserver, "edge-1") == "", within=10)
    finally:
        if not agent_task.done():
            await stop(agent_task)
        await stop(pub)
        await server.stop()


async def test_a_server_publishing_leases_loads_no_kubernetes_asyncio(tmp_path: Any) -> None:
    """``ravenproxy server --agent-leases`` (the shipped Deployment's flag) through the CLI,
    against the emulator: it publishes with ravenproxy.kube.rest; kubernetes_asyncio (~850
    modules) stays the controller's. A real agent connects, so a Lease is held when the server's
    modules are listed."""
    from ravenproxy.pki import init_pki
    from tests.helpers import free_port, spawn_python
    from tests.helpers import stop as stop_process
    from tests.integration.cluster import INVENTORY
    from tests.unit.agent.test_imports import PROBE, present

    apiserver = APIServer()
    await apiserver.start()
    procs = []
    try:
        config = kubeconfig(tmp_path / "kubeconfig", apiserver)
        init_pki(tmp_path, ("127.0.0.1",), ("edge-1",))
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(INVENTORY)
        tunnel, out = free_port(), tmp_path / "modules.txt"
        procs.append(
            spawn_python(
                [
                    "-c", PROBE, str(out), "ravenproxy.server.liveness",
                    "liveness: holding the agent's lease",
                    "server",
                    "--inventory", str(inventory),
                    "--ca-file", str(tmp_path / "ca.crt"),
                    "--cert-file", str(tmp_path / "server.crt"),
                    "--key-file", str(tmp_path / "server.key"),
                    "--tunnel-addr", f"127.0.0.1:{tunnel}",
                    *(f"--{n}-addr=127.0.0.1:{free_port()}" for n in ("http", "https")),
                    *(f"--{n}-addr=127.0.0.1:{free_port()}" for n in ("metrics", "health")),
                    "--agent-leases", "--kubeconfig", str(config),
                ],
                tmp_path / "server.log",
            )
        )  # fmt: skip
        procs.append(
            spawn_python(
                [
                    "-m", "ravenproxy", "agent",
                    "--node-name", "edge-1",
                    "--server-addr", f"wss://127.0.0.1:{tunnel}",
                    "--ca-file", str(tmp_path / "ca.crt"),
                    "--cert-file", str(tmp_path / "edge-1.crt"),
                    "--key-file", str(tmp_path / "edge-1.key"),
                ],
                tmp_path / "agent.log",
            )
        )  # fmt: skip
        await eventually(lambda: procs[0].poll() is not None, within=30)
        server_log = (tmp_path / "server.log").read_text()
        assert out.exists(), f"no Lease held: {server_log[-2000:]}"
        # Held, then released by the server's graceful stop (the probe's SIGTERM).
        assert holder(apiserver, "edge-1") == "", "the Lease was not written or not released"
        modules = set(out.read_text().split())
    finally:
        for proc in procs:
            stop_process(proc)
        await apiserver.close()
    assert "ravenproxy.kube.rest" in modules and "ravenproxy.server.liveness" in modules
    assert not present(modules, "kubernetes_asyncio"), "the server loaded kubernetes_asyncio"
    assert not present(modules, "urllib3")
