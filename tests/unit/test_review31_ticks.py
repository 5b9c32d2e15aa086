"""review31: ``ticks.look_every`` (agentidle, 070e100) where tests/unit/test_ticks.py does not
go: the loop's clock jumping either way, a look slower than the interval, a look that cancels
its own caller (then returns True or raises), a caller cancelled while a look is due. The loop
is asyncio's own with its clock offset by hand (the loop schedules by ``time()``, so a jump of
the offset is a jump of its clock)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

import pytest

from ravenproxy.ticks import look_every

pytestmark = pytest.mark.timeout(60)

INTERVAL = 0.05


class _JumpingLoop(asyncio.SelectorEventLoop):
    """A loop whose clock is the monotonic one plus ``offset`` (moved by a test)."""

    offset = 0.0

    def time(self) -> float:
        return super().time() + self.offset


def _run(main: Callable[[_JumpingLoop], Any]) -> tuple[Any, list[dict[str, Any]]]:
    """Run ``main(loop)`` on a fresh jumping loop: its result and what reached the loop's
    exception handler (an error raised in a timer callback)."""
    loop = _JumpingLoop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        result = loop.run_until_complete(main(loop))
        loop.run_until_complete(asyncio.sleep(3 * INTERVAL))  # what a stray timer would do
        return result, reported
    finally:
        loop.close()


@pytest.mark.parametrize("jump", [1000 * INTERVAL, -1000 * INTERVAL, 10.5 * INTERVAL])
def test_a_clock_jump_neither_bursts_nor_stalls_the_looks(jump: float) -> None:
    """After the clock jumps (forward: the pending tick long past; backward: far ahead), the
    looks go on once an interval of real time: no catch-up burst, no stall."""

    async def main(loop: _JumpingLoop) -> list[float]:
        real: list[float] = []

        def look() -> bool:
            real.append(time.monotonic())
            if len(real) == 3:
                loop.offset += jump
            return len(real) == 8

        # (No wait_for: its deadline is on the jumping clock; pytest-timeout bounds the test.)
        await look_every(INTERVAL, look)
        return real

    real, reported = _run(main)
    assert not reported
    after = real[3:]  # the looks after the jump
    gaps = [b - a for a, b in itertools.pairwise(after)]
    # Each a tick apart (0.1 to 1.1 intervals from the last look; a loaded machine: later).
    assert all(gap >= 0.05 * INTERVAL for gap in gaps), gaps
    assert real[3] - real[2] <= 1.1 * INTERVAL + 2.0, "stalled after the jump"


def test_a_look_slower_than_the_interval_is_not_followed_by_a_burst() -> None:
    """A look that blocks for 3.5 intervals: the next one comes at a tick after it ended (at
    least a tenth of an interval later), not at once for each tick missed."""

    async def main(loop: _JumpingLoop) -> list[tuple[float, float]]:
        spans: list[tuple[float, float]] = []

        def look() -> bool:
            began = loop.time()
            if len(spans) == 1:
                time.sleep(3.5 * INTERVAL)
            spans.append((began, loop.time()))
            return len(spans) == 5

        await asyncio.wait_for(look_every(INTERVAL, look), 30)
        return spans

    spans, reported = _run(main)
    assert not reported
    for (_, ended), (began, _) in itertools.pairwise(spans):
        assert began - ended >= 0.1 * INTERVAL - 0.002, spans  # a timer may fire ~1 ms early


@pytest.mark.parametrize(
    "then",
    [
        "returns True",
        "returns False",
        "raises",
    ],
)
def test_a_look_that_cancels_its_caller_ends_it_cancelled_and_reports_nothing(then: str) -> None:
    """A look may stop what waits on it (a reload that shuts the process down): the caller
    ends cancelled, and nothing is left to the loop's exception handler (an
    ``InvalidStateError`` of a result set on the cancelled future) or looks again."""

    async def main(loop: _JumpingLoop) -> tuple[bool, int]:
        calls = 0
        task: asyncio.Task[None]

        def look() -> bool:
            nonlocal calls
            calls += 1
            if calls == 2:
                task.cancel()
                if then == "raises":
                    raise ValueError("after the cancel")
                return then == "returns True"
            return False

        task = loop.create_task(look_every(INTERVAL, look))
        await asyncio.gather(task, return_exceptions=True)
        seen = calls
        await asyncio.sleep(3 * INTERVAL)
        return task.cancelled(), calls - seen

    (cancelled, more), reported = _run(main)
    assert cancelled
    assert more == 0
    assert not reported, [c.get("message") for c in reported]


def test_a_caller_cancelled_while_its_tick_is_due_does_not_look() -> None:
    """The cancel and the tick's timer in one loop turn, the cancel first: the look is not
    made (the tick asks whether the caller is done first), nothing reported."""

    async def main(loop: _JumpingLoop) -> int:
        calls = 0

        def look() -> bool:
            nonlocal calls
            calls += 1
            return False

        task = loop.create_task(look_every(INTERVAL, look))
        await asyncio.sleep(0)  # it has scheduled its first tick
        time.sleep(1.2 * INTERVAL)  # the tick is due now
        # The cancel runs first in the next turn, the due tick's timer right after it (the
        # task's own wake-up after both).
        loop.call_soon(task.cancel)
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(3 * INTERVAL)
        return calls

    calls, reported = _run(main)
    assert calls == 0  # its first tick was due only after the cancel (no turn between)
    assert not reported
