"""Reconnect delays: exponential with full jitter, capped, with a floor."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.backoff import backoff


def take(n: int, **kwargs: object) -> list[float]:
    return list(itertools.islice(backoff(**kwargs), n))  # type: ignore[arg-type]


def test_top_of_the_jitter_doubles_up_to_the_cap() -> None:
    assert take(9, rng=lambda: 1.0) == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_bottom_of_the_jitter_is_the_floor() -> None:
    assert take(5, rng=lambda: 0.0) == [0.01] * 5


def test_middle_of_the_jitter() -> None:
    assert take(4, base=1.0, cap=5.0, rng=lambda: 0.5) == [0.5, 1.0, 2.0, 2.5]


def test_base_above_cap_is_capped_from_the_start() -> None:
    assert take(3, base=100.0, cap=3.0, rng=lambda: 1.0) == [3.0, 3.0, 3.0]


def test_default_rng_stays_within_bounds() -> None:
    for n, delay in enumerate(take(50)):
        assert 0.01 <= delay <= min(30.0, 0.5 * 2**n)


@given(
    base=st.floats(0.001, 100.0),
    cap=st.floats(0.01, 1000.0),
    draws=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=80),
)
def test_never_above_cap_nor_below_floor(base: float, cap: float, draws: list[float]) -> None:
    values = iter(draws)
    delays = backoff(base, cap, rng=lambda: next(values))
    for n in range(len(draws)):
        delay = next(delays)
        assert 0.01 <= delay <= max(0.01, min(cap, base * 2**n))
        assert delay <= cap
