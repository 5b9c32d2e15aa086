"""A set/clear/wait flag that holds nothing while nobody waits (:class:`Flag`)."""

from __future__ import annotations

import asyncio


class Flag:
    """:class:`asyncio.Event`'s set/clear/wait, holding nothing while nobody waits (an Event
    keeps a deque of waiters, ~0.8 KiB, for each of a session's five flags). Waiters share one
    future, each behind a shield: one waiter cancelled cancels no other."""

    __slots__ = ("_set", "waiter")

    def __init__(self) -> None:
        self._set = False
        self.waiter: asyncio.Future[None] | None = None
        """The future the waiters share; None while nobody waits. A flag every waiter clears
        right before it waits needs no :meth:`set` while this is None (a hot setter checks)."""

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        waiter = self.waiter
        if waiter is None:
            waiter = self.waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)
