"""Review of outlet3's actions built without their ``__init__`` (``object.__new__`` and their
fields' stores, in :mod:`ravenproxy.server.exchange`): every such site, found in the module's
source, stores EVERY field of the class it makes before the action leaves (no default applies:
a field added to ``WriteClient`` or ``WriteUpstream`` later, with a default, would be left
unset there and raise ``AttributeError`` where the driver reads it — at one site only, perhaps
one no conversation test reaches). And each such action, made so, equals one made by its class.

Breaks this catches (tried by hand): a field ``extra: int = 0`` added to ``WriteClient`` (each
of its two sites fails), ``write.status`` not stored at one site, a ``_new`` of a class with
``__post_init__`` (its check would be skipped).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect

from ravenproxy.server import exchange, exchange_actions, exchange_answer


def _sites() -> list[tuple[str, str, set[str]]]:
    """(function, class, fields stored on the made object before the function's next
    statement that does not store on it): each ``x = _new(Cls)`` in exchange.py and
    exchange_answer.py (the exchange's request and answer sides)."""
    found: list[tuple[str, str, set[str]]] = []
    trees = [ast.parse(inspect.getsource(module)) for module in (exchange, exchange_answer)]
    funcs = (func for tree in trees for func in ast.walk(tree))
    for func in funcs:
        if not isinstance(func, ast.FunctionDef):
            continue
        for block in ast.walk(func):
            body = getattr(block, "body", None)
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                made = _made(stmt)
                if made is None:
                    continue
                name, cls = made
                stored: set[str] = set()
                for later in body[i + 1 :]:
                    names = _stores(later, name)
                    if not names:
                        break
                    stored |= names
                found.append((func.name, cls, stored))
    return found


def _made(stmt: ast.stmt) -> tuple[str, str] | None:
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
        return None
    target, value = stmt.targets[0], stmt.value
    if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
        return None
    func = value.func
    if isinstance(func, ast.Name) and func.id == "_new" and len(value.args) == 1:
        arg = value.args[0]
        if isinstance(arg, ast.Name):
            return target.id, arg.id
    return None


def _stores(stmt: ast.stmt, name: str) -> set[str]:
    """The attributes of ``name`` that ``stmt`` assigns (``a.x = ...``, ``a.x, a.y = ...``)."""
    if not isinstance(stmt, ast.Assign):
        return set()
    out: set[str] = set()
    for target in stmt.targets:
        elts = target.elts if isinstance(target, ast.Tuple) else [target]
        for elt in elts:
            if (
                isinstance(elt, ast.Attribute)
                and isinstance(elt.value, ast.Name)
                and elt.value.id == name
            ):
                out.add(elt.attr)
    return out


def test_each_action_made_without_init_has_every_field_stored() -> None:
    sites = _sites()
    assert exchange._new is object.__new__
    assert exchange_answer._new is object.__new__
    made = {cls for _, cls, _ in sites}
    assert {"WriteClient", "WriteUpstream"} <= made, sites  # (the four sites outlet3 added)
    assert len(sites) >= 4
    for func, cls_name, stored in sites:
        cls = getattr(exchange_actions, cls_name)
        assert dataclasses.is_dataclass(cls)
        fields = {f.name for f in dataclasses.fields(cls)}
        assert stored == fields, f"{func}: _new({cls_name}) stores {stored}, fields {fields}"
        # No __post_init__ to skip, and slotted (a stray store would raise, not pass).
        assert not hasattr(cls, "__post_init__"), cls_name
        assert "__slots__" in vars(cls), cls_name


def test_an_action_made_without_init_equals_its_class_made_one() -> None:
    write = object.__new__(exchange_actions.WriteClient)
    write.data, write.status = b"HTTP/1.1 200 OK\r\n\r\n", 200
    assert write == exchange_actions.WriteClient(b"HTTP/1.1 200 OK\r\n\r\n", 200)
    assert repr(write) == repr(exchange_actions.WriteClient(b"HTTP/1.1 200 OK\r\n\r\n", 200))
    send = object.__new__(exchange_actions.WriteUpstream)
    send.data = b"x"
    assert send == exchange_actions.WriteUpstream(b"x")
