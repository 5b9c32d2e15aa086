"""Leader election: which controller replica may write, held through a ``coordination.k8s.io``
Lease by kubernetes_asyncio's leader election.

A replica that cannot renew stops writing within ``renew_deadline``, before the Lease it held can
expire for the other one; every write checks :func:`lead`'s event
(:class:`~ravenproxy.controller.writer.KubeWriter`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.leaderelection.electionconfig import Config as ElectionConfig
from kubernetes_asyncio.leaderelection.leaderelection import LeaderElection
from kubernetes_asyncio.leaderelection.resourcelock.leaselock import LeaseLock

from ravenproxy.log import kv

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaderSettings:
    """The Lease and its timing (client-go's rule: lease_duration > renew_deadline >
    1.2 * retry_period >= 1.2)."""

    name: str
    namespace: str
    identity: str
    lease_duration: float
    renew_deadline: float
    retry_period: float


async def lead(
    api: k8s_client.ApiClient,
    settings: LeaderSettings,
    leading: asyncio.Event,
    on_change: Callable[[bool], None] = lambda _: None,
) -> None:
    """Hold ``leading`` set exactly while this replica holds the Lease; campaign forever.
    ``on_change(True)`` when it becomes leader, ``on_change(False)`` when it stops being one
    (the metrics).

    The work itself is not run by the library's callback (its task would outlive a cancelled
    election); the callbacks only flip ``leading``, which the reconciler and every write check.
    """

    async def started() -> None:
        log.info("controller: became leader", extra=kv(identity=settings.identity))
        leading.set()
        on_change(True)

    async def stopped() -> None:
        lost()
        log.warning("controller: lost leadership", extra=kv(identity=settings.identity))

    def lost() -> None:
        if leading.is_set():
            leading.clear()
            on_change(False)

    while True:
        lock = LeaseLock(settings.name, settings.namespace, settings.identity, api)
        config = ElectionConfig(
            lock,
            # Whole seconds: the library writes str(lease_duration) into the record and its
            # LeaseLock int()s it back (leaseDurationSeconds); "15.0" made every round fail.
            math.ceil(settings.lease_duration),
            settings.renew_deadline,
            settings.retry_period,
            started,
            stopped,
        )
        try:
            await LeaderElection(config).run()
        except (ApiException, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            log.warning("controller: leader election failed, retrying", extra=kv(error=exc))
        finally:
            lost()
        await asyncio.sleep(settings.retry_period)
