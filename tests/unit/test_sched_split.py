"""benchmarks/sched_split.py (hops.py ``--sched``): the scheduler's switches and wake-ups read
back, a thread's stretches off CPU, any stretch of its time cut into off-CPU parts, syscalls and
the rest, and a batch's arrival, first and next writes."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.unit.benchscripts import load_script

SCHED = """\
  700  10.000100: sched:sched_switch: prev_comm=python prev_pid=700 prev_prio=120 \
prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
    0  10.000200: sched:sched_wakeup: comm=python pid=700 prio=120 target_cpu=000
    0  10.000250: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 \
prev_state=R ==> next_comm=python next_pid=700 next_prio=120
  700  10.000400: sched:sched_switch: prev_comm=python prev_pid=700 prev_prio=120 \
prev_state=R+ ==> next_comm=Web Content next_pid=900 next_prio=120
  900  10.000450: sched:sched_wakeup: comm=ssh pid=901 prio=120 target_cpu=001
  900  10.000500: sched:sched_switch: prev_comm=Web Content prev_pid=900 prev_prio=120 \
prev_state=S ==> next_comm=python next_pid=700 next_prio=120
  700  10.000600: sched:sched_switch: prev_comm=python prev_pid=700 prev_prio=120 \
prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
    0  10.000700: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 \
prev_state=R ==> next_comm=python next_pid=700 next_prio=120
  700  10.000800: sched:sched_switch: prev_comm=python prev_pid=700 prev_prio=120 \
prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
"""


@pytest.fixture(scope="module")
def split() -> Iterator[ModuleType]:
    yield from load_script("sched_split")


@pytest.fixture(scope="module")
def hops() -> Iterator[ModuleType]:
    yield from load_script("hops")


def test_switches_and_wakeups_are_read_whatever_the_names(split: ModuleType) -> None:
    switches, wakeups = split.parse_sched("noise line\n" + SCHED)
    assert [(s.prev, s.state, s.next) for s in switches[:4]] == [
        (700, "S", 0), (0, "R", 700), (700, "R+", 900), (900, "S", 700),
    ]  # fmt: skip
    assert wakeups == {700: [10.0002], 901: [10.00045]}


def test_a_thread_is_off_cpu_asleep_then_woken_or_preempted(split: ModuleType) -> None:
    switches, wakeups = split.parse_sched(SCHED)
    offs = split.offs(switches, wakeups, 700)
    # Asleep 100..200 µs, woken, on CPU at 250; preempted by 900 at 400..500; asleep again at
    # 600 with no wake-up traced (counted asleep until 700); the last one never ends.
    assert [(round(o.out, 6), round(o.woken, 6), round(o.back, 6), o.preempted, o.by)
            for o in offs] == [
        (10.0001, 10.0002, 10.00025, False, 0),
        (10.0004, 10.0004, 10.0005, True, 900),
        (10.0006, 10.0007, 10.0007, False, 0),
    ]  # fmt: skip


def _line(split: ModuleType, hops: ModuleType) -> object:
    switches, wakeups = split.parse_sched(SCHED)
    Call = hops.Call
    calls = [
        Call(10.00005, 10.00026, hops.TURN, 4, 1, 700),  # the loop's wait, asleep inside
        Call(10.00027, 10.00028, 0, 9, 500, 700),  # the batch comes in on 9
        Call(10.00030, 10.00032, 1, 7, 50, 700),  # first write of the batch, to 7
        Call(10.00039, 10.00051, 1, 8, 50, 700),  # the next, to 8: preempted inside
        Call(10.00055, 10.00056, 1, 6, 50, 700),  # and the next, to 6
    ]
    return split.Timeline(split.offs(switches, wakeups, 700), calls, hops.kinder({6, 7, 8}, {9}))


def test_a_stretch_is_cut_into_parts_that_add_up(split: ModuleType, hops: ModuleType) -> None:
    line = _line(split, hops)
    parts = line.split(10.00005, 10.00051)  # type: ignore[attr-defined]
    us = {k: round(v * 1e6, 3) for k, v in parts.items()}
    assert us == {
        "asleep": 100.0,  # 100..200
        "woken_waiting": 50.0,  # 200..250
        "preempted": 100.0,  # 400..500, inside the write to 8
        "sys:loop wait": 60.0,  # 50..260 less 100 asleep and 50 waiting
        "sys:inbound r": 10.0,
        "sys:batch w": 40.0,  # 300..320 and 390..510 less the 100 preempted
        "user": 100.0,  # 260..270, 280..300, 320..390
    }
    assert round(sum(parts.values()) * 1e6, 3) == 460.0
    # The calls that ended inside (the write ending at its end is the stretch's own).
    made = line.calls_in(10.00005, 10.00051)  # type: ignore[attr-defined]
    assert made == {"loop wait": 1, "inbound r": 1, "batch w": 1}
    assert line.preemptors(10.0, 10.001) == [900]  # type: ignore[attr-defined]
    # Woken at 200, it waited for the idle task to give the CPU back (the sleep at 600 has no
    # wake-up traced: no wait counted).
    assert line.waited_for(10.0, 10.001) == [0]  # type: ignore[attr-defined]


def test_the_state_at_a_moment(split: ModuleType, hops: ModuleType) -> None:
    line = _line(split, hops)
    states = [line.state_at(t) for t in (10.00005, 10.00015, 10.00022, 10.0003, 10.00045)]  # type: ignore[attr-defined]
    assert states == ["on_cpu", "asleep", "woken_waiting", "on_cpu", "preempted"]


def test_a_batch_is_cut_into_arrival_first_and_next_writes(
    split: ModuleType, hops: ModuleType
) -> None:
    line = _line(split, hops)
    reads = {9: [10.00028]}
    batch = [
        (10.00015, 10.00032, 0, 9),  # sent at 150 µs, into a sleeping receiver
        (10.00015, 10.00051, 1, 9),
        (10.00015, 10.00056, 2, 9),
        (10.00058, 10.00059, 0, 9),  # no read of 9 between its send and its write: left out
    ]
    out = split.batch_split(line, batch, reads, {900: "client"}.get)
    arrival, first, after = out["arrival"], out["first"], out["next"]
    assert arrival["n"] == 1 and arrival["mean_us"] == 130.0  # 150..280
    assert arrival["parts_mean_us"]["asleep"] == 50.0  # 150..200
    assert arrival["receiver_at_send"] == {"asleep": 1.0}
    assert first["n"] == 1 and first["mean_us"] == 40.0  # 280..320
    assert first["parts_mean_us"] == {"sys:batch w": 20.0, "user": 20.0}
    # 320..510 (preempted 100, writing 20 on CPU) and 510..560 (writing 10).
    assert after["n"] == 2 and after["mean_us"] == 120.0 and after["p50_us"] == 190.0
    assert after["parts_mean_us"] == {"preempted": 50.0, "sys:batch w": 15.0, "user": 55.0}
    assert after["parts_share"]["preempted"] == 0.5
    assert after["preempted_by"] == {"client": 1}
    # One batch of three writes: its first stretch is filed under 3; no batch write before it
    # in the trace, so under no gap.
    assert out["first_by_batch_size"] == {"3": {"n": 1, "mean_us": 40.0, "user_us": 20.0}}
    assert out["first_by_gap"] == {}
    # A second batch 500 µs after the last write (560 µs): filed under 400-1000 µs.
    line.calls.append(hops.Call(10.00105, 10.00106, 0, 9, 50, 700))  # type: ignore[attr-defined]
    line.calls.append(hops.Call(10.00108, 10.00110, 1, 7, 50, 700))  # type: ignore[attr-defined]
    line.ends += [10.00106, 10.0011]  # type: ignore[attr-defined]
    again = split.batch_split(line, [(10.00104, 10.0011, 0, 9)], {9: [10.00106]}, str)
    assert again["first_by_gap"] == {"400-1000us": {"n": 1, "mean_us": 40.0, "user_us": 20.0}}


def test_the_cpu_is_read_when_given_and_each_name_s_time_on_cpu_is_shared_out(
    split: ModuleType,
) -> None:
    text = """\
    0 [000]     1.000000: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 \
