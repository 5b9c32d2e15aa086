"""Agent liveness, published by the server: one Lease per connected agent.

The controller fails an edge gateway over when its agent is gone (a dead tunnel behind a Ready
node is Raven's blind spot). Only the server knows which agents hold a tunnel, so it says so in
two ways:

- in Kubernetes, a ``coordination.k8s.io/v1`` Lease per connected agent,
  ``kube-system/ravenproxy-agent-<node>``: ``holderIdentity`` is this server (its pod name),
  ``renewTime`` is renewed every ``renew_interval`` seconds while the agent is connected, and the
  Lease is released (holder cleared) when it disconnects. A server that dies stops renewing, which
  the controller sees the same way. The controller watches these Leases; both ends take their
  names from :mod:`ravenproxy.kube.leases`;
- anywhere, ``GET /agents`` on the metrics address (:mod:`ravenproxy.server.agents`), for
  ``ravenproxy controller --agents-url`` and for people.

Two servers may briefly both hold a tunnel from one agent (it reconnects, or is balanced to
another replica). The Lease then follows client-go's leader-election rule: it is taken over only
when free or expired (``leaseDurationSeconds`` without renewal), so the servers never fight over it
and it stays held while either of them has the agent. Each write carries the resourceVersion it
read, so a lost race is a 409 and a re-read, never a silent overwrite.

The publisher polls the registry's connected set (cheap, in memory) every ``poll_interval``, so a
connect or disconnect reaches the API within about a second without a hook in the registry.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ravenproxy.kube.leases import (
    ANNOTATION_NODE,
    LABELS,
    LEASE_DURATION,
    NAMESPACE,
    RENEW_INTERVAL,
    default_identity,
    lease_name,
    micro_time,
    parse_time,
)
from ravenproxy.kube.rest import MERGE_PATCH, KubeError, RestClient, connect, resource_version
from ravenproxy.log import kv

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
_FAILED = (KubeError, OSError)
"""A call that failed (an answer that is not HTTP; a connection that failed or timed out): the
next round tries again. Error statuses are answers, handled where they come."""

log = logging.getLogger(__name__)


@dataclass
class _Held:
    resource_version: str
    renewed: float  # our clock, when we last renewed it


class LivenessPublisher:
    """Keeps one Lease per connected agent while this server has it. ``connected`` is the
    registry's ``connected_nodes``; ``run()`` until cancelled, then it releases what it holds."""

    def __init__(
        self,
        connected: Callable[[], Iterable[str]],
        api: RestClient,
        identity: str | None = None,
        namespace: str = NAMESPACE,
        renew_interval: float = RENEW_INTERVAL,
        lease_duration: int = LEASE_DURATION,
        poll_interval: float = 1.0,
        clock: Callable[[], float] = time.time,
        concurrency: int = 16,
    ) -> None:
        self._connected = connected
        self.concurrency = concurrency
        self._api = api
        self.identity = identity or default_identity()
        self.namespace = namespace
        self.renew_interval = renew_interval
        self.lease_duration = lease_duration
        self.poll_interval = poll_interval
        self._clock = clock
        self.held: dict[str, _Held] = {}
        # Connected nodes whose Lease another live server holds: when we last tried.
        self._deferred: dict[str, float] = {}

    def _spec(self, now: float) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_duration,
            "renewTime": micro_time(now),
        }

    def _path(self, node: str | None = None) -> str:
        path = LEASES.format(namespace=self.namespace)
        return path if node is None else f"{path}/{lease_name(node)}"

    async def _patch(self, node: str, rv: str, spec: Mapping[str, Any]) -> tuple[int, str]:
        status, body = await self._api.request(
            "PATCH",
            self._path(node),
            body={"metadata": {"resourceVersion": rv}, "spec": dict(spec)},
            content_type=MERGE_PATCH,
        )
        return status, resource_version(body)

    # -- one round -----------------------------------------------------------------------------
    async def sync(self) -> None:
        """Create or renew the Lease of every connected agent that is due; release the rest."""
        connected = set(self._connected())
        now = self._clock()
        for node in sorted(set(self.held) - connected):
            await self._release(node)
        for node in list(self._deferred):
            if node not in connected:
                del self._deferred[node]
        due: list[Awaitable[None]] = []
        for node in sorted(connected):
            held = self.held.get(node)
            if held is not None:
                if now - held.renewed >= self.renew_interval:
                    due.append(self._renew(node, held, now))
            elif now - self._deferred.get(node, -self.renew_interval) >= self.renew_interval:
                due.append(self._acquire(node, now))
        if due:
            # A few at a time: thousands of edge agents must not take a renewal interval each.
            limit = asyncio.Semaphore(self.concurrency)

            async def one(call: Awaitable[None]) -> None:
                async with limit:
                    try:
                        await call
                    except _FAILED as exc:
                        log.warning("liveness: lease write failed", extra=kv(error=exc))

            async with asyncio.TaskGroup() as tg:
                for call in due:
                    tg.create_task(one(call))

    async def _renew(self, node: str, held: _Held, now: float) -> None:
        status, rv = await self._patch(node, held.resource_version, self._spec(now))
        if status < 300:
            self.held[node] = _Held(rv, now)
            return
        # 409: someone wrote in between (another server took it over, or a person); 404: it
        # was deleted. Either way, start again from what is there.
        log.info("liveness: lost the lease, re-acquiring", extra=kv(node=node, status=status))
        del self.held[node]
        await self._acquire(node, now)

    async def _acquire(self, node: str, now: float) -> None:
        name = lease_name(node)
        status, body = await self._api.request("GET", self._path(node))
        if status == 404:
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "labels": dict(LABELS),
                    "annotations": {ANNOTATION_NODE: node},
                },
                "spec": {**self._spec(now), "acquireTime": micro_time(now), "leaseTransitions": 0},
            }
            status, body = await self._api.request("POST", self._path(), body=lease)
            if status < 300:
                self._took(node, resource_version(body), now)
            else:  # 409: another server created it first; look again next round.
                self._deferred[node] = now
            return
        if status >= 300:
            log.warning(
                "liveness: cannot read the lease",
                extra=kv(node=node, status=status, reason=body.get("message", "")),
            )
            self._deferred[node] = now
            return
        spec = body.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = parse_time(spec.get("renewTime")) or 0.0
        duration = spec.get("leaseDurationSeconds") or self.lease_duration
        if holder and holder != self.identity and now - renewed <= duration:
            # Another server has this agent too and keeps the Lease fresh: leave it.
            self._deferred[node] = now
            return
        new_spec = self._spec(now)
        if holder != self.identity:
            new_spec["acquireTime"] = micro_time(now)
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        status, rv = await self._patch(node, resource_version(body), new_spec)
        if status < 300:
            self._took(node, rv, now)
        else:
            self._deferred[node] = now

    def _took(self, node: str, rv: str, now: float) -> None:
        self.held[node] = _Held(rv, now)
        self._deferred.pop(node, None)
        log.info("liveness: holding the agent's lease", extra=kv(node=node, lease=lease_name(node)))

    async def _release(self, node: str) -> None:
        held = self.held.pop(node)
        # Clearing the holder (client-go's release) rather than deleting: the Lease keeps when
        # the agent went, and the controller sees the release as a change at once.
        status, _rv = await self._patch(
            node,
            held.resource_version,
            {"holderIdentity": None, "renewTime": micro_time(self._clock())},
        )
        log.info(
            "liveness: released the agent's lease",
            extra=kv(node=node, status=status if status >= 300 else "ok"),
        )

    async def release_all(self) -> None:
        for node in sorted(self.held):
            try:
                await self._release(node)
            except _FAILED as exc:
                log.warning("liveness: release failed", extra=kv(node=node, error=exc))

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Sync every ``poll_interval`` until cancelled; then release every held Lease (within a
        few seconds) so the controller learns at once rather than after the grace period."""
        try:
            while True:
                try:
                    await self.sync()
                except _FAILED as exc:
                    log.warning("liveness: sync failed, will retry", extra=kv(error=exc))
                await asyncio.sleep(self.poll_interval)
        finally:
            if self.held:
                with suppress(TimeoutError):
                    async with asyncio.timeout(5):
                        await self.release_all()


class KubeLiveness:
    """The server's hook: an API client (``kubeconfig``, or the in-cluster service account when
    None; our own REST client, so a server loads neither kubernetes_asyncio nor aiohttp for it)
    and a :class:`LivenessPublisher` task, started and stopped with the server."""

    def __init__(
        self,
        connected: Callable[[], Iterable[str]],
        kubeconfig: str | os.PathLike[str] | None = None,
        identity: str | None = None,
        **publisher_kwargs: Any,
    ) -> None:
        self._connected = connected
        self._kubeconfig = kubeconfig
        self._identity = identity
        self._kwargs = publisher_kwargs
        self._api: RestClient | None = None
        self._task: asyncio.Task[None] | None = None
        self.publisher: LivenessPublisher | None = None

    async def start(self) -> None:
        """Raises KubeConfigError when no API client can be made (bad kubeconfig, not in a
        cluster)."""
        self._api = connect(self._kubeconfig)
        self.publisher = LivenessPublisher(
            self._connected, self._api, self._identity, **self._kwargs
        )
        self._task = asyncio.create_task(self.publisher.run(), name="server-agent-liveness")
        log.info("liveness: publishing agent leases", extra=kv(identity=self.publisher.identity))

    async def stop(self) -> None:
        """Release every held Lease (a few seconds at most) and close the client."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._api is not None:
            await self._api.close()
            self._api = None
