"""Reconnect delays as pure generators (tests pass ``rng``): exponential with full jitter
(:func:`backoff`), and the schedule after a healthy connection is lost (:func:`redial`):
quick jittered retries for a bounded window, then the exponential one."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

FLOOR = 0.01
"""No delay is shorter than this: a retry loop never spins."""


def backoff(
    base: float = 0.5, cap: float = 30.0, rng: Callable[[], float] = random.random
) -> Iterator[float]:
    """``uniform(0, min(cap, base·2ⁿ))`` for attempt n: full jitter spreads a fleet of agents
    that lost the server at the same moment, so they do not all come back at once."""
    attempt = 0
    while True:
        ceiling = min(cap, base * (2**attempt))
        yield max(FLOOR, rng() * ceiling)
        if ceiling < cap:
            attempt += 1


def redial(
    quick: float = 1.0,
    window: float = 10.0,
    base: float = 0.5,
    cap: float = 30.0,
    rng: Callable[[], float] = random.random,
) -> Iterator[float]:
    """After a healthy connection is lost: the first re-dial within ``uniform(0, quick)`` (its
    server drained or went away and is most likely back at once, or another one is), then
    retries ``uniform(quick/2, 3·quick/2)`` apart while the waits add up to less than
    ``window`` seconds (a restart takes a few: each retry lands within about ``quick`` of its
    return, and a fleet that lost the server at once dials it about once per ``quick`` each,
    not twice), then :func:`backoff` from its first step (a server away for longer is not
    dialled every second for ever)."""
    delay = max(FLOOR, rng() * quick)
    waited = delay
    yield delay
    while waited < window:
        delay = max(FLOOR, (0.5 + rng()) * quick)
        waited += delay
        yield delay
    yield from backoff(base, cap, rng)
