"""Loading untrusted YAML with bounded cost: size, nesting depth and alias expansion.

An inventory is edited by hand and reloaded by long-running processes, so a bad edit must cost
a one-line refusal, never the process. Three shapes of input are refused here before any object
is built from them:

- **over-size** text (:data:`MAX_INVENTORY_BYTES`): the time and memory of a parse grow with it;
- **deep nesting** (:data:`MAX_DEPTH` levels of mappings/sequences): PyYAML composes nodes
  recursively, and 10 000 ``[`` end in a ``RecursionError`` that no caller expects;
- **alias bombs** (:data:`MAX_ALIAS_NODES`): ``&a [x, x]``, ``&b [*a, *a]``, ... builds a small
  graph that every later walk (a repr in an error message, a copy) sees as 2**n nodes. The
  composer counts, for every alias, the nodes its target expands to; Kubernetes objects use no
  aliases at all, so the budget only has to leave room for hand-written ``<<: *defaults``.

Scanning and parsing run in libyaml when PyYAML has it (an order of magnitude faster than pure
Python), while composing stays in Python: that is where the limits are counted, and it gives the
interpreter a switch point per event, so a parse in a worker thread never holds the GIL for
long. Error messages are one line and never quote more than a few dozen characters of input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import Node
from yaml.resolver import Resolver

from ravenproxy.model.limits import MAX_INVENTORY_BYTES
from ravenproxy.model.quote import one_line

__all__ = [
    "LIBYAML",
    "MAX_ALIAS_NODES",
    "MAX_DEPTH",
    "MAX_INVENTORY_BYTES",
    "YAMLLimitError",
    "describe",
    "load_all",
]
MAX_DEPTH = 100
"""Deepest nesting of mappings and sequences; Kubernetes objects (managedFields included) stay
far below 30, and 100 keeps the recursive composer well inside Python's recursion limit."""
MAX_ALIAS_NODES = 100_000
"""Most nodes that all aliases of one document may expand to, together."""


class YAMLLimitError(yaml.YAMLError):
    """The text exceeds one of the limits above."""


def describe(exc: yaml.YAMLError) -> str:
    """A YAML error as ``line L column C: problem``, without PyYAML's multi-line snippet."""
    if isinstance(exc, yaml.MarkedYAMLError):
        parts = []
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            parts.append(f"line {mark.line + 1} column {mark.column + 1}:")
        if exc.context:
            parts.append(f"{exc.context},")
        parts.append(exc.problem or "invalid YAML")
        return one_line(" ".join(parts))
    return one_line(str(exc))


def _line(event: Any) -> str:
    mark = event.start_mark
    return f"line {mark.line + 1}" if mark is not None else "somewhere"


class _GuardedComposer(Composer):
    """PyYAML's composer with the depth and alias-expansion limits counted as nodes arrive."""

    if TYPE_CHECKING:  # provided by the parser half of the loader (libyaml or Python)

        def check_event(self, *choices: Any) -> bool: ...
        def peek_event(self) -> Any: ...

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0
        self._expanded = 0  # nodes of this document, aliases counted at their expanded size
        self._aliased = 0  # the part of _expanded that aliases contributed
        self._sizes: dict[Any, int] = {}  # anchor → expanded size of its node

    def compose_document(self) -> Node | None:
        self._expanded = self._aliased = 0
        self._sizes = {}
        node: Node | None = super().compose_document()
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            size = self._sizes.get(event.anchor)
            if size is not None:  # an undefined alias is left to the composer's own error
                self._aliased += size
                self._expanded += size
                if self._aliased > MAX_ALIAS_NODES:
                    raise YAMLLimitError(
                        f"{_line(event)}: aliases expand to more than "
                        f"{MAX_ALIAS_NODES} nodes (an alias bomb?)"
                    )
            node: Node | None = super().compose_node(parent, index)
            return node
        event = self.peek_event()
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YAMLLimitError(f"{_line(event)}: nested deeper than {MAX_DEPTH} levels")
        before = self._expanded
        self._expanded += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if event.anchor is not None:
            self._sizes[event.anchor] = self._expanded - before
        return node


class _GuardedConstructor(SafeConstructor):
    """PyYAML's safe constructor, with a value it cannot build (a date of month 13, an
    integer of 5 000 digits, ``!!bool maybe``) a :class:`ConstructorError` at the value's
    line, where PyYAML lets the ValueError (KeyError, ...) of its conversion through."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, KeyError, AttributeError, TypeError, OverflowError) as exc:
            kind = str(node.tag).rsplit(":", 1)[-1]
            # int's own message ends with advice for a programmer (set_int_max_str_digits);
            # a ValueError may quote the value: a hundred characters at most.
            why = one_line(str(exc).split(";")[0], 100)
            why = why if isinstance(exc, ValueError) else f"not a valid {kind}"
            raise ConstructorError(
                None, None, f"cannot build the {kind}: {why}", node.start_mark
            ) from None


try:
    from yaml._yaml import CParser as _Parser  # libyaml: scanner and parser in C

    LIBYAML = True

    class _Loader(_GuardedComposer, _Parser, _GuardedConstructor, Resolver):
        def __init__(self, stream: str) -> None:
            _Parser.__init__(self, stream)
            _GuardedComposer.__init__(self)
            _GuardedConstructor.__init__(self)
            Resolver.__init__(self)

except ImportError:  # pragma: no cover - PyYAML built without libyaml: slower, same limits
    LIBYAML = False
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Loader(_GuardedComposer, Reader, Scanner, Parser, _GuardedConstructor, Resolver):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)
            _GuardedComposer.__init__(self)
            _GuardedConstructor.__init__(self)
            Resolver.__init__(self)


def load_all(text: str) -> list[Any]:
    """Every document of ``text`` (safe types only), or :class:`yaml.YAMLError` — also for the
    limits above. Never raises RecursionError or MemoryError for input within the size limit."""
    if len(text) > MAX_INVENTORY_BYTES:
        raise YAMLLimitError(f"larger than the limit of {MAX_INVENTORY_BYTES} bytes")
    loader = _Loader(text)
    try:
        docs = []
        while loader.check_data():  # type: ignore[no-untyped-call]  # untyped in the stubs
            docs.append(loader.get_data())
        return docs
    except yaml.MarkedYAMLError as exc:
        # libyaml has its own flow-nesting limit (1000), hit first when its scanner looks ahead
        # for a simple key; say it the way the composer's own limit says it.
        if exc.problem and "nesting depth" in exc.problem and exc.problem_mark is not None:
            raise YAMLLimitError(
                f"line {exc.problem_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"
            ) from None
        raise
    finally:
        loader.dispose()
