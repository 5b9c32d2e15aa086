"""Flow-control windows as data: scripted scenarios and a property over random histories."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.wire.errors import FlowControlError
from ravenproxy.wire.frames import MAX_WINDOW
from ravenproxy.wire.windows import RecvWindow, SendWindow

RTT = 0.05


@dataclass(frozen=True)
class Recv:
    n: int


@dataclass(frozen=True)
class Consume:
    n: int
    now: float
    increment: int
    """What consume() must return."""
    may_grow: bool = True


@dataclass(frozen=True)
class Expect:
    size: int
    available: int
    buffered: int


Step = Recv | Consume | Expect

SCENARIOS: dict[str, tuple[int, int, list[Step]]] = {
    # (initial, max_size, steps)
    "credit returns at half the window": (
        100,
        100,
        [
            Recv(100),
            Consume(49, 0.0, 0),
            Expect(100, 0, 51),
            Consume(1, 0.0, 50),
            Expect(100, 50, 50),
            Consume(50, 10.0, 50),
            Expect(100, 100, 0),
        ],
    ),
    "no growth without consumption": (
        100,
        1000,
        [Recv(100), Expect(100, 0, 100)],
    ),
    "first update never grows (no previous update to compare)": (
        100,
        1000,
        [Recv(50), Consume(50, 0.0, 50), Expect(100, 100, 0)],
    ),
    "doubling when updates come faster than 2xRTT": (
        100,
        1000,
        [
            Recv(50),
            Consume(50, 0.0, 50),
            Recv(50),
            Consume(50, 2 * RTT - 0.001, 150),  # 50 consumed + 100 of growth
            Expect(200, 200, 0),
            Recv(100),
            Consume(100, 2 * RTT + 0.05, 300),
            Expect(400, 400, 0),
        ],
    ),
    "no doubling at or beyond 2xRTT": (
        100,
        1000,
        [
            Recv(50),
            Consume(50, 0.0, 50),
            Recv(50),
            Consume(50, 2 * RTT, 50),
            Recv(50),
            Consume(50, 10.0, 50),
            Expect(100, 100, 0),
        ],
    ),
    "no doubling when growth is not allowed": (
        100,
        1000,
        [
            Recv(50),
            Consume(50, 0.0, 50, may_grow=False),
            Recv(50),
            Consume(50, 0.01, 50, may_grow=False),
            Expect(100, 100, 0),
        ],
    ),
    "cap respected": (
        100,
        300,
        [
            Recv(50),
            Consume(50, 0.0, 50),
            Recv(50),
            Consume(50, 0.01, 150),
            Expect(200, 200, 0),
            Recv(100),
            Consume(100, 0.02, 200),  # would double to 400: capped at 300
            Expect(300, 300, 0),
            Recv(150),
            Consume(150, 0.03, 150),
            Expect(300, 300, 0),
        ],
    ),
    "received but unconsumed stays buffered": (
        1000,
        1000,
        [Recv(10), Recv(20), Consume(5, 0.0, 0), Expect(1000, 970, 25)],
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_recv_window_scenario(name: str) -> None:
    initial, max_size, steps = SCENARIOS[name]
    window = RecvWindow(initial, max_size)
    for step in steps:
        match step:
            case Recv(n):
                window.receive(n)
            case Consume(n, now, increment, may_grow):
                assert window.consume(n, now, RTT, may_grow) == increment, step
            case Expect(size, available, buffered):
                assert (window.size, window.available, window.buffered) == (
                    size,
                    available,
                    buffered,
                ), step


def test_max_below_initial_is_raised_to_initial() -> None:
    assert RecvWindow(100, 10).max_size == 100


def test_receive_beyond_credit() -> None:
    window = RecvWindow(100, 100)
    window.receive(60)
    with pytest.raises(FlowControlError):
        window.receive(41)
    window.receive(40)
    with pytest.raises(FlowControlError):
        window.receive(1)


def test_consume_more_than_buffered_is_a_local_bug() -> None:
    window = RecvWindow(100, 100)
    window.receive(10)
    with pytest.raises(ValueError):
        window.consume(11, 0.0, RTT)


def test_forget_returns_credit_while_remaining_credit_is_low_and_never_grows() -> None:
    window = RecvWindow(100, 1000)
    window.receive(40)
    assert window.forget(40) == 0  # 60 of credit left: no update needed yet
    window.receive(20)
    assert window.forget(20) == 60  # 40 left, below half: everything unacked goes back
    assert (window.size, window.available, window.buffered) == (100, 100, 0)


def test_shared_budget_returns_credit_even_when_stalled_bytes_hold_half() -> None:
    """Stalled streams hold 60 of 100: consuming the others' bytes must still return credit,
    or the whole connection would freeze (half the window can never be consumed)."""
    window = RecvWindow(100, 100)
    window.receive(60)  # stalled, never consumed
    window.receive(30)
    assert window.consume_shared(30) == 30
    assert window.available == 40
    window.receive(40)
    assert window.consume_shared(40) == 40
    assert window.buffered == 60


def test_send_window() -> None:
    window = SendWindow(10)
    window.consume(10)
    assert window.available == 0
    window.grant(5)
    assert window.available == 5
    window.grant(MAX_WINDOW - 5)
    assert window.available == MAX_WINDOW


def test_grant_overflow() -> None:
    window = SendWindow(MAX_WINDOW - 10)
    with pytest.raises(FlowControlError):
        window.grant(11)
    assert window.available == MAX_WINDOW - 10


@settings(max_examples=200, deadline=None)
@given(
    initial=st.integers(1, 1 << 20),
    cap_factor=st.integers(1, 64),
    ops=st.lists(
        st.tuples(st.booleans(), st.floats(0, 1), st.floats(0.0, 0.2), st.booleans()),
        max_size=60,
    ),
)
def test_recv_window_accounting(
    initial: int,
    cap_factor: int,
    ops: list[tuple[bool, float, float, bool]],
) -> None:
    """Whatever the history: credit granted minus bytes received is what is available,
    buffered bytes fit in the window, and the window stays within [initial, cap]."""
    cap = min(initial * cap_factor, MAX_WINDOW)
    window = RecvWindow(initial, cap)
    granted, received, consumed, now = initial, 0, 0, 0.0
    for is_receive, fraction, dt, may_grow in ops:
        now += dt
        if is_receive:
            n = int(window.available * fraction)
            window.receive(n)
            received += n
        else:
            n = int(window.buffered * fraction)
            granted += window.consume(n, now, RTT, may_grow)
            consumed += n
        assert window.available == granted - received
        assert 0 <= window.buffered == received - consumed <= window.size
        assert initial <= window.size <= cap
        assert window.unacked < window.size // 2 or window.unacked == 0
