"""benchmarks/hops.py's reading of a trace: perf script's enter/exit lines paired per thread,
connections put in the order they were made (the local port's, turned at a wrap), a request
chained through its steps, and its place in its process's loop turn."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.unit.benchscripts import load_script

SCRIPT = """\
  700/701  10.000100: raw_syscalls:sys_enter: NR 0 (12, 7f00, 40000, 0, 0, 0)
  700/702  10.000110: raw_syscalls:sys_enter: NR 1 (d, 7f00, 60, 0, 0, 0)
  700/701  10.000130:  raw_syscalls:sys_exit: NR 0 = 109
  700/702  10.000150:  raw_syscalls:sys_exit: NR 1 = 96
  700/701  10.000160: raw_syscalls:sys_enter: NR 281 (4, 7f00, 400, ffffffff, 0, 8)
  700/701  10.000900:  raw_syscalls:sys_exit: NR 281 = 1
  900/900  10.000200:  raw_syscalls:sys_exit: NR 1 = 5
"""


@pytest.fixture(scope="module")
def hops() -> Iterator[ModuleType]:
    yield from load_script("hops")


def test_enters_and_exits_pair_by_thread_and_an_exit_without_its_enter_is_dropped(
    hops: ModuleType,
) -> None:
    calls = hops.parse_script(SCRIPT)
    assert list(calls) == [700]  # 900's exit has no enter in the trace
    read, write, wait = calls[700]
    assert (read.nr, read.fd, read.ret, read.kind) == (0, 0x12, 109, "r")
    assert (read.start, read.end) == (10.0001, 10.00013)
    assert (write.fd, write.ret, write.kind) == (0xD, 96, "w")  # hex, another thread between
    assert (wait.nr, wait.end) == (hops.TURN, 10.0009)


def test_connections_come_in_the_order_made_across_a_wrap_of_the_port_range(
    hops: ModuleType,
) -> None:
    Sock = hops.Sock
    # pid 1 dialled pid 2 four times: ports 60990, 60998, then wrapped to 32770, 32782.
    socks = {
        1: {5: Sock(32782, 80), 6: Sock(60990, 80), 7: Sock(32770, 80), 8: Sock(60998, 80),
            9: Sock(40000, 0)},  # a listener: no peer
        2: {20: Sock(80, 32770), 21: Sock(80, 60998), 22: Sock(80, 32782), 23: Sock(80, 60990),
            24: Sock(80, 11111)},  # another process's connection
    }  # fmt: skip
    assert hops.connected(socks, 1, 2, (32768, 60999)) == [(6, 23), (8, 21), (7, 20), (5, 22)]
    # No wrap: in port order.
    del socks[1][5], socks[1][7]
    assert hops.connected(socks, 1, 2, (32768, 60999)) == [(6, 23), (8, 21)]


def test_a_request_is_chained_through_the_first_call_of_each_step_after_the_last(
    hops: ModuleType,
) -> None:
    steps = [[0.5, 1.5, 2.5], [1.6, 2.6], [0.1, 1.7]]
    # From 1.0: 1.5, then 1.6, then 1.7; from 2.0: 2.5, 2.6, then nothing left: not chained.
    assert hops.chain([1.0, 2.0], steps) == [[1.0, 1.5, 1.6, 1.7]]


def test_the_position_counts_like_calls_on_the_batch_sockets_since_the_loop_woke(
    hops: ModuleType,
) -> None:
    Call, TURN = hops.Call, hops.TURN
    calls = [
        Call(0.0, 1.0, 1, 7, 50),  # a write before the turn: not counted
        Call(1.0, 2.0, TURN, 4, 3),
        Call(2.0, 2.1, 1, 7, 50),  # a write to a batch socket
        Call(2.1, 2.2, 1, 9, 50),  # a write to another socket (the tunnel): not counted
        Call(2.2, 2.3, 0, 7, 20),  # a read: not counted
        Call(2.3, 2.4, 1, 8, -11),  # a failed write: not counted
        Call(2.4, 2.5, 1, 8, 50),  # a write to a batch socket
        Call(2.5, 2.6, 1, 6, 50),  # ours
    ]
    ends = [c.end for c in calls]
    assert hops.position(calls, ends, 2.6, {6, 7, 8}, "w") == 2
    assert hops.position(calls, ends, 2.1, {6, 7, 8}, "w") == 0


@pytest.mark.parametrize(("argv", "vary"), [([], False), (["--request", "varied"], True)])
def test_request_varied_reaches_the_rows_as_latency_s_varied_requests(
    hops: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str], vary: bool
) -> None:
    """``--request varied`` (default same) is handed to latency.run_row as ``vary``: the row
    asks for ``/ping?n=I``. The processes are stood in for; the row's call is caught."""
    args = hops.parser().parse_args(["--ways", "floor", "--rates", "1000", *argv])
    assert args.request == ("varied" if vary else "same")
    seen: dict[str, Any] = {}

    class Caught(Exception):
        pass

    async def run_row(*_: object, **kwargs: object) -> None:
        seen.update(kwargs)
        raise Caught

    lat = hops.latency
    procs = SimpleNamespace(procs=[SimpleNamespace(pid=1)], stop=lambda: None)
    monkeypatch.setattr(lat, "Procs", lambda base: procs)
    monkeypatch.setattr(lat, "start_target", lambda base, procs, answer: 2)
    monkeypatch.setattr(lat, "start_floor", lambda base, procs, port: (3, [4, 5]))
    monkeypatch.setattr(lat, "run_row", run_row)
    with pytest.raises(Caught):
        asyncio.run(hops._run(args, tmp_path))
    assert seen["vary"] is vary
