"""The embedded default source: a multi-document YAML file of Kubernetes-shaped objects.

Accepts ``kind: Node``, ``kind: Gateway``, ``kind: Pod`` documents and ``kind: List`` documents
holding them (what ``kubectl get nodes,gateways -o yaml`` prints). Other kinds are ignored with a
debug log line; anything malformed is an :class:`InventoryError` naming the document and field.

An async load (:func:`aload_inventory`: the watcher of the agent, the server, dns; every
``model_source``) reads the file in the process (a worker thread: ``/dev/stdin`` and a shell's
``<(...)`` are ours to read) and parses its YAML in a short-lived child, ``python -m
ravenproxy.model.inventory PATH`` given the text on its stdin, which hands back the documents
pickled (or the refusal, the same line as in-process): PyYAML, ~0.8 MB of an idle agent, is
never imported by a long-running process (issue 15). The model is built from the documents in
the process, in a worker thread. Blocking callers load in-process (:func:`load_inventory`,
:func:`parse_inventory`).
"""

from __future__ import annotations

import _pickle  # pickle's own C half: the documents' one reader and writer, without pickle.py
import asyncio
import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ravenproxy.children import failure, run_module
from ravenproxy.errors import ChildError, InventoryError
from ravenproxy.log import kv
from ravenproxy.model.limits import MAX_INVENTORY_BYTES
from ravenproxy.model.objects import Gateway, Node, Pod
from ravenproxy.model.parse import parse_gateway, parse_node, parse_pod
from ravenproxy.model.quote import brief, one_line
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore
from ravenproxy.ticks import look_every

log = logging.getLogger(__name__)

__all__ = [
    "MAX_INVENTORY_BYTES",
    "InventoryWatcher",
    "aload_inventory",
    "load_inventory",
    "model_of",
    "parse_inventory",
    "read_documents",
    "read_inventory_text",
]

TIMEOUT = 300.0
"""Longest a child may take to read an inventory: one of 16 MiB (~32 000 Nodes as kubectl prints
them) takes ~13 s here, as in-process."""
_CHILD = "ravenproxy.model.inventory"  # this module, run by main()


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


