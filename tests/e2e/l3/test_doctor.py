"""``ravenproxy doctor`` on the real topology: nothing on a healthy one (with traffic flowing),
and each injected seed failure found, with evidence, on the node where it was injected.

XfrmInNoPols cannot be produced here (it needs packets decapsulated by kernel ESP, which the
test bed lacks); its check is covered on evidence data in tests/unit/l3/test_doctor.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest

from ravenproxy.l3 import doctor

from .cloud_edge import CLOUD_POD, EDGE_POD, CloudEdge
from .conftest import sh
from .test_ipsec import NODES, apply_all, wait_established

pytestmark = pytest.mark.root

WINDOW = 0.6
MASQUERADE = ("-s", "10.16.0.0/16", "!", "-d", "224.0.0.0/4", "-j", "MASQUERADE")
XFRM_NO_STATE = (
    "src", "10.16.1.0/24", "dst", "10.16.11.0/24", "dir", "out",
    "tmpl", "src", "10.0.0.2", "dst", "10.0.0.1", "proto", "esp", "mode", "tunnel",
)  # fmt: skip


async def findings(t: CloudEdge, node: str) -> list[doctor.Finding]:
    ev = await doctor.collect(t.model(), node, t.settings(node), t.netns_of[node], WINDOW)
    return doctor.diagnose(ev)


async def codes(t: CloudEdge, node: str) -> set[str]:
    return {f.code for f in await findings(t, node)}


async def all_healthy(t: CloudEdge) -> None:
    for node in NODES:
        got = await findings(t, node)
        assert got == [], (node, [f.render() for f in got])


async def test_doctor_finds_each_injected_fault(ipsec_topo: CloudEdge):
    t = ipsec_topo
    t.start_echo(t.cloud_node, CLOUD_POD)
    t.start_echo(t.edge_node, EDGE_POD)
    await apply_all(t)
    await wait_established(t)
    streams: list[Any] = []

    def stream() -> None:
        streams.append(t.start_stream(t.cloud_node, CLOUD_POD, EDGE_POD, rate=100))

    def stop_streams() -> None:
        for proc in streams:
            t.stop_stream(proc)
        streams.clear()

    async def repair() -> None:
        stop_streams()
        await apply_all(t)

    try:
        stream()
        await all_healthy(t)  # traffic flows, counters move: nothing to report
        stop_streams()

        # 1. A CNI MASQUERADE in front of our skip-SNAT jump (seed 000): the rule order is
        # reported, and a new flow shows up as an SA that sends nothing.
        sh("iptables", "-t", "nat", "-I", "POSTROUTING", "1", *MASQUERADE, netns=t.cloud_gw)
        stream()
        got = await findings(t, "cloud-gw")
        assert {f.code for f in got} == {"snat-before-skip-snat", "sa-idle"}, got
        masq = next(f for f in got if f.code == "snat-before-skip-snat")
        assert "rule 1" in masq.evidence[0] and "MASQUERADE" in masq.evidence[0]
        sh("iptables", "-t", "nat", "-D", "POSTROUTING", *MASQUERADE, netns=t.cloud_gw)
        sh("conntrack", "-F", netns=t.cloud_gw, check=False)
        await repair()

        # 2. An IPsec policy without an SA in front of the gateway: XfrmOutNoStates grows.
        sh("ip", "xfrm", "policy", "add", *XFRM_NO_STATE, netns=t.cloud_node)
        stream()
        assert await codes(t, "cloud-node") == {"xfrm-errors"}
        sh("ip", "xfrm", "policy", "delete", *XFRM_NO_STATE[:6], netns=t.cloud_node)
        await repair()

        # 3. Strict rp_filter on raven0 of the gateway.
        sh("sysctl", "-qw", "net.ipv4.conf.raven0.rp_filter=1", netns=t.cloud_gw)
        assert await codes(t, "cloud-gw") == {"rp-filter-strict"}
        await repair()

        # 4. A policy rule and a route removed by hand on a member node.
        sh("ip", "rule", "del", "fwmark", "0x40/0x40", "lookup", "9027", netns=t.cloud_node)
        sh("ip", "route", "del", "10.16.0.0/23", "table", "9027", netns=t.edge_node)
        got = await findings(t, "cloud-node") + await findings(t, "edge-node")
        assert [f.code for f in got] == ["missing", "missing"]
        assert "rule missing" in got[0].summary and "route missing" in got[1].summary
        await repair()

        await all_healthy(t)
    finally:
        for proc in streams:
            proc.kill()


@pytest.mark.parametrize("fault", ["none", "rp_filter"])
async def test_doctor_cli_exit_status(ipsec_topo: CloudEdge, fault: str):
    t = ipsec_topo
    await apply_all(t)
    if fault == "rp_filter":
        sh("sysctl", "-qw", "net.ipv4.conf.eth0.rp_filter=1", netns=t.cloud_node)
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", t.cloud_node, sys.executable, "-m", "ravenproxy", "doctor",
        *t.cli_flags("cloud-node"), "--interval", "0.2",
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    text = out.decode()
    if fault == "none":
        assert proc.returncode == 0, (text, err)
        assert "no known failure" in text
    else:
        assert proc.returncode == 1, (text, err)
        assert "[rp-filter-strict]" in text and "eth0/rp_filter=1" in text