prev_state=R ==> next_comm=python next_pid=700 next_prio=120
  700 [000]     1.300000: sched:sched_switch: prev_comm=python prev_pid=700 prev_prio=120 \
prev_state=S ==> next_comm=python next_pid=701 next_prio=120
  701 [000]     1.400000: sched:sched_switch: prev_comm=python prev_pid=701 prev_prio=120 \
prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
    0 [001]     1.900000: sched:sched_wakeup: comm=python pid=700 prio=120 target_cpu=001
    0 [001]     2.000000: sched:sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 \
prev_state=R ==> next_comm=python next_pid=700 next_prio=120
  700 [001]     2.100000: sched:sched_switch: prev_comm=python prev_pid=700 prev_prio=120 \
prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
    0 [000]     2.100000: sched:sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 \
prev_state=R ==> next_comm=ssh next_pid=900 next_prio=120
"""
    switches, wakeups = split.parse_sched(text)
    assert [(s.cpu, s.prev, s.next) for s in switches] == [
        (0, 0, 700), (0, 700, 701), (0, 701, 0), (1, 0, 700), (1, 700, 0), (0, 0, 900),
    ]  # fmt: skip
    assert wakeups == {700: [1.9]}
    # Over the 1.1 s traced: 700 and its thread 701 0.3 + 0.1 s on CPU 0, 0.1 s on CPU 1; the
    # idle task 0.7 s on CPU 0 (on CPU 1 until 2.0, from a moment before the trace: unknown).
    assert split.placement(switches, {700: "server", 701: "server"}) == {
        "server": {"cpu0": round(0.4 / 1.1, 3), "cpu1": round(0.1 / 1.1, 3)},
        "idle": {"cpu0": round(0.7 / 1.1, 3)},
    }
