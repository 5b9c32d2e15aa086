"""Pod to remote pod over WireGuard (wireguard-go started by the driver), both directions
from the non-gateway nodes, source intact, counters moving; the seed bug and its repair; a
peer removed by hand comes back; the key pair is kept on disk and published as is."""

from __future__ import annotations

import asyncio
import stat

import pytest

from ravenproxy.l3 import apply_wireguard, driver, wireguard

from .cloud_edge import CLOUD_POD, EDGE_POD, CloudEdge, echo
from .conftest import sh

pytestmark = pytest.mark.root

NODES = ("cloud-gw", "edge-gw", "cloud-node", "edge-node")
SKIP_SNAT_JUMP = ("-m", "comment", "--comment", "ravenproxy", "-j", "RAVEN-POSTROUTING")


async def apply_all(t: CloudEdge) -> None:
    model = t.model()
    for name in NODES:
        report = await driver.reconcile_once(model, name, t.settings(name), t.netns_of[name])
        assert report.skipped == (), report.skipped


async def transfer(t: CloudEdge, gw: str) -> tuple[int, int]:
    device = await apply_wireguard.read_device(t.settings(f"{gw}-gw"), t.netns_of[f"{gw}-gw"])
    assert device is not None
    (peer,) = device.peers
    return peer.rx_bytes, peer.tx_bytes


async def wait_handshake(t: CloudEdge, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        device = await apply_wireguard.read_device(t.settings("cloud-gw"), t.cloud_gw)
        if device is not None and device.peers and device.peers[0].latest_handshake:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("no WireGuard handshake")
        await asyncio.sleep(0.05)


async def test_pod_to_pod_over_wireguard_and_the_seed_bug(wg_topo: CloudEdge):
    t = wg_topo
    t.start_echo(t.cloud_node, CLOUD_POD)
    t.start_echo(t.edge_node, EDGE_POD)
    await apply_all(t)
    # The edge, under NAT, dials (endpoint + keepalive); the cloud learns its NATed endpoint.
    await wait_handshake(t)
    cloud = await apply_wireguard.read_device(t.settings("cloud-gw"), t.cloud_gw)
    assert cloud is not None and cloud.peers[0].endpoint == "172.31.0.254:4500"
    assert cloud.listen_port == 4500

    before = await transfer(t, "edge")
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD) == CLOUD_POD
    assert echo(t.edge_node, EDGE_POD, CLOUD_POD) == EDGE_POD
    after = await transfer(t, "edge")
    assert after[0] > before[0] and after[1] > before[1]

    # The seed bug over WireGuard: SNATed to the gateway's address, the packet's source is
    # outside the cloud peer's allowed-ips at the edge, which drops it.
    sh("iptables", "-t", "nat", "-D", "POSTROUTING", *SKIP_SNAT_JUMP, netns=t.cloud_gw)
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD, timeout=0.5, tries=2) == "timeout"
    await driver.reconcile_once(t.model(), "cloud-gw", t.settings("cloud-gw"), t.cloud_gw)
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD) == CLOUD_POD


async def test_keys_persist_and_removed_peer_returns(wg_topo: CloudEdge):
    t = wg_topo
    s = t.settings("edge-gw")
    published = t.public_key("edge")  # what the model (the Gateway's publicKey) carries
    await apply_all(t)
    key_file = wireguard.key_path(s)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    device = await apply_wireguard.read_device(s, t.edge_gw)
    assert device is not None and device.public_key == published

    # Nothing to do on a second pass (what a restarted agent does first).
    again = await driver.reconcile_once(t.model(), "edge-gw", s, t.edge_gw)
    assert again.applied == ()

    sh("wg", "set", s.wireguard_interface, "peer", t.public_key("cloud"), "remove",
       netns=t.edge_gw)  # fmt: skip
    report = await driver.reconcile_once(t.model(), "edge-gw", s, t.edge_gw)
    assert [(op.action, op.obj.kind_name) for op in report.applied] == [("add", "vpn")]
    await wait_handshake(t)
    t.start_echo(t.edge_node, EDGE_POD)
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD) == CLOUD_POD

    # Cleanup removes the device (and stops wireguard-go); the key stays.
    await driver.cleanup(s, t.edge_gw)
    assert await apply_wireguard.read_device(s, t.edge_gw) is None
    assert wireguard.key_path(s).exists() and wireguard.public_key(s) == published
