"""A part that cannot start stops everything already started: one line naming the flag, exit
2, no traceback, no task left behind (``ravenproxy.lifecycle``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from ravenproxy.agent.app import Agent
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.errors import ConfigError
from tests.helpers import taken_port
from tests.integration.cluster import Cluster, Proc

pytestmark = pytest.mark.timeout(90)

LEFTOVERS = ("Traceback", "Task was destroyed", "never retrieved", "Unclosed")


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback TCP port some other program listens on."""
    with taken_port() as port:
        yield port


def one_error_line(out: str, command: str) -> str:
    errors = [line for line in out.splitlines() if line.startswith(f"ravenproxy {command}:")]
    assert len(errors) == 1, out
    for leftover in LEFTOVERS:
        assert leftover not in out, out
    return errors[0]


def agent_args(cluster: Cluster, metrics_addr: str) -> list[str]:
    assert cluster.server is not None
    return [
        "agent",
        "--server-addr", f"wss://127.0.0.1:{cluster.server.ports['tunnel']}",
        "--ca-file", str(cluster.certs / "ca.crt"),
        "--cert-file", str(cluster.certs / "edge-1.crt"),
        "--key-file", str(cluster.certs / "edge-1.key"),
        "--inventory", str(cluster.inventory),
        "--metrics-addr", metrics_addr,
        "--log-level", "DEBUG",
    ]  # fmt: skip


async def test_agent_with_a_taken_metrics_addr_exits_with_one_line(
    cluster: Cluster, taken: int
) -> None:
    cluster.start_server()
    await cluster.wait_up()
    proc = Proc("agent", agent_args(cluster, f"127.0.0.1:{taken}"), cluster.base / "agent.log")
    cluster.procs.append(proc)
    proc.start()
    assert proc.popen is not None
    code = await asyncio.to_thread(proc.popen.wait, 30)
    out = proc.output()
    assert code == 2, out
    line = one_error_line(out, "agent")
    assert line.startswith(
        f"ravenproxy agent: error: --metrics-addr: cannot listen on 127.0.0.1:{taken}: "
    )
    assert "already in use" in line.lower(), line


async def test_agent_parts_started_before_the_metrics_listener_are_stopped(
    cluster: Cluster, taken: int
) -> None:
    """In process: the model source (its inventory watcher) was running when the listener
    failed; afterwards no task of the agent is left, and no tunnel was opened."""
    cluster.start_server()
    await cluster.wait_up()
    assert cluster.server is not None
    settings = AgentSettings.from_mapping(
        {
            "server_addr": f"wss://127.0.0.1:{cluster.server.ports['tunnel']}",
            "ca_file": str(cluster.certs / "ca.crt"),
            "cert_file": str(cluster.certs / "edge-1.crt"),
            "key_file": str(cluster.certs / "edge-1.key"),
            "inventory": str(cluster.inventory),
            "metrics_addr": f"127.0.0.1:{taken}",
        }
    )
    before = asyncio.all_tasks()
    agent = Agent(settings)
    started: list[str] = []
    agent.store.subscribe(lambda _model: started.append("model"))
    with pytest.raises(ConfigError) as info:
        await asyncio.wait_for(agent.run(), 30)
    assert info.value.field == "--metrics-addr"
    assert asyncio.all_tasks() == before
    assert not agent.connected.is_set()
    assert agent.session is None or agent.session.closed
    assert "metrics" not in agent.ports
    assert started == ["model"]  # the inventory had been loaded: the source had started


def test_controller_whose_inventory_loop_fails_beside_the_poller_exits_with_one_line(
    tmp_path: Path,
) -> None:
    """With --agents-url the controller runs the /agents poller and the inventory loop in one
    group: the loop failing at start stops the poller and reports the inventory's error."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("kind: [\n")
    args = ["controller", "--inventory", str(inventory), "--agents-url", "127.0.0.1:9"]
    proc = Proc("controller", args, tmp_path / "controller.log").start()
    try:
        assert proc.popen is not None
        assert proc.popen.wait(30) == 2, proc.output()
    finally:
        proc.stop()
    line = one_error_line(proc.output(), "controller")
    assert str(inventory) in line, line
