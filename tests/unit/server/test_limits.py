"""The fronts' limits as plain objects: the connection gate, per-client stream slots, the cap
derived from the descriptor limit, and the log throttle."""

from __future__ import annotations

import pytest

from ravenproxy.server.limits import (
    ClientStreams,
    ConnectionGate,
    Throttle,
    client_key,
    front_connection_cap,
)


def test_gate_refuses_past_its_limit_and_gives_slots_back() -> None:
    gate = ConnectionGate(2)
    assert gate.try_enter() and gate.try_enter()
    assert not gate.try_enter()
    assert gate.open == 2
    gate.leave()
    assert gate.try_enter()
    gate.leave()
    gate.leave()
    assert gate.open == 0
    with pytest.raises(RuntimeError):
        gate.leave()
    with pytest.raises(ValueError):
        ConnectionGate(0)


def test_client_streams_are_counted_per_address() -> None:
    streams = ClientStreams(2)
    a1, a2 = streams.acquire("10.0.0.1"), streams.acquire("10.0.0.1")
    assert a1 is not None and a2 is not None
    assert streams.acquire("10.0.0.1") is None
    b = streams.acquire("10.0.0.2")
    assert b is not None
    a1.release()
    a1.release()  # idempotent: a second release does not free someone else's slot
    assert streams.count("10.0.0.1") == 1
    assert streams.acquire("10.0.0.1") is not None
    assert streams.acquire("10.0.0.1") is None


def test_client_table_forgets_addresses_without_streams() -> None:
    streams = ClientStreams(1)
    leases = [streams.acquire(f"10.0.{i // 256}.{i % 256}") for i in range(1000)]
    assert len(streams) == 1000
    for lease in leases:
        assert lease is not None
        lease.release()
    assert len(streams) == 0


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("10.0.0.1", 5555), "10.0.0.1"),
        (("::ffff:10.0.0.1", 5555, 0, 0), "10.0.0.1"),
        (("fd00::1", 5555, 0, 0), "fd00::1"),
        ("", ""),
        (None, "None"),
    ],
)
def test_client_key(peer: object, key: str) -> None:
    assert client_key(peer) == key


@pytest.mark.parametrize(
    ("configured", "fd_limit", "cap"),
    [
        (8192, 20000, 8192),  # the default fits: 8192 x 2 < 20000 - 2500
        (8192, 1024, 448),  # (1024 - 128) / 2
        (8192, 65536, 8192),
        (50, 1024, 50),
        (8192, 100, 18),  # (100 - 64) / 2
        (8192, 10, 1),
        (8192, None, 8192),
    ],
)
def test_front_cap_leaves_descriptors_to_everything_else(
    configured: int, fd_limit: int | None, cap: int
) -> None:
    assert front_connection_cap(configured, fd_limit) == cap


def test_throttle_lets_one_event_a_second_through_and_counts_the_rest() -> None:
    now = [100.0]
    throttle = Throttle(1.0, clock=lambda: now[0])
    assert throttle.allow() == 0
    assert throttle.allow() is None
    now[0] += 0.5
    assert throttle.allow() is None
    now[0] += 0.5
    assert throttle.allow() == 2
    assert throttle.allow() is None
