"""The current model snapshot, shared by every component of a process, with change waits."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ravenproxy.log import kv
from ravenproxy.model.snapshot import Model

log = logging.getLogger(__name__)


class ModelStore:
    def __init__(self, model: Model | None = None) -> None:
        self.model = model or Model.build()
        """The current snapshot: read it, never assign it (:meth:`update` does). An attribute,
        not a property: routing reads it per request."""
        self._version = 0
        # One event per version: update() sets the old one and installs a fresh one, so a
        # waiter never misses a change and no task is needed to notify.
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[Model], None]] = []

    @property
    def version(self) -> int:
        return self._version

    def subscribe(self, listener: Callable[[Model], None]) -> None:
        """Call ``listener(model)`` synchronously after every update, in the order subscribed;
        one that raises is logged and the next still called."""
        self._listeners.append(listener)

    def update(self, model: Model) -> None:
        if self._version and model == self.model:
            return
        self.model = model
        self._version += 1
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        for listener in list(self._listeners):
            try:
                listener(model)
            except Exception:
                # A bug in one listener: logged with its traceback, and the others still
                # follow the model (else they would stay on the old one until it changed again).
                log.exception("model listener failed", extra=kv(listener=_name(listener)))

    async def wait_changed(self, since: int) -> Model:
        """Return the model once its version is greater than ``since``."""
        while self._version <= since:
            await self._changed.wait()
        return self.model


def _name(listener: Callable[[Model], None]) -> str:
    return getattr(listener, "__qualname__", None) or repr(listener)
