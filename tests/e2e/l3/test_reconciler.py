"""The periodic loop: what is removed by hand is back within one period; a model change is
applied without waiting for the period."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from ravenproxy.l3 import driver
from ravenproxy.l3.settings import L3Settings
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore
from tests.helpers import eventually

from ...unit.l3.models import cloud_and_edge, node
from .conftest import add_bridge, sh

pytestmark = pytest.mark.root

PERIOD = 0.5


async def shows(check: str, netns: str, needle: str, present: bool, within: float) -> None:
    """Until ``needle`` is (or is not) in the output of the command ``check`` in ``netns``."""
    await eventually(
        lambda: (needle in sh(*check.split(), netns=netns, check=False)) == present,
        within,
        interval=0.05,
        what=f"{check!r}: {needle!r} present={present}",
    )


async def test_hand_removed_state_returns_within_a_period(netns: str):
    add_bridge(netns, "eth0", "192.168.1.11/24")
    add_bridge(netns, "flannel.1", "10.16.11.0/32")
    model = cloud_and_edge()
    store = ModelStore(model)
    loop = driver.Reconciler(store, "edge-2", L3Settings(reconcile_period=PERIOD), netns)
    task = asyncio.create_task(loop.run(), name="l3-reconciler-test")
    try:
        routes = "ip route show table 9027"
        await shows(routes, netns, "10.16.0.0/23", True, within=5)

        sh("ip", "route", "del", "10.16.0.0/23", "table", "9027", netns=netns)
        sh("iptables", "-t", "nat", "-F", "RAVEN-POSTROUTING", netns=netns)
        await shows(routes, netns, "10.16.0.0/23", True, within=PERIOD * 2 + 1)
        await shows(
            "iptables -t nat -S RAVEN-POSTROUTING", netns, "-j ACCEPT", True, within=PERIOD * 2 + 1
        )

        # A new node in the cloud gateway: its subnet is routed right away.
        store.update(
            Model.build(
                [*model.nodes.values(), node("cloud-3", "10.0.0.3", "gw-cloud", "10.16.7.0/24")],
                model.gateways.values(),
            )
        )
        await shows(routes, netns, "10.16.7.0/24", True, within=PERIOD * 2 + 1)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert loop.passes >= 3
