"""The callback path's clock: whichever way the callbacks hand the connection to its task, the
watch is stamped first (the chunk an answer ended with is stamped by no one else)."""

from __future__ import annotations

import asyncio

from ravenproxy.server.exchange_actions import Action, Close
from ravenproxy.server.http_callbacks import CallbackPath
from ravenproxy.transport.relay import IdleWatch


async def test_leaving_to_the_task_stamps_the_watch() -> None:
    """A stale stamp (the request's, before a long answer) must not stay while the task takes
    over: its watch could fire before the task leaves it, and a pipelined request be lost."""
    path = CallbackPath()
    watch = path._calls = IdleWatch(60.0)
    watch.last -= 50.0
    done: asyncio.Future[list[Action]] = asyncio.get_running_loop().create_future()
    path._exit = done
    rest: list[Action] = [Close("x")]
    path._leave(rest)
    assert done.result() is rest
    assert asyncio.get_running_loop().time() - watch.last < 1.0


async def test_leaving_again_changes_nothing() -> None:
    """Once left, a second leave (from inside the same callback) neither stamps nor answers."""
    path = CallbackPath()
    watch = path._calls = IdleWatch(60.0)
    done: asyncio.Future[list[Action]] = asyncio.get_running_loop().create_future()
    path._exit = done
    first: list[Action] = []
    path._leave(first)
    watch.last -= 50.0
    path._leave([Close("y")])
    assert done.result() is first
    assert asyncio.get_running_loop().time() - watch.last > 49.0
