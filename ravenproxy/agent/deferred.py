"""Modules an agent's libraries import but an agent does not use: deferred by
:func:`defer_unused` before the agent's code is imported, their code runs only if something
reads a name of them (issue 15: an idle agent as shipped in <= 30 MB). Each one's saving was
measured on an idle agent (benchmarks/idle_cost.py, Python 3.11, websockets 17); a module used
after all just loads then, as it would have at its import.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Callable
from types import FrameType
from typing import Any

from ravenproxy import lazymodule

UNUSED: dict[str, str] = {
    "importlib.metadata": "websockets.version reads its own version from the package metadata "
    "in a development checkout of websockets only; with it come email.message, zipfile, csv, "
    "importlib.resources (~0.8 MB)",
    "email.utils": "websockets.server (the server side's Date header): email's charset and "
    "header encoders, calendar and quopri come with it (~0.3 MB)",
    "uuid": "websockets.protocol, for an id per connection that only websockets' own "
    "connection classes read (the agent's client protocol is made without it: "
    "ravenproxy.transport.ws_client.client_protocol); uuid imports platform (~0.28 MB)",
    "stringprep": "the idna codec (host names given to getaddrinfo) for non-ASCII labels "
    "only (~0.1 MB)",
    "bz2": "shutil's archive formats (argparse imports shutil for the terminal's width; the "
    "CLI defers these before it builds its parser)",
    "lzma": "shutil's archive formats",
    # Imported by the CLI's own imports: deferred before them (ravenproxy.__main__.main).
    "asyncio.sslproto": "the event loop's TLS over memory BIOs (asyncio.base_events): the "
    "agent runs uvloop, whose TLS is its own, and the tunnel's TLS is on the socket "
    "(ravenproxy.transport.tls_socket) (~0.1 MB)",
    "textwrap": "argparse's help formatting and traceback's exception notes (logging imports "
    "traceback): its regular expressions are compiled at import (~0.2 MB)",
    "tokenize": "linecache's reading of a source file, for a traceback's lines (~0.1 MB)",
    "queue": "concurrent.futures.thread's work queue (uvloop imports it): a default executor "
    "(the --inventory load) loads it",
    "locale": "subprocess's text mode (its encoding) only: the agent's children talk bytes "
    "(~0.15 MB)",
    "selectors": "socket.sendfile and asyncio's own event loop (uvloop polls with libuv) "
    "(~0.08 MB)",
    "asyncio.trsock": "asyncio's own event loop's socket wrapper (uvloop has its own)",
    "asyncio.staggered": "asyncio's own event loop's Happy Eyeballs (uvloop dials itself)",
    "copy": "dataclasses' asdict and astuple (deep copies), which the agent never calls",
    "linecache": "traceback's source lines (traceback itself is deferred: STAND_INS)",
}
"""Module name: who imports it, and what for."""


_CO_COROUTINE = 0x80
"""``inspect.CO_COROUTINE``: the code flag of an ``async def`` function."""


def _inspect() -> Any:
    return lazymodule.load(sys.modules["inspect"])


def _isgenerator(obj: object) -> bool:
    """``inspect.isgenerator``, which is this."""
    return isinstance(obj, types.GeneratorType)


def _isfunction(obj: object) -> bool:
    """``inspect.isfunction``, which is this."""
    return isinstance(obj, types.FunctionType)


def _unwrap(func: Any, *, stop: Callable[[Any], bool] | None = None) -> Any:
    """``inspect.unwrap``: ``func`` itself when it wraps nothing, else ``inspect``'s."""
    if not hasattr(func, "__wrapped__"):
        return func
    return _inspect().unwrap(func, stop=stop)


def _iscoroutinefunction(obj: object) -> bool:
    """``inspect.iscoroutinefunction`` (Python 3.11) where the answer needs no ``inspect``:
    a Python function, bound as a method or in a ``functools.partial`` or neither, says so
    by its code's flags; a builtin is none. Anything else asks ``inspect``."""
    func = obj
    while isinstance(func, types.MethodType):
        func = func.__func__
    while isinstance(func, functools.partial):
        func = func.func
    if isinstance(func, types.FunctionType):
        return bool(func.__code__.co_flags & _CO_COROUTINE)
    if isinstance(func, types.BuiltinFunctionType):
        return False
    result: bool = _inspect().iscoroutinefunction(obj)
    return result


