"""The agent's node name and its certificate agree, or the agent does not start.

The server knows an agent only by the node in its client certificate; an agent told another
name (``--node-name`` or ``NODE_NAME``) would register as the certificate's node while building
its allowlist, L3 plan and key publishing for the other one. Real ``ravenproxy agent`` processes
against a real server, real mTLS.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import eventually, free_port
from tests.integration.cluster import Cluster, Proc
from tests.integration.targets import echo, tcp_server

pytestmark = pytest.mark.timeout(120)


def start_agent(cluster: Cluster, cert_node: str, *extra: str, name: str = "agent") -> Proc:
    """``ravenproxy agent`` with ``cert_node``'s certificate and no ``--node-name`` unless
    ``extra`` gives one; stopped by the ``cluster`` fixture."""
    assert cluster.server is not None
    metrics = free_port()
    args = [
        "agent",
        "--server-addr", f"wss://127.0.0.1:{cluster.server.ports['tunnel']}",
        "--ca-file", str(cluster.certs / "ca.crt"),
        "--cert-file", str(cluster.certs / f"{cert_node}.crt"),
        "--key-file", str(cluster.certs / f"{cert_node}.key"),
        "--metrics-addr", f"127.0.0.1:{metrics}",
        "--log-level", "DEBUG",
        *extra,
    ]  # fmt: skip
    proc = Proc(name, args, cluster.base / f"{name}.log", ports={"metrics": metrics})
    cluster.procs.append(proc)
    return proc.start()


async def exit_code(proc: Proc, within: float) -> int:
    await eventually(
        lambda: not proc.running,
        within,
        interval=0.05,
        what=lambda: f"{proc.name} exiting\n{proc.output()}",
    )
    assert proc.popen is not None
    return int(proc.popen.returncode)


def assert_refused_naming(proc: Proc, *names: str) -> None:
    out = proc.output()
    assert "Traceback" not in out, out
    (line,) = [x for x in out.splitlines() if "error" in x.lower()]
    assert line.startswith("ravenproxy agent: error: "), out
    for name in names:
        assert name in line, line


async def test_node_name_flag_that_differs_from_the_certificate_is_refused(
    cluster: Cluster,
) -> None:
    cluster.start_server()
    await cluster.wait_up()
    agent = start_agent(cluster, "edge-1", "--node-name", "edge-2")
    # Refused at start-up, before any dial: the usual Python start-up time, not a timeout.
    assert await exit_code(agent, within=30) != 0
    assert_refused_naming(agent, "--node-name", "edge-1", "edge-2")
    m = await cluster.metrics()
    assert m["ravenproxy_server_agents_connected"] == 0
    assert cluster.server is not None
    assert "agent connected" not in cluster.server.output()


async def test_node_name_env_that_differs_from_the_certificate_is_refused(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster.start_server()
    await cluster.wait_up()
    monkeypatch.setenv("NODE_NAME", "edge-2")  # inherited by the agent process only
    agent = start_agent(cluster, "edge-1")
    assert await exit_code(agent, within=30) != 0
    assert_refused_naming(agent, "NODE_NAME", "edge-1", "edge-2")


async def test_without_a_node_name_the_agent_is_the_certificates_node(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    async with tcp_server(echo) as port:
        cluster.start_server()
        await cluster.wait_up()
        # No --allow: the allowlist is derived from the model for the node the agent is, so a
        # request for edge-1 works only if the agent took edge-1 from its certificate for that
        # too (not only for the server's registration).
        agent = start_agent(
            cluster,
            "edge-1",
            "--inventory", str(cluster.inventory),
            "--metrics-port", str(port),
        )  # fmt: skip
        await cluster.wait_routable(f"edge-1:{port}")
        reader, writer = await cluster.connect(f"edge-1:{port}")
        writer.write(b"hello edge-1")
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), 10) == b"hello edge-1"
        writer.close()
        assert agent.running
        assert "node=edge-1" in agent.output()
        m = await cluster.metrics()
        assert m["ravenproxy_server_agents_connected"] == 1
