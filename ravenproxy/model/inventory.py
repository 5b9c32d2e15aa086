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
from ravenproxy.model import safeyaml
from ravenproxy.model.objects import Gateway, Node, Pod
from ravenproxy.model.parse import parse_gateway, parse_node, parse_pod
from ravenproxy.model.quote import brief, one_line
from ravenproxy.model.safeyaml import MAX_INVENTORY_BYTES
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore
from ravenproxy.ticks import look_every

log = logging.getLogger(__name__)

__all__ = [
    "MAX_INVENTORY_BYTES",
    "InventoryWatcher",
    "aload_inventory",
    "load_inventory",
    "parse_inventory",
    "read_inventory_text",
]


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
    """The model of an inventory's text, or :class:`InventoryError` with a one-line reason that
    starts with ``origin`` (see :mod:`ravenproxy.model.safeyaml` for the limits)."""
    try:
        docs = safeyaml.load_all(text)
    except safeyaml.YAMLLimitError as exc:
        raise InventoryError(f"{origin}: {exc}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"{origin}: not valid YAML: {safeyaml.describe(exc)}") from None
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
                gw = parse_gateway(doc, strict=True)
                if gw.name in gateways:
                    raise InventoryError(f"Gateway {gw.name}: defined twice")
                gateways[gw.name] = gw
            elif kind == "Pod":
                pod = parse_pod(doc)
                pods[(pod.namespace, pod.name)] = pod
            elif kind is None:
                raise InventoryError("kind is missing")
            else:
                log.debug("inventory: ignoring object", extra=kv(kind=brief(kind), where=where))
        except InventoryError as exc:
            raise InventoryError(f"{origin}: {where}: {one_line(str(exc))}") from None
    return Model.build(nodes.values(), gateways.values(), pods.values())


def read_inventory_text(path: str | os.PathLike[str]) -> str:
    """The file's text: at most :data:`MAX_INVENTORY_BYTES` bytes of UTF-8, else InventoryError."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            # Read one byte past the limit: a file still growing after fstat is caught too.
            data = b"" if size > MAX_INVENTORY_BYTES else f.read(MAX_INVENTORY_BYTES + 1)
    except OSError as exc:
        raise InventoryError(f"{p}: cannot read inventory: {exc.strerror or exc}") from None
    if size > MAX_INVENTORY_BYTES or len(data) > MAX_INVENTORY_BYTES:
        raise InventoryError(
            f"{p}: larger than the limit of {MAX_INVENTORY_BYTES // 2**20} MiB "
            f"({max(size, len(data))} bytes)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InventoryError(
            f"{p}: not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line})"
        ) from None


def load_inventory(path: str | os.PathLike[str]) -> Model:
    """Read and parse the inventory file; any problem is an InventoryError with a one-line
    reason naming the file. Blocking and CPU-bound: async callers use :func:`aload_inventory`."""
    p = Path(path)
    text = read_inventory_text(p)
    try:
        return parse_inventory(text, str(p))
    except (RecursionError, MemoryError) as exc:
        # Only reachable through a path the limits do not cover; still a refusal, not a crash.
        raise InventoryError(f"{p}: too complex to load ({type(exc).__name__})") from None


async def aload_inventory(path: str | os.PathLike[str]) -> Model:
    """:func:`load_inventory` in a worker thread: a parse of many megabytes takes seconds, and
    the event loop must keep answering (agents' PINGs, health checks) meanwhile."""
    return await asyncio.to_thread(load_inventory, path)


class InventoryWatcher:
    """Reloads the inventory into a store when the file changes (mtime, size or inode).

    A file that cannot be loaded is refused with one log line naming the file and the reason,
    and the last good model stays in force, so a half-written or hostile edit never takes
    routing down; the watch goes on, and the next change is loaded. The async paths parse in a
    worker thread (:func:`aload_inventory`).
    """

    def __init__(self, path: str | os.PathLike[str], store: ModelStore, interval: float = 1.0):
        self.path = Path(path)
        # Encoded once: a Path costs two Python calls a stat, a str an encoding (once a second).
        self._name = os.fsencode(self.path)
        self.store = store
        self.interval = interval
        self.refused = 0  # edits refused since start (tests and diagnostics read it)
        self._stamp = self._read_stamp()

    def _read_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self._name)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load_initial(self) -> Model:
        """The first load (blocking); InventoryError when the file cannot be used."""
        self._stamp = self._read_stamp()
        model = load_inventory(self.path)
        self.store.update(model)
        return model

    async def start(self) -> Model:
        """:meth:`load_initial` with the parse in a worker thread."""
        self._stamp = self._read_stamp()
        model = await aload_inventory(self.path)
        self.store.update(model)
        return model

    def _changed(self) -> bool:
        # The stamp is taken before the read: an edit landing during the read is seen next time.
        stamp = self._read_stamp()
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        return True

    def check(self) -> bool:
        """Reload if the file changed; return whether a new model was published (blocking)."""
        if not self._changed():
            return False
        try:
            model = load_inventory(self.path)
        except InventoryError as exc:
            self._refused(exc)
            return False
        return self._publish(model)

    async def poll(self) -> bool:
        """:meth:`check` with the parse in a worker thread."""
        if not self._changed():
            return False
        return await self._reload()

    async def _reload(self) -> bool:
        try:
            model = await aload_inventory(self.path)
        except InventoryError as exc:
            self._refused(exc)
            return False
        return self._publish(model)

    def _refused(self, exc: InventoryError) -> None:
        self.refused += 1
        reason = str(exc).removeprefix(f"{self.path}: ")  # the path is its own field
        log.error(
            "inventory edit refused, keeping the last good model",
            extra=kv(path=self.path, reason=one_line(reason)),
        )

    def _publish(self, model: Model) -> bool:
        self.store.update(model)
        log.info(
            "inventory reloaded",
            extra=kv(nodes=len(model.nodes), gateways=len(model.gateways), path=self.path),
        )
        return True

    async def run(self) -> None:
        """Poll every ``interval`` until cancelled. Never ends on its own: whatever one poll
        raises is logged on one line and the next poll goes on. The file's stat is looked at
        from a timer callback (:func:`ravenproxy.ticks.look_every`: no task step a look);
        the task wakes only to reload a changed file."""
        while True:
            try:
                await look_every(self.interval, self._changed)
                await self._reload()
            except Exception as exc:  # a bug must not end the watch; say what it was
                log.error(
                    "inventory reload failed, keeping the last good model",
                    extra=kv(path=self.path, error=one_line(f"{type(exc).__name__}: {exc}")),
                )
