"""model_source over a real inventory file: the one way every command feeds its model."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from ravenproxy.errors import InventoryError
from ravenproxy.kube.sources import model_source
from ravenproxy.model.store import ModelStore

NODE = """\
apiVersion: v1
kind: Node
metadata: {{name: {name}, labels: {{raven.openyurt.io/gateway: gw}}}}
status:
  addresses: [{{type: InternalIP, address: 10.0.0.1}}]
  conditions: [{{type: Ready, status: "True"}}]
"""


def write(path: Path, *names: str, stamp: int = 1) -> None:
    path.write_text("---\n".join(NODE.format(name=n) for n in names))
    os.utime(path, ns=(stamp, stamp))  # the watcher sees a change even within one mtime tick


async def test_an_inventory_is_loaded_before_the_block_and_followed(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    write(path, "edge-1")
    store = ModelStore()
    async with model_source(store, inventory=path, interval=0.02) as feed:
        assert set(store.model.nodes) == {"edge-1"}
        assert feed.synced.is_set()
        assert feed.block_affinities() is None  # no Calico in an inventory
        write(path, "edge-1", "edge-2", stamp=2)
        await asyncio.wait_for(store.wait_changed(1), 5)
        assert set(store.model.nodes) == {"edge-1", "edge-2"}
        # The feed follows until the block ends: wait() does not return meanwhile.
        waiter = asyncio.create_task(feed.wait())
        await asyncio.sleep(0.1)
        assert not waiter.done()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


async def test_follow_false_reads_once(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    write(path, "edge-1")
    store = ModelStore()
    async with model_source(store, inventory=path, interval=0.02, follow=False) as feed:
        write(path, "edge-1", "edge-2", stamp=2)
        await feed.wait()  # nothing follows: returns at once
        await asyncio.sleep(0.1)
        assert set(store.model.nodes) == {"edge-1"}


async def test_a_broken_inventory_at_start_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("kind: Node\nmetadata: [not, a, mapping]\n")
    with pytest.raises(InventoryError, match=str(path)):
        async with model_source(ModelStore(), inventory=path):
            pass
