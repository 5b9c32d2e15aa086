"""Pod to remote pod over a real strongSwan tunnel (IKEv2, ESP in UDP 4500 through the NAT),
from the non-gateway nodes, in both directions, with the source address intact — and the
seed bug: without the skip-SNAT rule the Flannel MASQUERADE on the gateway breaks it, and the
next reconcile repairs it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from ravenproxy.l3 import apply_strongswan, driver, ipsec
from ravenproxy.model.store import ModelStore

from .cloud_edge import CLOUD_POD, EDGE_POD, CloudEdge, echo
from .conftest import sh

pytestmark = pytest.mark.root

NODES = ("cloud-gw", "edge-gw", "cloud-node", "edge-node")
CONN = {"cloud": "raven-gw-cloud-gw-edge", "edge": "raven-gw-edge-gw-cloud"}
SKIP_SNAT_JUMP = ("-m", "comment", "--comment", "ravenproxy", "-j", "RAVEN-POSTROUTING")


async def apply_all(t: CloudEdge) -> None:
    model = t.model()
    for name in NODES:
        report = await driver.reconcile_once(model, name, t.settings(name), t.netns_of[name])
        assert report.skipped == (), report.skipped


async def counters(t: CloudEdge, gw: str) -> tuple[int, int]:
    """(packets in, packets out) of the gateway's child SAs, from charon."""
    _, sas = await apply_strongswan.query(t.settings(f"{gw}-gw"))
    return ipsec.sa_counters(sas).get(CONN[gw], (0, 0))


async def wait_established(t: CloudEdge, within: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while True:
        ok = True
        for gw in ("cloud", "edge"):
            _, sas = await apply_strongswan.query(t.settings(f"{gw}-gw"))
            if not ipsec.installed_children(sas).get(CONN[gw]):
                ok = False
        if ok:
            return
        if asyncio.get_running_loop().time() > deadline:
            logs = {gw: (t.workdir / gw / "charon.log").read_text()[-3000:] for gw in CONN}
            raise AssertionError(f"IPsec SAs did not come up; charon logs: {logs}")
        await asyncio.sleep(0.1)


async def test_pod_to_pod_over_ipsec_and_the_seed_bug(ipsec_topo: CloudEdge):
    t = ipsec_topo
    t.start_echo(t.cloud_node, CLOUD_POD)
    t.start_echo(t.edge_node, EDGE_POD)
    # Before the driver: no path between the domains at all.
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD, timeout=0.3, tries=1) == "timeout"

    await apply_all(t)
    await wait_established(t)
    # ESP travels in UDP 4500 through the NAT router (NAT-T), initiated by the edge.
    _, sas = await apply_strongswan.query(t.settings("edge-gw"))
    ike = sas[0][CONN["edge"]]
    assert ike["initiator"] == b"yes" and ike["remote-port"] == b"4500"

    before = await counters(t, "edge")
    # Both directions, each a new flow started on a non-gateway node; the far pod sees the
    # original pod address.
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD) == CLOUD_POD
    assert echo(t.edge_node, EDGE_POD, CLOUD_POD) == EDGE_POD
    after = await counters(t, "edge")
    assert after[0] > before[0] and after[1] > before[1], (before, after)

    # Seed bug 000: the jump into our skip-SNAT chain removed by hand. The cloud gateway's
    # MASQUERADE rewrites the pod source, the packet no longer matches the SA's selectors,
    # the SA's outbound counter stands still and nothing reaches the edge pod.
    sh("iptables", "-t", "nat", "-D", "POSTROUTING", *SKIP_SNAT_JUMP, netns=t.cloud_gw)
    stuck = await counters(t, "cloud")
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD, timeout=0.5, tries=2) == "timeout"
    assert (await counters(t, "cloud"))[1] == stuck[1]

    # One reconcile of the cloud gateway puts the rule back, in front of the MASQUERADE.
    report = await driver.reconcile_once(t.model(), "cloud-gw", t.settings("cloud-gw"), t.cloud_gw)
    assert [op.obj.kind_name for op in report.applied] == ["jump"]
    first = sh("iptables", "-t", "nat", "-S", "POSTROUTING", netns=t.cloud_gw).splitlines()[1]
    assert "RAVEN-POSTROUTING" in first
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD) == CLOUD_POD
    assert (await counters(t, "cloud"))[1] > stuck[1]


