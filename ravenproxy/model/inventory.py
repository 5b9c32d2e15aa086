"""The embedded default source: a multi-document YAML file of Kubernetes-shaped objects.

Accepts ``kind: Node``, ``kind: Gateway``, ``kind: Pod`` documents and ``kind: List`` documents
holding them (what ``kubectl get nodes,gateways -o yaml`` prints). Other kinds are ignored with a
debug log line; anything malformed is an :class:`InventoryError` naming the document and field.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from ravenproxy.errors import InventoryError
from ravenproxy.log import kv
from ravenproxy.model.objects import Gateway, Node, Pod
from ravenproxy.model.parse import parse_gateway, parse_node, parse_pod
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)


def _documents(docs: list[Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise InventoryError(f"document {i}: expected a mapping, got {type(doc).__name__}")
        kind = doc.get("kind")
        if kind == "List" or (isinstance(kind, str) and kind.endswith("List")):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise InventoryError(f"document {i}: items: expected a list")
            for j, item in enumerate(items):
                if not isinstance(item, Mapping):
                    raise InventoryError(f"document {i}: items[{j}]: expected a mapping")
                yield f"document {i} item {j}", item
        else:
            yield f"document {i}", doc


def parse_inventory(text: str, origin: str = "<inventory>") -> Model:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise InventoryError(f"{origin}: not valid YAML: {exc}") from None
    nodes: dict[str, Node] = {}
    gateways: dict[str, Gateway] = {}
    pods: dict[tuple[str, str], Pod] = {}
    try:
        documents = list(_documents(docs))
    except InventoryError as exc:
        raise InventoryError(f"{origin}: {exc}") from None
    for where, doc in documents:
        kind = doc.get("kind")
        try:
            if kind == "Node":
                node = parse_node(doc)
                if node.name in nodes:
                    raise InventoryError(f"Node {node.name}: defined twice")
                nodes[node.name] = node
            elif kind == "Gateway":
                gw = parse_gateway(doc)
                if gw.name in gateways:
                    raise InventoryError(f"Gateway {gw.name}: defined twice")
                gateways[gw.name] = gw
            elif kind == "Pod":
                pod = parse_pod(doc)
                pods[(pod.namespace, pod.name)] = pod
            elif kind is None:
                raise InventoryError("kind is missing")
            else:
                log.debug("inventory: ignoring object", extra=kv(kind=kind, where=where))
        except InventoryError as exc:
            raise InventoryError(f"{origin}: {where}: {exc}") from None
    return Model.build(nodes.values(), gateways.values(), pods.values())


def load_inventory(path: str | os.PathLike[str]) -> Model:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InventoryError(f"{p}: cannot read inventory: {exc.strerror or exc}") from None
    return parse_inventory(text, str(p))


class InventoryWatcher:
    """Reloads the inventory into a store when the file changes (mtime, size or inode).

    A file that fails to parse is logged and ignored: the last good model stays in force, so a
    half-written edit never takes routing down.
    """

    def __init__(self, path: str | os.PathLike[str], store: ModelStore, interval: float = 1.0):
        self.path = Path(path)
        self.store = store
        self.interval = interval
        self._stamp = self._read_stamp()

    def _read_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load_initial(self) -> Model:
        model = load_inventory(self.path)
        self._stamp = self._read_stamp()
        self.store.update(model)
        return model

    def check(self) -> bool:
        """Reload if the file changed; return whether a new model was published."""
        stamp = self._read_stamp()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            model = load_inventory(self.path)
        except InventoryError as exc:
            log.error("inventory reload failed, keeping the last good one", extra=kv(error=exc))
            return False
        self.store.update(model)
        log.info(
            "inventory reloaded",
            extra=kv(nodes=len(model.nodes), gateways=len(model.gateways), path=self.path),
        )
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()
