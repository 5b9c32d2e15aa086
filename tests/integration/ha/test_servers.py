"""High availability end to end: several real servers, agents holding a tunnel to every one,
through the CLI on loopback (issue 10: items 1, 2, 3, 5)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ravenproxy.agent.servers import HEALTHY_AFTER
from tests.integration.cluster import INVENTORY, Cluster
from tests.integration.ha.env import (
    agent_metrics,
    echo_via,
    readyz,
    round_robin,
    start_servers,
    tunnel_addr,
    tunnel_up_key,
    wait_tunnels,
)
from tests.integration.targets import echo, tcp_server

pytestmark = pytest.mark.timeout(240)

IDS = ("cloud-a", "cloud-b", "cloud-c")


async def test_every_server_reaches_every_agent_and_survives_one_killed(cluster: Cluster) -> None:
    async with tcp_server(echo) as port1, tcp_server(echo, host="127.0.0.2") as port2:
        servers = await start_servers(cluster, IDS)
        addrs = tuple(tunnel_addr(s) for s in servers.values())
        agents = {
            # Default flags: "back within 2 s" after a restart is the agent's default behaviour.
            "edge-1": cluster.start_agent("edge-1", f"127.0.0.1:{port1}", servers=addrs),
            "edge-2": cluster.start_agent("edge-2", f"127.0.0.2:{port2}", servers=addrs),
        }
        targets = {"edge-1": f"edge-1:{port1}", "edge-2": f"edge-2:{port2}"}
        for agent in agents.values():
            await wait_tunnels(cluster, agent, "tunnels up 3/3")
        # Every server reaches every agent's node.
        for server in servers.values():
            for target in targets.values():
                await echo_via(cluster, server, target, b"hello " + target.encode())
            assert (await cluster.metrics(server))["ravenproxy_server_agents_connected"] == 2
        m = await agent_metrics(agents["edge-1"])
        for sid in IDS:
            key = tunnel_up_key(sid, tunnel_addr(servers[sid]))
            assert m[key] == 1, key
        assert m["ravenproxy_agent_tunnels_up"] == 3
        assert m["ravenproxy_agent_tunnels_wanted"] == 3

        # Requests flow through cloud-a and cloud-c while cloud-b is killed: none fails.
        survivors = [servers["cloud-a"], servers["cloud-c"]]
        counts = {"ok": 0, "failed": 0}
        errors: list[str] = []
        stop = asyncio.Event()

        async def load(server_index: int) -> None:
            i = 0
            while not stop.is_set():
                target = list(targets.values())[i % 2]
                i += 1
                try:
                    await echo_via(cluster, survivors[server_index], target, f"req {i}".encode())
                    counts["ok"] += 1
                except Exception as exc:  # counted: the assertion below names them
                    counts["failed"] += 1
                    errors.append(repr(exc))

        loaders = [asyncio.create_task(load(0)), asyncio.create_task(load(1))]
        try:
            # Up for longer than HEALTHY_AFTER first: the quick redial is for tunnels that were
            # healthy (one lost within a second of coming up backs off as a failed dial does).
            await asyncio.sleep(HEALTHY_AFTER + 0.5)
            killed = servers["cloud-b"]
            killed.kill()  # SIGKILL
            killed.popen.wait(10)  # type: ignore[union-attr]
            for agent in agents.values():
                await wait_tunnels(cluster, agent, "tunnels up 2/3", within=10)
                status, _ = await readyz(agent)
                assert status == 200  # still serving through the other two
            await asyncio.sleep(1.0)
        finally:
            stop.set()
            await asyncio.gather(*loaders)
        assert counts["failed"] == 0, errors[:5]
        assert counts["ok"] > 10, counts
        m = await agent_metrics(agents["edge-1"])
        key = (
            f'ravenproxy_agent_server_tunnel_up{{address="{tunnel_addr(killed)}",server="cloud-b"}}'
        )
        assert m[key] == 0
        assert "tunnel down, reconnecting" in agents["edge-1"].output()
        assert "server_id=cloud-b" in agents["edge-1"].output()

        # Restarted on the same ports: every agent is back on it within 2 s of it listening.
        restarted = cluster.start_server(
            "--server-id", "cloud-b", ports=killed.ports, name="server-cloud-b-2"
        )
        await cluster.wait_up(restarted)
        started = time.monotonic()
        for agent in agents.values():
            await wait_tunnels(cluster, agent, "tunnels up 3/3", within=10)
        back = time.monotonic() - started
        assert back <= 2.0, f"agents back on cloud-b after {back:.2f} s"
        for target in targets.values():
            await echo_via(cluster, restarted, target, b"again")
        m = await agent_metrics(agents["edge-2"])
        assert m['ravenproxy_agent_reconnects_total{server="cloud-b"}'] == 1


async def test_load_balancer_three_distinct_tunnels_and_duplicates_refused(
    cluster: Cluster,
) -> None:
    async with tcp_server(echo) as port:
        servers = await start_servers(cluster, IDS)
        a, b, c = (s.ports["tunnel"] for s in servers.values())
        # cloud-a gets two turns in each round: a second tunnel to it is certain.
        async with round_robin([a, a, b, c]) as lb:
            agent = cluster.start_agent(
                "edge-1",
                f"127.0.0.1:{port}",
                servers=(f"wss://127.0.0.1:{lb}",),
                extra=("--server-count", "3"),
            )
            await wait_tunnels(cluster, agent, "tunnels up 3/3", within=30)
            m = await agent_metrics(agent)
            for sid in IDS:
                key = tunnel_up_key(sid, f"wss://127.0.0.1:{lb}")
                assert m[key] == 1, key
            assert m['ravenproxy_agent_duplicate_tunnels_total{server="cloud-a"}'] >= 1
            assert "duplicate tunnel closed, dialling again" in agent.output()
            server_a = servers["cloud-a"]
            await cluster.wait_metric(
                'ravenproxy_server_agent_sessions_total{outcome="duplicate"}',
                lambda v: v >= 1,
                proc=server_a,
            )
            # The duplicate is gone: one tunnel per server, each serves the node.
            for server in servers.values():
                await cluster.wait_metric(
                    "ravenproxy_server_agents_connected", lambda v: v == 1, proc=server
                )
                await echo_via(cluster, server, f"edge-1:{port}", b"via " + server.name.encode())


def discovery_inventory(tunnel_ports: list[int]) -> str:
    endpoints = "".join(
        f"    - {{nodeName: cloud-1, type: proxy, port: 10262, publicIP: 127.0.0.1, "
        f"publicPort: {p}}}\n"
        for p in tunnel_ports
    )
    active = endpoints or "    []\n"
    return INVENTORY + (
        "---\n"
        "apiVersion: raven.openyurt.io/v1beta1\n"
        "kind: Gateway\n"
        "metadata: {name: gw-public}\n"
        "spec:\n"
        "  exposeType: PublicIP\n"
        "  proxyConfig: {Replicas: 2}\n"
        "  endpoints:\n"
        "  - {nodeName: cloud-1, type: proxy}\n"
        "status:\n"
        "  activeEndpoints:\n" + active
    )


def replace_file(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


async def test_discover_servers_follows_the_model(cluster: Cluster, tmp_path: Path) -> None:
    async with tcp_server(echo) as port:
        servers = await start_servers(cluster, ("cloud-a", "cloud-b"))
        sa, sb = servers["cloud-a"], servers["cloud-b"]
        inventory = tmp_path / "agent-inventory.yaml"
        replace_file(inventory, discovery_inventory([sa.ports["tunnel"]]))
        agent = cluster.start_agent(
            "edge-1",
            f"127.0.0.1:{port}",
            servers=(),
            extra=("--discover-servers", "--inventory", str(inventory)),
        )
        await wait_tunnels(cluster, agent, "tunnels up 1/1")
        await echo_via(cluster, sa, f"edge-1:{port}", b"one")

        # A second active proxy endpoint appears: a tunnel to it, no restart.
        pid = agent.pid
        replace_file(inventory, discovery_inventory([sa.ports["tunnel"], sb.ports["tunnel"]]))
        await wait_tunnels(cluster, agent, "tunnels up 2/2")
        await echo_via(cluster, sb, f"edge-1:{port}", b"two")
        m = await agent_metrics(agent)
        assert m["ravenproxy_agent_tunnels_wanted"] == 2

        # It is removed again: its tunnel is drained (GOAWAY, then closed), the other stays.
        replace_file(inventory, discovery_inventory([sa.ports["tunnel"]]))
        await wait_tunnels(cluster, agent, "tunnels up 1/1")
        await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v == 0, proc=sb)
        await echo_via(cluster, sa, f"edge-1:{port}", b"three")
        assert agent.running and agent.pid == pid
        out = agent.output()
        assert "tunnel draining" in out and "tunnel drained" in out
        m = await agent_metrics(agent)
        assert not any(
            k.startswith("ravenproxy_agent_server_tunnel_up") and "cloud-b" in k for k in m
        )

        # No server left in the model: not ready, and /readyz says why.
        replace_file(inventory, discovery_inventory([]))
        await wait_tunnels(cluster, agent, "tunnels up 0/0")
        assert (await readyz(agent))[0] == 503
