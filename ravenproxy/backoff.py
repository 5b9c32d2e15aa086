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
    """After a healthy connection is lost: ``uniform(0, quick)`` delays while their sum stays
    within ``window`` seconds (its server is draining or restarting and most likely back within
    seconds: each retry lands within ``quick`` of its return, spread over ``quick`` across a
    fleet), then :func:`backoff` from its first step (a server away for longer is not dialled
    every second for ever)."""
    waited = 0.0
    while waited < window:
        delay = max(FLOOR, rng() * quick)
        waited += delay
        yield delay
    yield from backoff(base, cap, rng)
