"""`ravenproxy agent --l3` embeds the route driver: started on every node of a working
cloud-edge topology (as after an agent upgrade or restart), it finds everything in place,
changes nothing, loses no packet — and stopping it removes nothing either."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ravenproxy.pki import init_pki

from .cloud_edge import CLOUD_POD, EDGE_POD, CloudEdge
from .test_ipsec import NODES, apply_all
from .test_no_loss import RATE, wait_path

pytestmark = pytest.mark.root


def start_agent(t: CloudEdge, node: str, certs: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                "ip", "netns", "exec", t.netns_of[node], sys.executable, "-m", "ravenproxy",
                "agent", "--l3", *t.cli_flags(node),
                # No server in this topology: the tunnel keeps retrying, L3 runs regardless.
                "--server-addr", "wss://127.0.0.1:9", "--backoff-cap", "1",
                "--ca-file", str(certs / "ca.crt"),
                "--cert-file", str(certs / f"{node}.crt"),
                "--key-file", str(certs / f"{node}.key"),
                "--log-level", "DEBUG",
            ],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


async def test_agent_l3_restart_changes_nothing_and_loses_nothing(ipsec_topo: CloudEdge):
    t = ipsec_topo
    certs = t.workdir / "agent-certs"
    init_pki(certs, ("localhost",), NODES)
    t.start_echo(t.cloud_node, CLOUD_POD)
    t.start_echo(t.edge_node, EDGE_POD)
    await apply_all(t)
    await wait_path(t)
    streams = [
        t.start_stream(t.cloud_node, CLOUD_POD, EDGE_POD, RATE),
        t.start_stream(t.edge_node, EDGE_POD, CLOUD_POD, RATE),
    ]
    started = time.monotonic()
    agents: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for node in NODES:
            log = t.workdir / f"agent-{node}.log"
            agents[node] = (start_agent(t, node, certs, log), log)
        deadline = time.monotonic() + 30
        for node, (proc, log) in agents.items():
            while "in sync" not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, f"{node}: no reconcile pass\n{log.read_text()}"
                await asyncio.sleep(0.1)
        for node, (_, log) in agents.items():
            text = log.read_text(errors="replace")
            assert "reconciled" not in text and "not applied" not in text, (node, text)
            assert "cannot reach the server" in text  # the tunnel side ran too
        # Traffic all through the agents' start, first pass and stop, however fast they come up
        # (sent > RATE below: they once synced and stopped within 0.93 s, 185 datagrams sent).
        await asyncio.sleep(max(0.0, started + 2.0 - time.monotonic()))
    finally:
        for proc, _ in agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in agents.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        results = [t.stop_stream(p) for p in streams]
    for node, (proc, _) in agents.items():
        assert proc.returncode == 0, node
    for sent, answered, rewritten in results:
        assert sent > RATE
        assert (answered, rewritten) == (sent, 0), results
    # Stopping the agents removed nothing: the data path still works.
    await wait_path(t)
