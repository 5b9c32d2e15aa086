"""benchmarks/latency.py's rounds (``--rounds``, ``--warmup``): every rate's rows run once per
round, the order reversed every other round, and a row's figures pool its rounds — percentiles
over all the samples (not a median of the rounds' percentiles), CPU per request = total CPU /
total requests. Real processes: the script's own target, server and agent."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
import uvloop

from tests.unit.benchscripts import BENCHMARKS, cmdline, load_script, needs_ssh, wait_ended

SCRIPT = BENCHMARKS / "latency.py"


@pytest.fixture(scope="module")
def latency() -> Iterator[ModuleType]:
    yield from load_script("latency")


def test_pooled_row_takes_percentiles_over_all_samples_and_cpu_over_all_requests(
    latency: ModuleType,
) -> None:
    # Round 0: 100 fast answers (1 ms); round 1: 100 slow ones (9 ms) and one error.
    a = latency.Row("tunnel", 100, 1.0, [0.001] * 100, [], 1.0, 0.02, [0.01, 0.01])
    b = latency.Row("tunnel", 100, 1.0, [0.009] * 100, ["boom"], 1.0, 0.06, [0.04, 0.02])
    pooled = latency.Row.pooled([a, b]).summary()
    assert pooled["requests"] == 200
    assert pooled["errors"] == 1
    assert pooled["rate_achieved"] == 100.0
    # The median of the two rounds' p99s would be 5 ms; over all samples the p99 is 9 ms, the
    # p50 the slow half's first.
    assert pooled["p99_ms"] == 9.0
    assert pooled["p50_ms"] == 9.0
    assert pooled["p90_ms"] == 9.0
    assert latency.Row.pooled([a]).summary()["p99_ms"] == 1.0
    # 0.08 s over 200 requests, not the mean of 200 and 600 µs per request by chance alone.
    assert pooled["relay_cpu_us_per_request"] == 400.0
    assert pooled["relay_cpu_us_per_request_by_process"] == [250.0, 150.0]


def test_pooled_row_drops_per_process_cpu_when_the_processes_differ(latency: ModuleType) -> None:
    a = latency.Row("ssh", 100, 1.0, [0.001] * 10, [], 1.0, 0.03, [0.01, 0.02])
    b = latency.Row("ssh", 100, 1.0, [0.001] * 10, [], 1.0, 0.03, [0.01, 0.01, 0.01])
    summary = latency.Row.pooled([a, b]).summary()
    assert summary["relay_cpu_us_per_request"] == 3000.0
    assert summary["relay_cpu_us_per_request_by_process"] == []


@pytest.mark.serial  # a real latency.py run at fixed rates: no request may miss its round
def test_rounds_alternate_the_order_and_the_rows_pool_them(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    args = [
        sys.executable, str(SCRIPT), "--rates", "200,300", "--seconds", "0.3", "--rounds", "3,2",
        "--warmup", "0.2", "--no-ssh", "--output", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the script stops its processes on SIGTERM
            proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    settings = result["settings"]
    # --rounds per rate: 3 at 200 req/s, 2 at 300
    assert (settings["rounds"], settings["warmup_seconds_per_row"]) == ([3, 2], 0.2)
    counts = {200: 3, 300: 2}
    assert [(r["path"], r["rate_target"]) for r in result["rows"]] == [
        (path, rate) for rate in (200, 300) for path in ("direct", "tunnel", "tunnel-connect")
    ]
    for row in result["rows"]:
        assert row["errors"] == 0, row
        rounds, n = row["rounds"], counts[row["rate_target"]]
        assert [r["round"] for r in rounds] == list(range(n))
        first = ("direct", "tunnel", "tunnel-connect").index(row["path"])
        assert [r["position"] for r in rounds] == [first, 2 - first, first][:n]
        assert (
            row["requests"]
            == sum(r["requests"] for r in rounds)
            == n * int(row["rate_target"] * 0.3)
        )
        lows, highs = min(r["p50_ms"] for r in rounds), max(r["p50_ms"] for r in rounds)
        assert lows <= row["p50_ms"] <= highs
        assert row["max_ms"] == max(r["max_ms"] for r in rounds)
        if row["path"] != "direct":
            cpu = sum(r["relay_cpu_us_per_request"] * r["requests"] for r in rounds)
            assert row["relay_cpu_us_per_request"] == pytest.approx(cpu / row["requests"], abs=0.2)
            ratios = sorted(r["relay_cpu_per_client_cpu"] for r in rounds)
            # (a relay may read 0: its CPU is in 10 ms ticks, a 0.3 s round holds a few)
            assert ratios[0] >= 0
            # the median (of 2 rounds: their mean, to 3 decimals)
            median = statistics.median(ratios)
            assert row["relay_cpu_per_client_cpu"] == pytest.approx(median, abs=0.0006)
    added = {e["rate"]: e for e in result["added_latency"]}
    assert set(added) == {200, 300}
    assert set(added[200]) == {"rate", "tunnel", "tunnel-connect"}
    # No ssh row and no baseline: nothing to pair with.
    assert result["paired"] == [{"rate": 200}, {"rate": 300}]
    assert added[200]["tunnel"]["relay_cpu_per_client_cpu"] == next(
        r["relay_cpu_per_client_cpu"]
        for r in result["rows"]
        if (r["path"], r["rate_target"]) == ("tunnel", 200)
    )


def test_summary_names_the_stall_and_keeps_its_samples(latency: ModuleType) -> None:
    # 99 answers of 1 ms, one of 80 ms due 4.95 s into the row (the ssh -N stall's shape).
    due = [i * 0.05 for i in range(100)]
    lat = [0.001] * 100
    lat[99] = 0.080
    row = latency.Row("ssh-N", 20, 5.0, lat, [], 5.0, due=due)
    summary = row.summary()
    assert (summary["max_ms"], summary["over_10x_p50"], summary["max_at_s"]) == (80.0, 1, 4.95)
    assert summary["requests"] == 100  # not dropped
    pooled = latency.Row.pooled([latency.Row("ssh-N", 20, 5.0, [0.001] * 100, due=due), row])
    assert pooled.summary()["max_at_s"] == 4.95
    assert pooled.summary()["over_10x_p50"] == 1


def test_rate_achieved_counts_only_the_timed_window(latency: ModuleType) -> None:
    """A path that keeps up reads the offered rate: the 0.05 s lead-in before the first
    request is due is not part of the row (a 0.25 s row read 0.84 of its rate with it)."""

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        answers = latency._Answers(True)  # varied, as the benchmark's default
        server = await loop.create_server(lambda: latency._Target(answers), "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            row = await latency.run_row("direct", port, f"127.0.0.1:{port}", 400, 0.25, 4)
            return cast(dict[str, Any], row.summary())
        finally:
            server.close()
            await server.wait_closed()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        summary = runner.run(main())
    assert summary["requests"] == 100
    assert 0.95 * 400 <= summary["rate_achieved"] <= 400


@needs_ssh
def test_ssh_rows_forward_and_leave_no_process_behind(latency: ModuleType, tmp_path: Path) -> None:
    """Both ssh rows' forwards answer, the ``ssh`` row's runs its session (the remote command,
    under sshd), and stopping the processes ends that command too (a ``sleep`` outlived it)."""
    procs = latency.Procs(tmp_path)
    try:
        target = latency.start_target(tmp_path, procs)
        rports, pids, _ = latency.start_ssh(tmp_path, procs, target, no_session=True)
        assert len(rports) == 2 and len(pids) == 3
        for rport in rports:
            with socket.create_connection(("127.0.0.1", rport), timeout=10) as s:
                s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
        deadline = time.monotonic() + 10
        while not (commands := [cmdline(p) for p in latency.with_descendants(pids[:1])]) or not any(
            "tail" in c for c in commands
        ):
            assert time.monotonic() < deadline, commands
            time.sleep(0.05)
        started = latency.with_descendants(pids)
    finally:
        procs.stop()
    wait_ended(started)


def test_interpreter_names_the_version_and_the_executable_a_venv_links_to(
    latency: ModuleType, tmp_path: Path
) -> None:
    """A baseline's relays may run on another build of Python (a venv made from another
    interpreter): the results name which, through the venv's link."""
    link = tmp_path / "python"
    link.symlink_to(sys.executable)
    real = os.path.realpath(sys.executable)
    assert latency._interpreter(str(link)) == f"{platform.python_version()} {real}"


