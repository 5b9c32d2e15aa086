"""Reconnect delays: exponential with full jitter, capped, with a floor."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.backoff import backoff, redial


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


def take_redial(n: int, **kwargs: object) -> list[float]:
    return list(itertools.islice(redial(**kwargs), n))  # type: ignore[arg-type]


def test_redial_is_quick_for_the_window_then_backs_off_from_its_first_step() -> None:
    # Top of the jitter: the first re-dial within 1 s, then 1.5 s apart until the waits add
    # up to the 3 s window (1 + 1.5 + 1.5), then 0.5, 1, 2, 4, 4.
    delays = take_redial(8, quick=1.0, window=3.0, base=0.5, cap=4.0, rng=lambda: 1.0)
    assert delays == [1.0, 1.5, 1.5, 0.5, 1.0, 2.0, 4.0, 4.0]


def test_redial_first_is_within_quick_later_ones_about_quick_apart() -> None:
    values = iter([0.0, 0.0, 0.25, 0.9, 0.5])
    delays = take_redial(5, quick=1.0, window=10.0, rng=lambda: next(values))
    assert delays == [0.01, 0.5, 0.75, 1.4, 1.0]


def test_redial_quick_retries_are_spaced_to_about_one_dial_per_quick() -> None:
    # A fleet that lost its server at once: on average one dial per agent per `quick` while
    # the window lasts (uniform(0, quick) for all of them was two), so 1 000 agents make about
    # 1 000 dials a second, not 2 000. Mid-jitter draws: 0.5 first, then exactly quick apart.
    delays = redial(quick=1.0, window=10.0, rng=lambda: 0.5)
    quick = [next(delays) for _ in range(11)]
    assert quick == [0.5] + [1.0] * 10
    assert next(delays) == 0.25  # the backoff's first step, mid-jitter


def test_redial_default_first_within_a_second_none_above_one_and_a_half() -> None:
    # The HA promise with default flags: the first re-dial within 1 s, and while a restarting
    # server is away no wait exceeds 1.5 s; the waits of the quick phase add up to >= 10 s.
    delays = redial(rng=lambda: 1.0)
    assert next(delays) == 1.0
    quick = [next(delays) for _ in range(6)]
    assert quick == [1.5] * 6
    assert next(delays) == 0.5


@given(
    quick=st.floats(0.01, 5.0),
    window=st.floats(0.0, 30.0),
    draws=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=200),
)
def test_redial_quick_phase_is_bounded(quick: float, window: float, draws: list[float]) -> None:
    values = iter(draws)
    delays = redial(quick, window, base=0.5, cap=30.0, rng=lambda: next(values))
    first = next(delays)
    assert 0.01 <= first <= max(0.01, quick)
    waited = first
    for _ in draws[1:]:
        delay = next(delays)
        if waited < window:
            assert max(0.01, quick / 2) <= delay <= max(0.01, 1.5 * quick)
            waited += delay
        else:
            assert delay <= 0.5  # the backoff's first step
            break
