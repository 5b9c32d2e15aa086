"""Agent liveness as the servers report it, turned into :class:`Health` for the election.

Two sources, one rule ("an agent not reported for longer than ``grace`` is gone"):

- :class:`AgentLeases` (Kubernetes): watches the agent Leases the servers publish (names in
  :mod:`ravenproxy.kube.leases`). Time is our own: a Lease counts as renewed when we *observe*
  its ``renewTime`` change (client-go's leader election does the same), so clock skew between a
  server and the controller never moves a failover. A released or deleted Lease is
  the agent leaving, seen now.
- :class:`AgentPoller` (inventory, or servers without API access): polls each server's
  ``GET /agents``; an agent is seen at every successful poll that lists it. A server that stops
  answering stops vouching for its agents, which expire after ``grace`` like any other.

While nobody reports agents at all (no Lease ever seen: servers run without API access) the
Lease source answers :meth:`Health.ready_only`, so installing the controller alone never fails
every edge gateway over.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s_client

from ravenproxy.controller.election import DEFAULT_GRACE, Health
from ravenproxy.kube.leases import LABEL_SELECTOR, NAMESPACE, lease_node
from ravenproxy.kube.reflector import Reflector, WatchSettings
from ravenproxy.log import kv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Observed:
    holder: str
    renew_time: str


class LeaseTracker:
    """Pure bookkeeping of observed agent Leases (the caller supplies the clock)."""

    def __init__(self, since: float, grace: float = DEFAULT_GRACE) -> None:
        self.since = since
        self.grace = grace
        self._observed: dict[str, _Observed] = {}
        self._last_seen: dict[str, float] = {}
        self.any_seen = False

    def observe(self, leases: Sequence[Mapping[str, Any]], now: float) -> None:
        """The full current set of agent Leases, as the watch cache holds it now."""
        current: dict[str, _Observed] = {}
        for lease in leases:
            spec = lease.get("spec") or {}
            current[lease_node(lease)] = _Observed(
                str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or "")
            )
        if current:
            self.any_seen = True
        for node, obs in current.items():
            prev = self._observed.get(node)
            if obs.holder:
                if prev is None or prev != obs:
                    # A renewal (or a first sight: a stale Lease gets one grace period from
                    # now, as an agent never seen gets one from the controller's start).
                    self._last_seen[node] = now
            elif prev is None:
                # Released before we looked: as good as never seen.
                self._last_seen.setdefault(node, self.since)
            elif prev.holder:
                self._last_seen[node] = now  # released just now
        for node, prev in self._observed.items():
            if node not in current and prev.holder:
                self._last_seen[node] = now  # deleted while held
        self._observed = current

    def snapshot(self) -> Health:
        if not self.any_seen:
            return Health.ready_only()
        return Health(
            last_seen=MappingProxyType(dict(self._last_seen)), since=self.since, grace=self.grace
        )


class AgentLeases:
    """Watches the agent Leases into a :class:`LeaseTracker`; ``health`` is for the reconciler."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        grace: float = DEFAULT_GRACE,
        settings: WatchSettings | None = None,
        namespace: str = NAMESPACE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self.tracker = LeaseTracker(clock(), grace)
        self.reflector = Reflector(
            "agent-leases",
            k8s_client.CoordinationV1Api(api).list_namespaced_lease,
            self._changed,
            settings,
            namespace=namespace,
            label_selector=LABEL_SELECTOR,
        )

    def _changed(self) -> None:
        self.tracker.observe(list(self.reflector.objects.values()), self._clock())

    def health(self) -> Health:
        if not self.reflector.synced.is_set():
            return Health.ready_only()
        return self.tracker.snapshot()

    async def run(self) -> None:
        await self.reflector.run()


class AgentPoller:
    """Polls servers' ``GET /agents`` (``ravenproxy controller --agents-url``)."""

    def __init__(
        self,
        urls: Sequence[str],
        grace: float = DEFAULT_GRACE,
        interval: float | None = None,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.urls = tuple(urls)
        self.grace = grace
        # Several polls per grace period, so one slow or lost answer does not fail anything over.
        self.interval = interval if interval is not None else min(5.0, grace / 3)
        self.timeout = timeout
        self._clock = clock
        self.since = clock()
        self._last_seen: dict[str, float] = {}

    def record(self, nodes: Sequence[str], now: float) -> None:
        for node in nodes:
            self._last_seen[node] = now

    def health(self) -> Health:
        return Health(
            last_seen=MappingProxyType(dict(self._last_seen)), since=self.since, grace=self.grace
        )

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        for url in self.urls:
            try:
                async with session.get(url) as resp:
                    if resp.status != 200:
                        raise aiohttp.ClientResponseError(
                            resp.request_info, (), status=resp.status, message=resp.reason or ""
                        )
                    body = await resp.json(content_type=None)
                nodes = [str(a["node"]) for a in body["agents"]]
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                log.warning("agents: poll failed", extra=kv(url=url, error=exc))
                continue
            self.record(nodes, self._clock())

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(self.interval)


def agents_url(text: str) -> str:
    """``H:P`` (a server's ``--metrics-addr``) or a URL → the ``/agents`` URL of that server."""
    url = text if "://" in text else f"http://{text}"
    return url if url.rstrip("/").endswith("/agents") else url.rstrip("/") + "/agents"
