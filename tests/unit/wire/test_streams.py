"""The stream state machine as data."""

from __future__ import annotations

import itertools

import pytest

from ravenproxy.wire.streams import TRANSITIONS, Input, State, Stream
from ravenproxy.wire.windows import RecvWindow

S, In = State, Input

NOT_CLOSED = [s for s in State if s is not S.CLOSED]

# The whole table, written out independently of the code under test.
EXPECTED: dict[tuple[State, Input], State] = {
    (S.OPENING_LOCAL, In.RECV_ACCEPT): S.OPEN,
    (S.OPENING_LOCAL, In.RECV_REJECT): S.CLOSED,
    (S.OPENING_REMOTE, In.SEND_ACCEPT): S.OPEN,
    (S.OPENING_REMOTE, In.SEND_REJECT): S.CLOSED,
    (S.OPEN, In.SEND_DATA): S.OPEN,
    (S.OPEN, In.RECV_DATA): S.OPEN,
    (S.OPEN, In.SEND_FIN): S.HALF_CLOSED_LOCAL,
    (S.OPEN, In.RECV_FIN): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_LOCAL, In.RECV_DATA): S.HALF_CLOSED_LOCAL,
    (S.HALF_CLOSED_LOCAL, In.RECV_FIN): S.CLOSED,
    (S.HALF_CLOSED_REMOTE, In.SEND_DATA): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_REMOTE, In.SEND_FIN): S.CLOSED,
    **{(s, In.SEND_RESET): S.CLOSED for s in NOT_CLOSED},
    **{(s, In.RECV_RESET): S.CLOSED for s in NOT_CLOSED},
}


def test_table_is_exactly_as_specified() -> None:
    assert TRANSITIONS == EXPECTED


@pytest.mark.parametrize(
    ("state", "event"), list(itertools.product(State, Input)), ids=lambda v: v.value
)
def test_every_pair_is_in_the_table_or_rejected(state: State, event: Input) -> None:
    stream = Stream(1, state, local=True, recv=RecvWindow(10, 10))
    assert stream.next_state(event) == EXPECTED.get((state, event))


def test_closed_is_terminal() -> None:
    assert not [key for key in TRANSITIONS if key[0] is S.CLOSED]


def test_every_state_can_reach_closed_and_every_state_is_reachable() -> None:
    reachable = {S.OPENING_LOCAL, S.OPENING_REMOTE}
    frontier = list(reachable)
    while frontier:
        state = frontier.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is state and dst not in reachable:
                reachable.add(dst)
                frontier.append(dst)
    assert reachable == set(State)
    for state in NOT_CLOSED:
        assert TRANSITIONS[(state, In.SEND_RESET)] is S.CLOSED


def test_can_send_only_when_our_side_is_open() -> None:
    for state in State:
        stream = Stream(1, state, local=False, recv=RecvWindow(10, 10))
        assert stream.can_send == ((state, In.SEND_DATA) in TRANSITIONS)


def test_a_new_stream_has_no_send_credit_until_the_peer_grants_it() -> None:
    stream = Stream(2, S.OPENING_LOCAL, local=True, recv=RecvWindow(10, 10))
    assert stream.send.available == 0
    assert repr(stream) == "<Stream 2 opening-local>"
