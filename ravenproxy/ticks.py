"""Periodic looks on the event loop's clock, cheap enough for an idle process.

A file poller (the certificate reloader, the inventory watcher) looks at a few files' stat once
a second for the life of the process, and almost always finds nothing. Done as a task that
sleeps (``await asyncio.sleep(interval)``), every look costs a future, two loop callbacks and a
task step besides the look itself; and two pollers started at different moments wake the
process twice a second. :func:`look_every` calls the look from a timer callback instead, and
on the multiples of the interval on the loop's clock, so the pollers of one process wake it
together, once (issue 15: an idle agent burned ~62 000 instructions a second in its pollers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

_EARLY = 0.1
"""Fraction of an interval a timer may fire before its tick (a clock's resolution, a rounded
deadline) and still be taken as that tick, not the one before it."""


def next_tick(now: float, interval: float) -> float:
    """The first multiple of ``interval`` after ``now``, at least a tenth of an interval away:
    the next look is 0.1 to 1.1 intervals from ``now`` (1 from a tick: once a tick)."""
    return ((now + _EARLY * interval) // interval + 1) * interval


async def look_every(interval: float, look: Callable[[], bool]) -> None:
    """Call ``look()`` at each tick of ``interval`` seconds (:func:`next_tick`) until it
    returns True; then return. What ``look()`` raises is raised here, and it is not called
    again. Cancelling the caller stops the looks. ``look()`` runs in a loop callback: it must
    not block, and anything long belongs to the caller, after this returns."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    handle: asyncio.TimerHandle

    def tick() -> None:
        nonlocal handle
        if done.done():  # the caller was cancelled in this loop turn
            return
        try:
            found = look()
        except Exception as exc:
            if not done.done():  # the look may have cancelled the caller: it ends cancelled
                done.set_exception(exc)
            return
        if done.done():
            return
        if found:
            done.set_result(None)
        else:
            handle = loop.call_at(next_tick(loop.time(), interval), tick)

    handle = loop.call_at(next_tick(loop.time(), interval), tick)
    try:
        await done
    finally:
        handle.cancel()
