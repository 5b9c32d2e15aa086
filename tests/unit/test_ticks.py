"""Periodic looks from a timer callback (ravenproxy.ticks): when they come, what ends them, and
that two pollers of one process wake it together."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.ticks import look_every, next_tick
from tests.helpers import examples


@settings(max_examples=examples(1200))
@given(
    now=st.floats(min_value=0, max_value=1e7, allow_nan=False),
    interval=st.sampled_from([0.01, 0.05, 0.25, 1.0, 5.0]),
)
def test_the_next_tick_is_a_multiple_of_the_interval_a_tenth_to_one_and_a_tenth_away(
    now: float, interval: float
) -> None:
    tick = next_tick(now, interval)
    assert tick / interval == pytest.approx(round(tick / interval), abs=1e-6)
    assert 0.1 * interval - 1e-6 <= tick - now <= 1.1 * interval + 1e-6


def test_from_a_tick_the_next_is_one_interval_on() -> None:
    for k in range(1, 100):
        assert next_tick(k * 1.0, 1.0) == k + 1
        assert next_tick(k - 0.001, 1.0) == k + 1  # a timer a little early is still tick k
        assert next_tick(k + 0.001, 1.0) == k + 1


async def test_looks_come_at_ticks_until_one_returns_true() -> None:
    loop = asyncio.get_running_loop()
    seen: list[float] = []

    def look() -> bool:
        seen.append(loop.time())
        return len(seen) == 4

    await asyncio.wait_for(look_every(0.02, look), 2)
    assert len(seen) == 4
    # Four ticks span three intervals; the first look may have come late (a loaded machine).
    assert all(b > a for a, b in itertools.pairwise(seen)), seen
    assert seen[-1] - seen[0] >= 2 * 0.02, seen


async def test_what_a_look_raises_is_raised_and_the_looks_stop() -> None:
    calls = 0

    def look() -> bool:
        nonlocal calls
        calls += 1
        raise ValueError("bad look")

    with pytest.raises(ValueError, match="bad look"):
        await asyncio.wait_for(look_every(0.01, look), 2)
    await asyncio.sleep(0.05)
    assert calls == 1


async def test_cancelling_the_caller_stops_the_looks() -> None:
    calls = 0

    def look() -> bool:
        nonlocal calls
        calls += 1
        return False

    task = asyncio.create_task(look_every(0.01, look))
    await asyncio.sleep(0.06)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    stopped = calls
    assert stopped >= 2
    await asyncio.sleep(0.05)
    assert calls == stopped


def test_two_pollers_started_apart_wake_the_loop_together() -> None:
    """On uvloop (the agent's loop), two pollers started 0.13 s apart look in the same loop
    turns (ticks of 0.25 s: exact in binary). A turn is told by a callback the turn's first
    look schedules: timers that fire together run before it."""

    async def main() -> tuple[list[int], list[int]]:
        loop = asyncio.get_running_loop()
        turn = [0, 0]  # the turn's number, whether its end is scheduled

        def turn_ends() -> None:
            turn[0] += 1
            turn[1] = 0

        a: list[int] = []
        b: list[int] = []

        def looker(seen: list[int], done: Callable[[], bool]) -> Callable[[], bool]:
            def look() -> bool:
                if not turn[1]:
                    turn[1] = 1
                    loop.call_soon(turn_ends)
                seen.append(turn[0])
                return done()

            return look

        # The first looks until the second has looked five times (however late a loaded
        # machine starts it): every look of the second must share its turn with one of the
        # first's.
        first = asyncio.create_task(look_every(0.25, looker(a, lambda: len(b) >= 5)))
        await asyncio.sleep(0.13)
        second = asyncio.create_task(look_every(0.25, looker(b, lambda: len(b) >= 5)))
        await asyncio.wait_for(asyncio.gather(first, second), 20)
        return a, b

    a, b = uvloop.run(main())
    # Pollers on their own timers (call_later(interval)) share none of the five turns; on a
    # loaded machine one late turn may part the two ticks once.
    assert len(b) == 5 and len(set(b) & set(a)) >= 4, (a, b)
