"""Agent Leases → Health, as data: the grace rule on observed renewals."""

from __future__ import annotations

from typing import Any

from ravenproxy.controller.agents import LeaseTracker
from ravenproxy.kube.leases import ANNOTATION_NODE, lease_name


def lease(node: str, holder: str = "server-a", renew: str = "t1") -> dict[str, Any]:
    return {
        "metadata": {"name": lease_name(node), "annotations": {ANNOTATION_NODE: node}},
        "spec": {"holderIdentity": holder, "renewTime": renew} if holder else {"renewTime": renew},
    }


def test_until_a_lease_is_seen_ready_alone_decides() -> None:
    tracker = LeaseTracker(since=100.0, grace=10)
    tracker.observe([], 101.0)
    assert not tracker.snapshot().tracks_agents
    tracker.observe([lease("edge-1")], 102.0)
    assert tracker.snapshot().tracks_agents


def test_renewals_keep_an_agent_alive_and_their_absence_expires_it() -> None:
    tracker = LeaseTracker(since=0.0, grace=10)
    tracker.observe([lease("edge-1", renew="t1")], 100.0)
    assert tracker.snapshot().agent_alive("edge-1", 110.0)
    # Another event for some other Lease: edge-1 unchanged, so not "seen" again.
    tracker.observe([lease("edge-1", renew="t1"), lease("edge-2")], 105.0)
    assert not tracker.snapshot().agent_alive("edge-1", 110.5)
    tracker.observe([lease("edge-1", renew="t2"), lease("edge-2")], 108.0)
    assert tracker.snapshot().agent_alive("edge-1", 118.0)
    assert not tracker.snapshot().agent_alive("edge-1", 118.5)


def test_a_release_starts_the_grace_period_at_once() -> None:
    tracker = LeaseTracker(since=0.0, grace=10)
    tracker.observe([lease("edge-1", renew="t1")], 100.0)
    tracker.observe([lease("edge-1", renew="t2")], 109.0)
    tracker.observe([lease("edge-1", holder="", renew="t3")], 110.0)
    health = tracker.snapshot()
    assert health.agent_alive("edge-1", 120.0)
    assert not health.agent_alive("edge-1", 120.5)
    # Staying released does not refresh it.
    tracker.observe([lease("edge-1", holder="", renew="t3"), lease("edge-2")], 115.0)
    assert not tracker.snapshot().agent_alive("edge-1", 120.5)


def test_a_lease_released_before_the_controller_started_counts_as_never_seen() -> None:
    tracker = LeaseTracker(since=100.0, grace=10)
    tracker.observe([lease("edge-1", holder="")], 105.0)
    health = tracker.snapshot()
    assert health.agent_alive("edge-1", 110.0)
    assert not health.agent_alive("edge-1", 110.5)
    assert not health.agent_alive("edge-9", 110.5)  # no Lease at all: the same rule


def test_a_deleted_held_lease_is_the_agent_leaving() -> None:
    tracker = LeaseTracker(since=0.0, grace=10)
    tracker.observe([lease("edge-1"), lease("edge-2")], 100.0)
    tracker.observe([lease("edge-2")], 107.0)
    health = tracker.snapshot()
    assert health.agent_alive("edge-1", 117.0)
    assert not health.agent_alive("edge-1", 117.5)


def test_a_new_holder_is_a_renewal() -> None:
    tracker = LeaseTracker(since=0.0, grace=10)
    tracker.observe([lease("edge-1", holder="server-a", renew="t1")], 100.0)
    tracker.observe([lease("edge-1", holder="server-b", renew="t1")], 108.0)
    assert tracker.snapshot().agent_alive("edge-1", 118.0)
