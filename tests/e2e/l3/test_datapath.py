"""Packets, not just state: a member node reaches a remote subnet through raven0 only
because of the fwmark rule, our routing table and the vxlan to its gateway."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from ravenproxy.l3 import driver
from ravenproxy.l3.settings import L3Settings

from ...unit.l3.models import cloud_and_edge
from .conftest import add_bridge, sh

pytestmark = pytest.mark.root


async def test_member_traffic_for_remote_subnet_rides_raven0(netns_factory: Callable[[], str]):
    member, gw = netns_factory(), netns_factory()
    # Underlay: edge-2 (192.168.1.11) — edge-gw (192.168.1.10) on one veth.
    m_if, g_if = f"{member[-8:]}m", f"{gw[-8:]}g"
    sh("ip", "link", "add", m_if, "netns", member, "type", "veth", "peer", g_if, "netns", gw)
    for ns, dev, cidr in ((member, m_if, "192.168.1.11/24"), (gw, g_if, "192.168.1.10/24")):
        sh("ip", "addr", "add", cidr, "dev", dev, netns=ns)
        sh("ip", "link", "set", dev, "up", netns=ns)
        add_bridge(ns, "flannel.1", "10.16.11.0/32" if ns == member else "10.16.10.0/32")
    # The main table only knows the underlay and a router that is not there: without our
    # policy routing, a packet for the remote subnet leaves that way and nobody answers.
    sh("ip", "route", "add", "default", "via", "192.168.1.1", "dev", m_if, netns=member)
    # Stand-in for a pod in the remote domain, as the gateway would reach it through the VPN.
    add_bridge(gw, "remotepod", "10.16.0.7/32")

    model = cloud_and_edge()
    for ns, name in ((member, "edge-2"), (gw, "edge-gw")):
        report = await driver.reconcile_once(model, name, L3Settings(), ns)
        assert all(op.obj.kind_name == "vpn" for op, _ in report.skipped)

    assert probe(member, "10.16.0.7") == "answered"
    # The request went out over raven0 (the answer came back over the underlay).
    stats = sh("ip", "-s", "link", "show", "raven0", netns=member)
    tx_packets = int(stats.split("TX:")[1].splitlines()[1].split()[1])
    assert tx_packets >= 1

    # Without the fwmark rule the same probe goes nowhere: the path really is ours.
    sh("ip", "rule", "del", "fwmark", "0x40/0x40", "lookup", "9027", netns=member)
    assert probe(member, "10.16.0.7") == "timeout"
    # One reconcile puts it back.
    await driver.reconcile_once(model, "edge-2", L3Settings(), member)
    assert probe(member, "10.16.0.7") == "answered"


# A TCP SYN to a closed port is answered by a RST: "connection refused" proves the round trip
# without a server (no ping binary on the test bed).
_PROBE = """
import socket, sys
s = socket.socket()
s.settimeout(1.5)
try:
    s.connect((sys.argv[1], 9))
    print("answered")
except ConnectionRefusedError:
    print("answered")
except OSError:
    print("timeout")
"""


def probe(netns: str, addr: str) -> str:
    return sh(sys.executable, "-c", _PROBE, addr, netns=netns).strip()
