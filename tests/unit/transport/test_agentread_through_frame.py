"""agentread: :meth:`Outlet._write_through` makes the frame of a small write inline (a call less
a request, on both ends) instead of calling :func:`one_frame`: the same bytes, masked (the
agent) or not (the server), for every payload size it writes through, with the same masking
key drawn the same way (from the pool, or from the OS once the pool is used up)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ravenproxy.transport import frame_batch, outlet
from ravenproxy.transport.frame_batch import TABLED, one_frame
from ravenproxy.transport.outlet import THROUGH, Outlet
from ravenproxy.wire.frames import HEADER_SIZE


def _through(server_side: bool, head: bytes, data: bytes) -> bytes:
    """What ``_write_through`` writes for ``data`` (the wire's header ``head``), through."""
    written: list[bytes] = []
    session: Any = SimpleNamespace(
        _wake=False,
        _deferred=False,
        _wake_writer=object(),
        _held=None,
        _gate=SimpleNamespace(data_closed=False),
        ws=SimpleNamespace(paused=False, transport=SimpleNamespace(write=written.append)),
        conn=SimpleNamespace(
            send_small_on=lambda stream, data, limit: head, server_side=server_side
        ),
        _probe=SimpleNamespace(soon=False, seen=False, poll=lambda timeout, n: []),
        _taken=SimpleNamespace(waiter=None),
        _drain_event=SimpleNamespace(waiter=None),
    )
    assert Outlet._write_through(session, None, data) is True
    assert len(written) == 1
    return written[0]


@given(
    st.booleans(),
    st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE),
    st.integers(1, THROUGH),
    st.binary(min_size=4, max_size=4),
    st.booleans(),
)
@example(False, b"h" * HEADER_SIZE, TABLED - HEADER_SIZE - 1, b"kkkk", False)
@example(False, b"h" * HEADER_SIZE, TABLED - HEADER_SIZE, b"kkkk", True)
@example(True, b"h" * HEADER_SIZE, TABLED - HEADER_SIZE, b"kkkk", False)
@example(True, b"h" * HEADER_SIZE, THROUGH, b"kkkk", False)
def test_the_frame_written_through_is_one_frames(
    server_side: bool, head: bytes, n: int, key: bytes, pool_used_up: bool
) -> None:
    data = bytes(range(256)) * (n // 256) + bytes(range(n % 256))

    def empty() -> bytes:
        raise IndexError("pop from empty list")

    with pytest.MonkeyPatch.context() as mp:
        for module, pop, more in (
            (outlet, "pop_key", "more_keys"),
            (frame_batch, "_pop_key", "_more_keys"),
        ):
            mp.setattr(module, pop, empty if pool_used_up else lambda: key)
            mp.setattr(module, more, lambda: key)
        expected = one_frame(head, data, not server_side)
        got = _through(server_side, head, data)
    assert expected is not None
    assert got == expected
