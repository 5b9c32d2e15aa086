"""Seed bug 000 without IPsec: a Flannel-style MASQUERADE on the gateway rewrites the source
of pod-to-remote-pod traffic; our chain restores it, for new flows and for the flow that was
already running (its conntrack entry is forgotten)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable

import pytest

from ravenproxy.l3 import apply_iptables
from ravenproxy.l3.plan import plan
from ravenproxy.l3.state import Chain, Jump, NodeState

from .conftest import sh

pytestmark = pytest.mark.root

SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.16.0.7", 5000))
print("ready", flush=True)
for _ in range(2):
    data, peer = s.recvfrom(100)
    print(peer[0], flush=True)
"""
SEND = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.16.11.5", 40000))
s.sendto(b"x", ("10.16.0.7", 5000))
"""


def link(a: str, a_ip: str, b: str, b_ip: str, tag: str) -> None:
    ia, ib = f"{tag}a", f"{tag}b"
    sh("ip", "link", "add", ia, "netns", a, "type", "veth", "peer", ib, "netns", b)
    for ns, dev, ip in ((a, ia, a_ip), (b, ib, b_ip)):
        sh("ip", "addr", "add", ip, "dev", dev, netns=ns)
        sh("ip", "link", "set", dev, "up", netns=ns)


async def test_skip_snat_restores_pod_source_for_running_flow(netns_factory: Callable[[], str]):
    pod, gw, remote = netns_factory(), netns_factory(), netns_factory()
    tag = pod[-6:].replace("-", "")
    link(pod, "10.16.11.5/24", gw, "10.16.11.1/24", f"{tag}p")
    link(gw, "172.31.0.1/24", remote, "172.31.0.2/24", f"{tag}r")
    sh("ip", "addr", "add", "10.16.0.7/32", "dev", "lo", netns=remote)
    sh("ip", "route", "add", "default", "via", "10.16.11.1", netns=pod)
    sh("ip", "route", "add", "10.16.0.0/23", "via", "172.31.0.2", netns=gw)
    sh("ip", "route", "add", "10.16.11.0/24", "via", "172.31.0.1", netns=remote)
    sh("sysctl", "-w", "net.ipv4.ip_forward=1", netns=gw)
    # The CNI's rule from the seed report.
    sh("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.16.0.0/12", "!", "-d",
       "224.0.0.0/4", "-j", "MASQUERADE", netns=gw)  # fmt: skip

    server = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", remote, sys.executable, "-c", SERVER,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip

    async def heard() -> str:
        assert server.stdout is not None
        return (await asyncio.wait_for(server.stdout.readline(), 5)).decode().strip()

    try:
        assert await heard() == "ready"
        sh(sys.executable, "-c", SEND, netns=pod)
        assert await heard() == "172.31.0.1"  # the bug: SNATed

        rules = (
            ("-s", "10.16.0.0/23", "-d", "10.16.11.0/24", "-j", "ACCEPT"),
            ("-s", "10.16.11.0/24", "-d", "10.16.0.0/23", "-j", "ACCEPT"),
        )
        spec = ("-m", "comment", "--comment", "ravenproxy", "-j", "RAVEN-POSTROUTING")
        desired = NodeState.of(
            [
                Chain(4, "nat", "RAVEN-POSTROUTING", rules),
                Jump(4, "nat", "POSTROUTING", "RAVEN-POSTROUTING", spec),
            ]
        )
        await apply_iptables.apply(plan(await apply_iptables.read_actual(gw), desired), gw)

        # Same 5-tuple: without the conntrack flush it would keep the old SNAT mapping.
        sh(sys.executable, "-c", SEND, netns=pod)
        assert await heard() == "10.16.11.5"
    finally:
        # It exits by itself after two datagrams; it may already be gone.
        with contextlib.suppress(ProcessLookupError):
            server.kill()
        await server.wait()
