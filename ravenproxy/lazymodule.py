"""A module whose code runs on its first use instead of at its import (issue 15: an idle
agent's memory).

``websockets`` imports ``importlib.metadata`` in ``websockets.version`` on every import of the
package and uses it only in a development checkout of websockets; with it come ``email``,
``zipfile``, ``csv`` and ``importlib.resources``: ~0.8 MB of an idle agent's
resident set. :func:`defer` puts the module's :class:`LazyModule` in ``sys.modules`` instead:
the import statement takes it as the module (it has the module's spec), and the module's own
code runs into it on the first read of a name it does not have yet. Whoever uses the module
gets all of it; whoever only imports it pays nothing. The one difference: an import made to
probe that a module works (``try: import bz2 except ImportError``) succeeds, and a module that
fails does so at the first read instead (an ImportError of its own imports, say).

:class:`importlib.util.LazyLoader` does the same, but its module loads (Python 3.11) as soon as
the import statement reads ``__spec__`` to check that the module is initialised, that is at the
``import`` itself.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Mapping
from typing import Any

_load_lock = threading.RLock()
"""Two threads reading a name at once: one runs the module's code, the other waits for it.
Reentrant: a module's code may read a name of another deferred module while it runs."""

_loading: set[int] = set()
"""The modules whose code is running (ids), under the lock: the loading thread's own reads."""


class LazyModule(types.ModuleType):
    """A module object whose code has not run yet: its spec and file attributes only. The
    first read of any other name runs the code into this same object (functions get it as
    their globals, as on an import), after which it is a plain module."""

    def __getattr__(self, name: str) -> Any:
        # Called only for names the object does not have: before the load, every module name.
        load(self, name)
        return getattr(self, name)


def load(module: types.ModuleType, name: str = "") -> types.ModuleType:
    """Run a :class:`LazyModule`'s code into it, if it has not run yet (``name``: the name
    read, for the error while the code runs); the module, loaded. For stand-ins
    (:func:`defer`'s ``stand_ins``) that need the real thing."""
    with _load_lock:
        if isinstance(module, LazyModule):
            if id(module) in _loading:
                # This thread, while the code runs (a package's ``from . import x``):
                # what a module being imported answers.
                raise AttributeError(
                    f"partially initialized module {module.__name__!r} has no attribute {name!r}"
                )
            spec = module.__spec__
            assert spec is not None and spec.loader is not None  # set by defer()
            _loading.add(id(module))
            try:
                spec.loader.exec_module(module)
            except BaseException:
                # As a failed import: the module is not left half-made in sys.modules.
                if sys.modules.get(spec.name) is module:
                    del sys.modules[spec.name]
                raise
            finally:
                _loading.discard(id(module))
            # A plain module from here on; other threads waited on the lock until now.
            module.__class__ = types.ModuleType  # type: ignore[assignment]
    return module


def defer(name: str, stand_ins: Mapping[str, Callable[..., Any]] | None = None) -> None:
    """Make ``name`` (a module not imported yet) a :class:`LazyModule`: its import costs
    nothing until a name of it is read. Nothing changes when it is imported already or cannot
    be found (its import then fails as it would have).

    ``stand_ins``: names the placeholder has before its code runs, so that reading them loads
    nothing (a library that reads a function at its import and calls it rarely). Each must
    answer as the module's own would, calling :func:`load` for what it cannot answer itself;
    the module's code replaces them once it runs.

    A submodule of a package not imported yet (``asyncio.sslproto`` before ``asyncio``) is
    found without importing the package: the package's own ``from . import child`` then takes
    the placeholder from ``sys.modules``, as an import does, and :func:`attach` makes it the
    package's attribute once the package is in (until then ``import package.child`` gives no
    ``package.child``, as the module is found in ``sys.modules``)."""
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    if parent and parent not in sys.modules:
        # find_spec(name) would import the package, and with it (asyncio's __init__) the
        # very module to defer.
        package = importlib.util.find_spec(parent)
        if package is None or package.submodule_search_locations is None:
            return
        spec = importlib.machinery.PathFinder.find_spec(name, package.submodule_search_locations)
    else:
        spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    module.__class__ = LazyModule
    for attr, stand_in in (stand_ins or {}).items():
        setattr(module, attr, stand_in)
    sys.modules[name] = module
    if parent in sys.modules:
        # What an import does: the package's attribute is the submodule.
        setattr(sys.modules[parent], child, module)
    elif parent:
        _unattached.add(name)


_unattached: set[str] = set()
"""Deferred submodules whose package was not imported yet when they were deferred."""


def attach() -> None:
    """Make each deferred submodule whose package has been imported since the package's
    attribute (an import of a module already in ``sys.modules`` does not: ``import
    asyncio.sslproto`` then ``asyncio.sslproto.SSLProtocol`` would not find it)."""
    for name in sorted(_unattached):
        parent, _, child = name.rpartition(".")
        package = sys.modules.get(parent)
        if package is None:
            continue
        _unattached.discard(name)
        module = sys.modules.get(name)
        if module is not None and child not in vars(package):
            setattr(package, child, module)