def _get_annotations(
    obj: object,
    *,
    globals: dict[str, Any] | None = None,
    locals: Any = None,
    eval_str: bool = False,
) -> dict[str, Any]:
    """``inspect.get_annotations`` (Python 3.10-3.13) where the answer needs no ``inspect``: a
    class's own annotations, not evaluated, copied (``{}`` for none). Anything else asks
    ``inspect``. dataclasses reads it for every dataclass from Python 3.12 on."""
    if isinstance(obj, type) and not eval_str:
        ann = obj.__dict__.get("__annotations__")  # noqa: RUF063 (this is inspect's own read)
        if ann is None or isinstance(ann, types.GetSetDescriptorType):
            return {}
        if isinstance(ann, dict):
            return dict(ann)
    result: dict[str, Any] = _inspect().get_annotations(
        obj, globals=globals, locals=locals, eval_str=eval_str
    )
    return result


def _traceback() -> Any:
    return lazymodule.load(sys.modules["traceback"])


def _extract_stack(f: FrameType | None = None, limit: int | None = None) -> Any:
    """``traceback.extract_stack``: from the caller's frame when ``f`` is None, as its own."""
    return _traceback().extract_stack(sys._getframe(1) if f is None else f, limit)


def _walk_stack(f: FrameType | None) -> Any:
    """``traceback.walk_stack``: its own generator (whose frame, like the one it starts from
    when ``f`` is None, is seen from whoever iterates it, not from here)."""
    return _traceback().walk_stack(f)


def _format_list(extracted_list: Any) -> list[str]:
    """``traceback.format_list``."""
    result: list[str] = _traceback().format_list(extracted_list)
    return result


class _StackSummary:
    """``traceback.StackSummary`` as uvloop uses it (its ``extract``), read at its import."""

    @staticmethod
    def extract(*args: Any, **kwargs: Any) -> Any:
        """``traceback.StackSummary.extract``: a real ``StackSummary``."""
        return _traceback().StackSummary.extract(*args, **kwargs)


class _SubprocessError(Exception):
    """``subprocess.SubprocessError`` as uvloop uses it, read at its import: it only makes one
    (a ``preexec_fn`` that failed in the child), and what it makes is a real one."""

    def __new__(cls, *args: Any) -> Any:
        return lazymodule.load(sys.modules["subprocess"]).SubprocessError(*args)


STAND_INS: dict[str, dict[str, Any]] = {
    "inspect": {
        "get_annotations": _get_annotations,
        "isgenerator": _isgenerator,
        "iscoroutinefunction": _iscoroutinefunction,
        "isfunction": _isfunction,
        "unwrap": _unwrap,
    },
    "traceback": {
        "extract_stack": _extract_stack,
        "walk_stack": _walk_stack,
        "format_list": _format_list,
        "StackSummary": _StackSummary,
    },
    "subprocess": {
        "PIPE": -1,
        "STDOUT": -2,
        "DEVNULL": -3,
        "SubprocessError": _SubprocessError,
    },
}
"""Deferred modules, with the names of them that are read before they are used (each answers
as the module's own, asking the module for what it cannot answer itself). ``inspect`` (with
``ast``, ``dis`` and ``opcode``: ~0.9 MB of an idle agent): uvloop reads ``isgenerator`` and
``iscoroutinefunction`` at its import, and checks each signal handler and executor call with
the latter; asyncio's repr of a callback (``unwrap``, ``isfunction``) runs at start-up, where
``signal.signal`` formats the handler asyncio.Runner installed for SIGINT, which refers to the
main task; dataclasses (Python 3.12 and later) reads ``get_annotations`` of every dataclass.
dataclasses reads ``inspect.signature`` for a class without a docstring only (the agent's have
one: tests/unit/agent/test_imports.py); asyncio for a generator yielded to a task
or an awaitable that is not a coroutine. ``traceback`` (with ``linecache``: ~0.11 MB): asyncio's
C module reads ``extract_stack`` at its import, uvloop ``StackSummary``, ``walk_stack`` and
``format_list``, each used in debug mode only (a task's or callback's source traceback);
logging's use (an exception logged) reads the module, which loads then. ``subprocess`` (~0.13
MB): asyncio and uvloop read its three constants (the same numbers here) and uvloop its
``SubprocessError`` at their import; a child started (``ravenproxy.children``) loads it."""


def defer_unused() -> None:
    """Defer :data:`UNUSED` (those not imported yet). Called first thing by the entry point
    (before the CLI's imports), then again by the CLI: the second call makes each deferred
    submodule its package's attribute (:func:`ravenproxy.lazymodule.attach`), the package
    being imported by then."""
    for name in UNUSED:
        lazymodule.defer(name)
    for name, stand_ins in STAND_INS.items():
        lazymodule.defer(name, stand_ins)
    lazymodule.attach()
