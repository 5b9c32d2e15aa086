"""Reconciling never disturbs a working data path: numbered UDP streams in both directions
through 100 forced reconcile passes on every node, then through an agent restart (a fresh
``ravenproxy routes apply`` process per node, which must find everything in place), lose no
packet and keep every pod source address — over strongSwan and over WireGuard."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from ravenproxy.l3 import driver
from ravenproxy.l3.desired import desired_state
from ravenproxy.model.inventory import load_inventory

from .cloud_edge import CLOUD_POD, EDGE_POD, CloudEdge, echo
from .test_ipsec import NODES, apply_all

pytestmark = pytest.mark.root

PASSES = 100
RATE = 200  # datagrams per second, each way


async def wait_path(t: CloudEdge) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while echo(t.cloud_node, CLOUD_POD, EDGE_POD, timeout=0.3, tries=1) != CLOUD_POD:
        assert asyncio.get_running_loop().time() < deadline, "tunnel did not come up"
    assert echo(t.edge_node, EDGE_POD, CLOUD_POD) == EDGE_POD


async def restart_agent(t: CloudEdge, node: str) -> str:
    """A new agent process on the node: reads the kernel and the VPN daemon from scratch."""
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", t.netns_of[node], sys.executable, "-m", "ravenproxy",
        "routes", "apply", *t.cli_flags(node), "--log-level", "WARNING",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out.decode(), err.decode())
    return out.decode()


@pytest.mark.parametrize("topo", ["ipsec_topo", "wg_topo"])
async def test_no_packet_lost_through_reconciles_and_restart(
    topo: str, request: pytest.FixtureRequest
):
    t: CloudEdge = request.getfixturevalue(topo)
    t.start_echo(t.cloud_node, CLOUD_POD)
    t.start_echo(t.edge_node, EDGE_POD)
    await apply_all(t)
    await wait_path(t)
    # The CLI's inventory says what the in-process model says.
    inventory = load_inventory(t.inventory())
    for node in NODES:
        s = t.settings(node)
        assert desired_state(inventory, node, s) == desired_state(t.model(), node, s)

    streams = [
        t.start_stream(t.cloud_node, CLOUD_POD, EDGE_POD, RATE),
        t.start_stream(t.edge_node, EDGE_POD, CLOUD_POD, RATE),
    ]
    try:
        model = t.model()
        for _ in range(PASSES):
            reports = await asyncio.gather(
                *(driver.reconcile_once(model, n, t.settings(n), t.netns_of[n]) for n in NODES)
            )
            assert all(r.applied == () and r.skipped == () for r in reports), reports
        for node in NODES:
            out = await restart_agent(t, node)
            assert "no changes" in out, out
    finally:
        results = [t.stop_stream(p) for p in streams]
    for sent, answered, rewritten in results:
        assert sent > RATE  # the stream ran through the whole test
        assert (answered, rewritten) == (sent, 0), results
