"""Feeding a process's model: from the YAML inventory, or from the Kubernetes API.

:func:`model_source` is the one entry point every command uses (server, agent, controller, dns,
routes; a one-shot command reads it once through :func:`model_once`), so "one model, two
sources" holds everywhere: nothing downstream knows which source fed the
store. It lives with the Kubernetes plumbing rather than in :mod:`ravenproxy.model` because its
Kubernetes branch builds on that plumbing, which builds on the model. That branch imports the
Kubernetes client when it runs, so importing this module costs an inventory-fed process nothing;
the inventory branch imports the YAML reader when it runs, likewise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ravenproxy.errors import InventoryError
from ravenproxy.log import kv
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s_client

    from ravenproxy.kube.model import KubeSource
    from ravenproxy.kube.reflector import WatchSettings
    from ravenproxy.kube.rest import RestClient

log = logging.getLogger(__name__)


class ModelFeed:
    """What :func:`model_source` yields beside the store it keeps current.

    Most callers need only the store. The controller needs two things more, and takes them from
    here so that its model and what goes with it come down one path: when the first complete
    model is in (:attr:`synced`, for a source started without waiting), and the Calico block
    affinities (:meth:`block_affinities`), which change Gateway status subnets but are not part
    of the model. :meth:`wait` lets a caller's task group end when the source fails.
    """

    def __init__(
        self, task: asyncio.Task[None] | None = None, source: KubeSource | None = None
    ) -> None:
        self._task = task
        self._source = source
        if source is not None:
            self.synced = source.synced
        else:
            self.synced = asyncio.Event()
            self.synced.set()  # an inventory is loaded before the block starts

    def block_affinities(self) -> dict[str, list[str]] | None:
        """Confirmed Calico blocks per node; None for an inventory, when not watched, and when
        this is not a Calico cluster (then status subnets are the nodes' podCIDRs)."""
        return self._source.block_affinities() if self._source is not None else None

    async def wait(self) -> None:
        """Until the source stops following the model: never while it works; raises what ended
        it (a source that is not following returns at once)."""
        if self._task is not None:
            await asyncio.shield(self._task)


@contextlib.asynccontextmanager
async def model_source(
    store: ModelStore,
    *,
    inventory: str | os.PathLike[str] | None = None,
    interval: float = 1.0,
    kube: bool = False,
    kubeconfig: str | os.PathLike[str] | None = None,
    api: RestClient | k8s_client.ApiClient | None = None,
    pods: bool = False,
    calico_blocks: bool = False,
    watch: WatchSettings | None = None,
    follow: bool = True,
    sync_timeout: float | None = 60.0,
) -> AsyncIterator[ModelFeed]:
    """Fill ``store`` and keep it current until the block ends.

    The inventory file is loaded before the block starts and checked every ``interval`` seconds.
    ``kube`` (or an ``api`` client, which stays the caller's) reads Nodes, Gateways, Pods if
    ``pods``, Calico blocks if ``calico_blocks``, with list-then-watch through ``kubeconfig`` or
    the in-cluster service account. The first complete model is in place when the block starts,
    unless ``sync_timeout`` is None (then :attr:`ModelFeed.synced` says when); a source that has
    not listed everything within ``sync_timeout`` seconds is an InventoryError. ``follow=False``
    reads the model once and watches nothing (a dry run).
    """
    if api is None and not kube:
        if not inventory:
            raise InventoryError("no model source: give --inventory or --kube-model")
        # Loaded by a process given an inventory only (its YAML is parsed in a child).
        from ravenproxy.model.inventory import InventoryWatcher

        watcher = InventoryWatcher(inventory, store, interval)
        await watcher.start()
        if not follow:
            yield ModelFeed()
            return
        task = asyncio.create_task(watcher.run(), name="model-inventory-watch")
        try:
            yield ModelFeed(task)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return

    # The Kubernetes plumbing is loaded here, for the Kubernetes branch only: a process fed by
    # an inventory never imports it. It is our own REST client (kubernetes_asyncio and aiohttp,
    # ~48 MB, only come with a kubernetes_asyncio ``api`` a caller passes in).
    from ravenproxy.kube.model import KubeSource
    from ravenproxy.kube.rest import connect

    owned = api is None
    if api is None:
        api = connect(kubeconfig)
    try:
        source = KubeSource(api, store, watch, pods=pods, calico_blocks=calico_blocks)
        async with _following(source, follow, sync_timeout) as feed:
            yield feed
    finally:
        if owned:
            await api.close()


async def model_once(inventory: str | os.PathLike[str]) -> Model:
    """The model of the inventory as it is now, for a one-shot command (a route plan, a doctor
    run, a dry run): :func:`model_source` read once, followed no further, parsed off the event
    loop."""
    store = ModelStore()
    async with model_source(store, inventory=inventory, follow=False):
        return store.model


@contextlib.asynccontextmanager
async def _following(
    source: KubeSource, follow: bool, sync_timeout: float | None
) -> AsyncIterator[ModelFeed]:
    if not follow:
        await source.list_once()
        yield ModelFeed(source=source)
        return
    task = asyncio.create_task(source.run(), name="model-kube-source")
    try:
        if sync_timeout is not None:
            synced = asyncio.ensure_future(source.synced.wait())
            await asyncio.wait(
                {synced, task}, timeout=sync_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            synced.cancel()
            if not source.synced.is_set():
                failure = task.exception() if task.done() else None
                why = str(failure) if failure else f"no complete list within {sync_timeout:g}s"
                raise InventoryError(f"Kubernetes model source: {why}")
            model = source.store.model
            log.info(
                "model from Kubernetes",
                extra=kv(nodes=len(model.nodes), gateways=len(model.gateways)),
            )
        yield ModelFeed(task, source)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