@pytest.mark.parametrize("vary", [False, True], ids=["same", "varied"])
def test_varied_requests_ask_for_a_query_that_changes_every_request(
    latency: ModuleType, vary: bool
) -> None:
    """``--request varied``: request i asks for ``/ping?n=i`` (each one differs from the last,
    so a server parses and routes it anew), warm-ups included; ``same``: ``/ping`` every
    time. The request lines as the target received them."""
    lines: list[bytes] = []

    class Recording(latency._Target):  # type: ignore[name-defined]
        def data_received(self, data: bytes) -> None:
            lines.extend(part.split(b"\r\n", 1)[0] for part in data.split(b"\r\n\r\n") if part)
            super().data_received(data)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        answers = latency._Answers(True)
        server = await loop.create_server(lambda: Recording(answers), "127.0.0.1", 0)
        try:
            port = server.sockets[0].getsockname()[1]
            row = await latency.run_row(
                "direct", port, f"127.0.0.1:{port}", 400, 0.05, 2, warmup=0.02, vary=vary
            )
            assert len(row.latencies) == 20 and not row.errors
        finally:
            server.close()
            await server.wait_closed()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    # 2 connection warm-ups (the plain request), then 8 warm-up requests and 20 timed ones
    # (numbered from 0 each: the schedule's i), over 2 connections (interleaved: sorted).
    assert lines[:2] == [b"GET /ping HTTP/1.1"] * 2
    if vary:
        numbers = [*range(8), *range(20)]
        expected = sorted(b"GET /ping?n=%d HTTP/1.1" % i for i in numbers)
    else:
        expected = [b"GET /ping HTTP/1.1"] * 28
    assert sorted(lines[2:]) == expected