async def test_sa_terminated_by_hand_is_back_after_one_reconcile(ipsec_topo: CloudEdge):
    t = ipsec_topo
    await apply_all(t)
    await wait_established(t)
    settings = t.settings("edge-gw")
    # An unchanged node: a second pass (as after an agent restart) changes nothing.
    again = await driver.reconcile_once(t.model(), "edge-gw", settings, t.edge_gw)
    assert again.applied == ()

    sh("swanctl", "--terminate", "--ike", CONN["edge"], "--force",
       "--uri", f"unix://{settings.vici_path}")  # fmt: skip
    _, sas = await apply_strongswan.query(settings)
    assert not ipsec.installed_children(sas).get(CONN["edge"])
    report = await driver.reconcile_once(t.model(), "edge-gw", settings, t.edge_gw)
    assert [(op.action, op.obj.kind_name) for op in report.applied] == [("replace", "vpn")]
    await wait_established(t, within=5)

    # Cleanup unloads our connection and key, and leaves charon running.
    await driver.cleanup(settings, t.edge_gw)
    conns, _ = await apply_strongswan.query(settings)
    assert not [c for c in conns if CONN["edge"] in c]


async def test_apply_refuses_a_default_key(ipsec_topo: CloudEdge):
    t = ipsec_topo
    (t.workdir / "psk").write_text("openyurt-raven\n")
    report = await driver.reconcile_once(t.model(), "edge-gw", t.settings("edge-gw"), t.edge_gw)
    ((op, why),) = report.skipped
    assert op.obj.kind_name == "vpn" and "default key" in why
    conns, _ = await apply_strongswan.query(t.settings("edge-gw"))
    assert conns == []


async def test_charon_route_removed_by_hand_is_back_after_one_reconcile(ipsec_topo: CloudEdge):
    t = ipsec_topo
    t.start_echo(t.edge_node, EDGE_POD)
    await apply_all(t)
    await wait_established(t)
    assert echo(t.cloud_node, CLOUD_POD, EDGE_POD) == CLOUD_POD
    cases = (("cloud", t.cloud_gw, "10.16.10.0/23"), ("edge", t.edge_gw, "10.16.0.0/23"))
    for gw, ns, dst in cases:
        # charon still believes the route is there; the SA looks fine; traffic goes nowhere.
        sh("ip", "route", "del", dst, "table", "220", netns=ns)
        assert echo(t.cloud_node, CLOUD_POD, EDGE_POD, timeout=0.3, tries=1) == "timeout"
        report = await driver.reconcile_once(t.model(), f"{gw}-gw", t.settings(f"{gw}-gw"), ns)
        ((op, was),) = [(op, op.old[0]) for op in report.applied]
        assert op.action == "replace" and was.problem == ipsec.PROBLEM_ROUTE
        deadline = asyncio.get_running_loop().time() + 5
        while echo(t.cloud_node, CLOUD_POD, EDGE_POD, timeout=0.3, tries=1) != CLOUD_POD:
            logs = {g: (t.workdir / g / "charon.log").read_text()[-2500:] for g in CONN}
            assert asyncio.get_running_loop().time() < deadline, f"{gw}: no route: {logs}"
        assert dst in sh("ip", "route", "show", "table", "220", netns=ns)


async def test_reconciler_brings_a_terminated_sa_back_within_a_period(ipsec_topo: CloudEdge):
    t = ipsec_topo
    await apply_all(t)
    await wait_established(t)
    period = 0.5
    settings = t.settings("edge-gw", reconcile_period=period)
    loop = driver.Reconciler(ModelStore(t.model()), "edge-gw", settings, t.edge_gw)
    task = asyncio.create_task(loop.run(), name="l3-reconciler-ipsec-test")
    try:
        sh("swanctl", "--terminate", "--ike", CONN["edge"], "--force",
           "--uri", f"unix://{settings.vici_path}")  # fmt: skip
        await wait_established(t, within=2 * period + 2)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
