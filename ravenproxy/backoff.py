"""Reconnect delays: exponential with full jitter, as a pure generator (tests pass ``rng``)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator


def backoff(
    base: float = 0.5, cap: float = 30.0, rng: Callable[[], float] = random.random
) -> Iterator[float]:
    """``uniform(0, min(cap, base·2ⁿ))`` for attempt n: full jitter spreads a fleet of agents
    that lost the server at the same moment, so they do not all come back at once."""
    attempt = 0
    while True:
        ceiling = min(cap, base * (2**attempt))
        yield max(0.01, rng() * ceiling)
        if ceiling < cap:
            attempt += 1