def _yaml_documents(text: str, origin: str) -> list[Any]:
    # PyYAML with it: imported by a process that parses YAML itself (a one-shot command, the
    # child of a long-running one), not by every one that reads an inventory.
    import yaml

    from ravenproxy.model import safeyaml

    try:
        return safeyaml.load_all(text)
    except safeyaml.YAMLLimitError as exc:
        raise InventoryError(f"{origin}: {exc}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"{origin}: not valid YAML: {safeyaml.describe(exc)}") from None


def parse_inventory(text: str, origin: str = "<inventory>") -> Model:
    """The model of an inventory's text, or :class:`InventoryError` with a one-line reason that
    starts with ``origin`` (see :mod:`ravenproxy.model.safeyaml` for the limits)."""
    return model_of(_yaml_documents(text, origin), origin)


def model_of(docs: list[Any], origin: str) -> Model:
    """The model of an inventory's YAML documents (:func:`parse_inventory` after the parse)."""
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


@contextlib.contextmanager
def _bounded(p: Path) -> Iterator[None]:
    try:
        yield
    except (RecursionError, MemoryError) as exc:
        # Only reachable through a path the limits do not cover; still a refusal, not a crash.
        raise InventoryError(f"{p}: too complex to load ({type(exc).__name__})") from None


def read_documents(path: str | os.PathLike[str]) -> list[Any]:
    """The file's YAML documents (safe types only); any problem is an InventoryError with a
    one-line reason naming the file."""
    p = Path(path)
    return _documents_of(read_inventory_text(p), p)


def _documents_of(text: str, p: Path) -> list[Any]:
    with _bounded(p):
        return _yaml_documents(text, str(p))


def load_inventory(path: str | os.PathLike[str]) -> Model:
    """Read and parse the inventory file; any problem is an InventoryError with a one-line
    reason naming the file. Blocking and CPU-bound: async callers use :func:`aload_inventory`."""
    p = Path(path)
    docs = read_documents(p)
    with _bounded(p):
        return model_of(docs, str(p))


async def aload_inventory(path: str | os.PathLike[str]) -> Model:
    """:func:`load_inventory` with the file read in a worker thread, its YAML parsed in a child
    (``python -m ravenproxy.model.inventory PATH``, the text on its stdin: PyYAML never resident
    here) and the model built in a worker thread: a parse of many megabytes takes seconds, and
    the event loop must keep answering (agents' PINGs, health checks) meanwhile. The same
    refusals as in-process; a child that cannot run, crashes, takes longer than
    :data:`TIMEOUT` or answers what cannot be read is one too."""
    p = Path(path)
    text = await asyncio.to_thread(read_inventory_text, p)
    try:
        status, out, err = await run_module(
            "inventory reader", _CHILD, (os.fspath(p),), TIMEOUT, text.encode()
        )
    except ChildError as exc:
        raise InventoryError(f"{p}: {exc}") from None
    if status != 0:
        raise InventoryError(f"{p}: {failure('inventory reader', status, err)}")
    return await asyncio.to_thread(_model_of_answer, out, p)


_TRAILER = b"\nravenproxy.model.inventory answer\n"
"""What ends the child's output, after its answer and the answer's length (8 bytes, big-endian):
whatever the interpreter printed before the answer (a user's ``sitecustomize``) is skipped."""
_LENGTH = 8


def _model_of_answer(out: bytes, p: Path) -> Model:
    """The model of the child's answer (:func:`_answer`, framed by :func:`_framed`), unpickled a
    piece at a time: one ``loads`` of a 16 MiB inventory's documents would hold the GIL for
    ~0.6 s. Output that does not hold a whole answer is a refusal."""
    end = len(out) - len(_TRAILER) - _LENGTH
    size = int.from_bytes(out[end : end + _LENGTH]) if end >= 0 else -1
    if not out.endswith(_TRAILER) or not 0 <= size <= end:
        raise InventoryError(f"{p}: inventory reader: no answer in its output ({len(out)} bytes)")
    answer = io.BytesIO(out)  # shares the bytes: no copy
    answer.seek(end - size)
    pieces = _pickle.Unpickler(answer)
    try:
        count: int | str = pieces.load()
        docs = []
        if isinstance(count, int):
            for _ in range(count):
                for _ in range(pieces.load()):
                    pieces.load()  # an item of a List: its document refers to it (shared memo)
                docs.append(pieces.load())
    except Exception as exc:  # of any type the unpickler meets in bytes that are not an answer
        raise InventoryError(
            f"{p}: inventory reader: its answer cannot be read ({type(exc).__name__})"
        ) from None
    if isinstance(count, str):  # the child's refusal, as read_documents raised it
        raise InventoryError(count)
    if not isinstance(count, int) or answer.tell() != end:
        raise InventoryError(f"{p}: inventory reader: its answer cannot be read (its length)")
    with _bounded(p):
        return model_of(docs, str(p))


_LEVEL_BYTES = 512
"""C stack a level of pickling takes at most: ~130 to ~260 bytes measured (lists, mappings; a
thread of 1 MiB pickles 4 000 levels, not 8 000)."""


def _answer(text: str, origin: str) -> bytes:
    """The child's answer: the documents of ``text`` as pickled pieces, one pickler
    (references to what was sent before, shared objects stay shared): their count; for each
    document, the count of its ``items`` (a List's), each item, the document. Its refusal, an
    InventoryError's line, instead."""
    from ravenproxy.model import safeyaml  # PyYAML with it: the child parses

    try:
        docs = _documents_of(text, Path(origin))
    except InventoryError as exc:
        return _pickle.dumps(str(exc), protocol=5)
    # Pickling recurses a level per level of nesting it meets, aliases included: a chain of
    # aliases met from its deep end (duplicate or merge keys reorder a mapping) is as deep as
    # it expands. Within safeyaml's limits, a path goes through a document's own nesting
    # (MAX_DEPTH) and what its counted aliases expand to (MAX_ALIAS_NODES in all); an alias
    # of a node still open leads back into text already nested within MAX_DEPTH. The pickling
    # is given that many levels and a margin, in a thread whose stack holds them all
    # (_LEVEL_BYTES a level: ~50 MiB reserved, touched only as deep as the data goes): a
    # deeper graph is a RecursionError (a refusal, "too complex"), never a crash of the C
    # stack. A level counts twice against the recursion limit (3.11's _pickle: save() and
    # the container's batch each enter a recursive call; a tuple counts once: 2 * levels of
    # them fit in the stack too, checked).
    levels = safeyaml.MAX_DEPTH + safeyaml.MAX_ALIAS_NODES + 1000  # and the frames below
    answer: list[bytes] = []
    limit, stack = sys.getrecursionlimit(), threading.stack_size(levels * _LEVEL_BYTES + 2**20)
    sys.setrecursionlimit(2 * levels)
    try:
        pickling = threading.Thread(target=lambda: answer.append(_pickled(docs, origin)))
        pickling.start()
        pickling.join()
    finally:  # for a caller other than the child (tests)
        sys.setrecursionlimit(limit)
        threading.stack_size(stack)
    return answer[0]


def _pickled(docs: list[Any], origin: str) -> bytes:
    data = io.BytesIO()
    pieces = _pickle.Pickler(data, protocol=5)
    try:
        with _bounded(Path(origin)):
            pieces.dump(len(docs))
            for doc in docs:
                items = doc.get("items") if isinstance(doc, dict) else None
                items = items if isinstance(items, list) else []
                pieces.dump(len(items))
                for item in items:
                    pieces.dump(item)
                pieces.dump(doc)
    except InventoryError as exc:
        return _pickle.dumps(str(exc), protocol=5)
    return data.getvalue()


def main(argv: Sequence[str]) -> int:
    """``python -m ravenproxy.model.inventory PATH``: the documents of the text on stdin
    (``PATH`` names it in messages), pickled on stdout (:func:`_answer`), then the answer's
    length and :data:`_TRAILER`. Run by :func:`aload_inventory`, so that PyYAML lives in a
    short-lived child."""
    if len(argv) != 1:
        print("usage: python -m ravenproxy.model.inventory PATH < TEXT", file=sys.stderr)
        return 2
    data = sys.stdin.buffer.read()
    output = _framed(data.decode("utf-8"), argv[0])  # UTF-8: read_inventory_text checked it
    sys.stdout.flush()  # what was printed before (a sitecustomize) goes before the answer
    sys.stdout.buffer.write(output)
    sys.stdout.flush()
    return 0


def _framed(text: str, origin: str) -> bytes:
    """:func:`_answer`, its length and :data:`_TRAILER`: the child's output."""
    answer = _answer(text, origin)
    return answer + len(answer).to_bytes(_LENGTH) + _TRAILER


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
