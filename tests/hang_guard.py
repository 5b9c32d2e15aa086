"""The suite-wide hang guard: an async test that is still running when 85 % of its pytest-timeout
has passed (counted from its setup, as pytest-timeout counts) is cancelled inside its own event
loop, so it fails naming the ``await`` it hung at, and its
``finally`` blocks and fixtures still clean up (processes, namespaces, sockets).

pytest-timeout alone interrupts the loop from outside: its report shows the loop's ``select()``
and the idle threads, never the coroutine that was waiting, and the test's cleanup may not run.
``tests/conftest.py`` imports the hooks from here; ``tests/test_hang_guard.py`` proves it."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pytest_asyncio import is_async_test

SHARE = 0.85
"""Of the test's pytest-timeout, the part its setup and body may take before the body is
cancelled; the rest is left for its cleanup."""

MINIMUM = 1.0
"""Seconds a body is given however long its setup took."""

_STARTED = pytest.StashKey[float]()


def _limit(item: pytest.Item) -> float | None:
    """The test's pytest-timeout in seconds (its marker, else the ini value); None if none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        value = marker.args[0]
    elif marker is not None and "timeout" in marker.kwargs:
        value = marker.kwargs["timeout"]
    else:
        value = item.config.getini("timeout")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def _guarded(
    test: Callable[..., Awaitable[Any]], within: float, limit: float
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(test)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        deadline = asyncio.timeout(within)
        try:
            async with deadline:
                return await test(*args, **kwargs)
        except TimeoutError:
            if not deadline.expired():
                raise  # the test's own timeout, not the guard's
            pytest.fail(
                f"hung: still running after {within:.1f} s (its pytest-timeout is "
                f"{limit:.0f} s from setup); the traceback above ends at the await it was "
                "waiting at"
            )

    return guarded


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = time.monotonic()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    if not isinstance(item, pytest.Function) or not is_async_test(item):
        return
    limit = _limit(item)
    if limit is None:
        return
    spent = time.monotonic() - item.stash.get(_STARTED, time.monotonic())
    item.obj = _guarded(item.obj, max(MINIMUM, limit * SHARE - spent), limit)
