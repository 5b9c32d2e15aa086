"""Feeding a process's model: from the YAML inventory, or from the Kubernetes API.

One entry point for the server and the agent, so "one model, two sources" holds for them as it
does for the controller: nothing downstream knows which source fed the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from ravenproxy.errors import InventoryError
from ravenproxy.log import kv
from ravenproxy.model.inventory import InventoryWatcher
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def model_source(
    store: ModelStore,
    *,
    inventory: str | None = None,
    kube: bool = False,
    kubeconfig: str | None = None,
    pods: bool = False,
    sync_timeout: float = 60.0,
) -> AsyncIterator[None]:
    """Fill ``store`` (the first model is in place when the block starts) and keep it current
    until the block ends. ``kube`` reads Nodes, Gateways (and Pods) with list-then-watch through
    ``kubeconfig`` or the in-cluster service account; otherwise the inventory file is watched."""
    task: asyncio.Task[None]
    if not kube:
        if not inventory:
            raise InventoryError("no model source: give --inventory or --kube-model")
        watcher = InventoryWatcher(inventory, store)
        await watcher.start()
        task = asyncio.create_task(watcher.run(), name="model-inventory-watch")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return

    from ravenproxy.controller.kube import KubeSource, new_api_client

    api = await new_api_client(Path(kubeconfig) if kubeconfig else None)
    try:
        source = KubeSource(api, store, pods=pods, calico_blocks=False)
        task = asyncio.create_task(source.run(), name="model-kube-source")
        try:
            synced = asyncio.ensure_future(source.synced.wait())
            await asyncio.wait(
                {synced, task}, timeout=sync_timeout, return_when=asyncio.FIRST_COMPLETED
            )
            synced.cancel()
            if not source.synced.is_set():
                failure = task.exception() if task.done() else None
                why = str(failure) if failure else f"no complete list within {sync_timeout:g}s"
                raise InventoryError(f"Kubernetes model source: {why}")
            log.info(
                "model from Kubernetes",
                extra=kv(nodes=len(store.model.nodes), gateways=len(store.model.gateways)),
            )
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    finally:
        await api.close()
