"""benchmarks/paired.py, latency.py's paired ratios: each round's figure over the ssh row's (or
tunnel-base's) of the same round, per rate their median, min-max and the order statistics'
interval for the median, and a goal's verdict from it; ``--rounds`` per rate and ``--pool``
over several results. From given rows and numbers: no processes but the script's own."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.benchscripts import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "latency.py"


@pytest.fixture(scope="module")
def paired() -> Iterator[ModuleType]:
    yield from load_script("paired")


@pytest.fixture(scope="module")
def latency() -> Iterator[ModuleType]:
    yield from load_script("latency")


# -- the interval -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, None),
        (5, None),  # [min, max] of 5 holds the median 93.75 % of the time: short of 95
        (6, (1, 0.96875)),
        (8, (1, 0.9921875)),  # k = 2 would be 0.9296875
        (9, (2, 0.9609375)),
        (12, (3, 0.96142578125)),
        (20, (6, 0.9586105346679688)),
    ],
)
def test_median_interval_known_ranks(
    paired: ModuleType, n: int, expected: tuple[int, float] | None
) -> None:
    assert paired.median_interval(n) == expected


@given(st.integers(1, 60), st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]))
def test_median_interval_is_the_largest_rank_that_keeps_the_coverage(
    paired: ModuleType, n: int, confidence: float
) -> None:
    """Against the binomial written out: coverage(k) = P(k <= B <= n - k), B ~ Bin(n, 1/2)."""

    def coverage(k: int) -> float:
        return sum(math.comb(n, j) for j in range(k, n - k + 1)) / 2**n

    found = paired.median_interval(n, confidence)
    ranks = [k for k in range(1, (n + 1) // 2 + 1) if coverage(k) >= confidence]
    if not ranks:
        assert found is None
    else:
        assert found is not None
        assert found[0] == max(ranks)
        assert found[1] == pytest.approx(coverage(found[0]))


@pytest.mark.parametrize("draw", ["uniform", "lognormal", "two-humps"])
def test_the_interval_holds_the_median_as_often_as_it_says(paired: ModuleType, draw: str) -> None:
    """Distribution-free: 12 draws' [x_(3), x_(10)] holds the true median 96.1 % of the time
    whatever the distribution (3 000 trials: ±1.1 % at 3 SD)."""
    rng = random.Random(15)
    draws = {
        "uniform": (lambda: rng.uniform(1.0, 3.0), 2.0),
        "lognormal": (lambda: rng.lognormvariate(0.5, 0.6), math.exp(0.5)),
        "two-humps": (lambda: rng.choice((1.0, 2.0)) + rng.uniform(-0.1, 0.1), 1.5),
    }
    sample, median = draws[draw]
    trials, held = 3000, 0
    for _ in range(trials):
        s = paired.spread([sample() for _ in range(12)])
        held += s["interval"][0] <= median <= s["interval"][1]
    assert abs(held / trials - 0.9614) < 0.011


def test_spread_of_twelve_rounds(paired: ModuleType) -> None:
    values = [7.0, None, 1.0, 12.0, 3.0, 5.0, 9.0, 2.0, 11.0, 4.0, 8.0, 6.0, 10.0]
    s = paired.spread(values)
    assert s["by_round"] == values
    assert (s["n"], s["missing"]) == (12, 1)
    assert (s["median"], s["min"], s["max"]) == (6.5, 1.0, 12.0)
    assert s["interval"] == [3.0, 10.0]
    assert s["coverage"] == 0.961


def test_spread_of_few_or_no_rounds(paired: ModuleType) -> None:
    few = paired.spread([1.2, 1.0, 1.4])
    assert (few["median"], few["min"], few["max"]) == (1.2, 1.0, 1.4)
    assert few["interval"] is None and few["coverage"] is None
    none = paired.spread([None, None])
    assert (none["n"], none["missing"], none["median"], none["interval"]) == (0, 2, None, None)


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        ([1.1, 1.5], "met"),  # at the goal counts as met (the goal: at most 1.5x)
        ([1.51, 1.9], "not met"),
        ([1.5, 1.9], "not resolvable"),
        ([1.2, 1.7], "not resolvable"),
        (None, "not resolvable"),
    ],
)
def test_verdict(paired: ModuleType, interval: list[float] | None, expected: str) -> None:
    assert paired.verdict({"interval": interval}, 1.5) == expected


# -- pairing rows by round ------------------------------------------------------------------
def rounds_of(**figures: list[float]) -> list[dict[str, Any]]:
    """A row's ``rounds`` from lists of each figure by round."""
    n = len(next(iter(figures.values())))
    return [{key: values[i] for key, values in figures.items()} for i in range(n)]


def rows_at(rate: int, **paths: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"path": name.replace("_", "-"), "rate_target": rate, "rounds": rounds}
        for name, rounds in paths.items()
    ]


def six_rounds(rate: int = 4000) -> list[dict[str, Any]]:
    """Six rounds at ``rate`` in which the machine's speed moves every row alike: direct's
    p50/p99 and ssh's added p50/p99 and CPU change from round to round, and the tunnel's are
    ssh's times 1.4 (p50), 1.8 (p99) and 1.6 (CPU) in every round; tunnel-base's 1.25 times
    the tunnel's CPU."""
    direct_p50 = [0.14, 0.16, 0.13, 0.15, 0.14, 0.17]
    direct_p99 = [0.30, 0.35, 0.28, 0.33, 0.31, 0.36]
    ssh_added_p50 = [0.20, 0.24, 0.19, 0.23, 0.21, 0.25]
    ssh_added_p99 = [0.287, 0.45, 0.47, 0.46, 0.30, 0.44]  # the ssh row's p99 moves most
    ssh_cpu = [60.0, 68.0, 61.0, 65.0, 59.0, 70.0]
    direct = rounds_of(p50_ms=direct_p50, p99_ms=direct_p99)
    ssh = rounds_of(
        p50_ms=[d + a for d, a in zip(direct_p50, ssh_added_p50, strict=True)],
        p99_ms=[d + a for d, a in zip(direct_p99, ssh_added_p99, strict=True)],
        relay_cpu_us_per_request=ssh_cpu,
        relay_cpu_per_client_cpu=[1.0] * 6,
    )
    tunnel = rounds_of(
        p50_ms=[d + 1.4 * a for d, a in zip(direct_p50, ssh_added_p50, strict=True)],
        p99_ms=[d + 1.8 * a for d, a in zip(direct_p99, ssh_added_p99, strict=True)],
        relay_cpu_us_per_request=[1.6 * c for c in ssh_cpu],
        relay_cpu_per_client_cpu=[1.5] * 6,
    )
    base = [{**r, "relay_cpu_us_per_request": r["relay_cpu_us_per_request"] * 1.25} for r in tunnel]
    return rows_at(rate, direct=direct, ssh=ssh, tunnel=tunnel, tunnel_base=base)


def test_a_rounds_ratio_divides_out_what_the_machine_did_in_that_round(paired: ModuleType) -> None:
    out = paired.paired(six_rounds(), 4000)
    vs_ssh = out["tunnel"]["vs_ssh"]
    for key, ratio in (
        ("added_p50_ms", 1.4),
        ("added_p99_ms", 1.8),
        ("relay_cpu_us_per_request", 1.6),
        ("relay_cpu_per_client_cpu", 1.5),
    ):
        s = vs_ssh[key]
        assert s["by_round"] == pytest.approx([ratio] * 6, abs=0.002), key
        assert s["median"] == pytest.approx(ratio, abs=0.002)
        assert s["interval"] == pytest.approx([ratio, ratio], abs=0.002)
        assert s["coverage"] == 0.969
    assert (vs_ssh["added_p50_ms"]["goal"], vs_ssh["added_p50_ms"]["verdict"]) == (1.5, "met")
    assert (vs_ssh["added_p99_ms"]["goal"], vs_ssh["added_p99_ms"]["verdict"]) == (2.0, "met")
    assert vs_ssh["relay_cpu_us_per_request"]["verdict"] == "met"
    assert "goal" not in vs_ssh["relay_cpu_per_client_cpu"]
    # tunnel-base's CPU is 1.25x the tunnel's: the tunnel reads 0.8 of it, the base 2.0x ssh's
    # (at the goal: met).
    assert out["tunnel"]["vs_base"]["relay_cpu_us_per_request"]["by_round"] == [0.8] * 6
    assert out["tunnel"]["vs_base"]["added_p50_ms"]["median"] == 1.0
    base_cpu = out["tunnel-base"]["vs_ssh"]["relay_cpu_us_per_request"]
    assert (base_cpu["median"], base_cpu["verdict"]) == (2.0, "met")
    assert "vs_base" not in out["tunnel-base"]
    assert set(out) == {"tunnel", "tunnel-base"}


def test_the_connect_row_is_paired_with_its_baselines_connect_row(paired: ModuleType) -> None:
    """With ``--baseline``, ``tunnel-connect`` has its own base row (``tunnel-connect-base``):
    paired with it as ``tunnel`` is with ``tunnel-base``, and both over ssh."""
    rows = six_rounds()
    by_path = {r["path"]: r["rounds"] for r in rows}
    connect = [
        {**r, "relay_cpu_us_per_request": r["relay_cpu_us_per_request"] * 0.5}
        for r in by_path["tunnel"]
    ]
    connect_base = [
        {**r, "relay_cpu_us_per_request": r["relay_cpu_us_per_request"] * 0.6}
        for r in by_path["tunnel"]
    ]
    rows += rows_at(4000, tunnel_connect=connect, tunnel_connect_base=connect_base)
    out = paired.paired(rows, 4000)
    cpu = out["tunnel-connect"]["vs_base"]["relay_cpu_us_per_request"]
    assert cpu["by_round"] == pytest.approx([0.5 / 0.6] * 6, abs=0.002)
    assert out["tunnel-connect-base"]["vs_ssh"]["relay_cpu_us_per_request"]["median"] == (
        pytest.approx(1.6 * 0.6, abs=0.002)
    )
    assert "vs_base" not in out["tunnel-connect-base"]


def test_the_pooled_ratio_and_the_paired_one_differ_when_the_ssh_row_moves(
    paired: ModuleType,
) -> None:
    """Three rounds where ssh's added p99 is low (0.3 ms) and three where it is high (0.6):
    the tunnel's p99 is the same 1 ms every round. The paired ratios are 3.33 and 1.67: their
    interval spans the goal (not resolvable), where one run's ratio would read either."""
    direct = rounds_of(p50_ms=[0.1] * 6, p99_ms=[0.2] * 6)
    ssh = rounds_of(p50_ms=[0.3] * 6, p99_ms=[0.5, 0.8, 0.5, 0.8, 0.5, 0.8])
    tunnel = rounds_of(p50_ms=[0.4] * 6, p99_ms=[1.2] * 6)
    out = paired.paired(rows_at(4000, direct=direct, ssh=ssh, tunnel=tunnel), 4000)
    p99 = out["tunnel"]["vs_ssh"]["added_p99_ms"]
    assert p99["by_round"] == [3.333, 1.667] * 3
    assert p99["interval"] == [1.667, 3.333]
    assert p99["verdict"] == "not resolvable"
    assert out["tunnel"]["vs_ssh"]["added_p50_ms"]["by_round"] == [1.5] * 6
    assert "vs_base" not in out["tunnel"]


def test_a_round_without_a_ratio_is_left_out_and_counted(paired: ModuleType) -> None:
    """ssh's row added nothing in round 1 (its p50 at direct's) and round 2 has no CPU figure:
    those rounds have no ratio."""
    direct = rounds_of(p50_ms=[0.1, 0.1, 0.1], p99_ms=[0.2, 0.2, 0.2])
    ssh = rounds_of(
        p50_ms=[0.3, 0.1, 0.3], p99_ms=[0.5, 0.5, 0.5], relay_cpu_us_per_request=[50.0, 50.0, 0]
    )
    tunnel = rounds_of(
        p50_ms=[0.4, 0.4, 0.4], p99_ms=[0.8, 0.8, 0.8], relay_cpu_us_per_request=[80.0, 90.0, 70.0]
    )
    ssh[2]["relay_cpu_us_per_request"] = None
    out = paired.paired(rows_at(1000, direct=direct, ssh=ssh, tunnel=tunnel), 1000)["tunnel"]
    p50 = out["vs_ssh"]["added_p50_ms"]
    assert p50["by_round"] == [1.5, None, 1.5]
    assert (p50["n"], p50["missing"]) == (2, 1)
    assert out["vs_ssh"]["relay_cpu_us_per_request"]["by_round"] == [1.6, 1.8, None]
    assert out["vs_ssh"]["relay_cpu_per_client_cpu"]["by_round"] == [None] * 3


def test_quiet_rounds_leave_out_the_rounds_other_processes_loaded(paired: ModuleType) -> None:
    """Eight rounds; in rounds 1 and 2 another process took a core during the ssh row, in
    round 3 during direct's, in round 4 steal did, and round 5 has no noise sample. The tunnel
    reads 2.6x ssh in those (the Python relays lose more to the load than ssh does), 1.4x in
    the three quiet ones: all rounds cannot resolve the goal, the quiet ones can, and say
    which they were."""
    noise = [(0.0, 0.0), (1.0, 0.0), (1.1, 0.0), (0.0, 0.0), (0.0, 0.1), (None, None)]
    noise += [(0.05, 0.0), (0.0, 0.0)]
    direct = rounds_of(p50_ms=[0.1] * 8, p99_ms=[0.2] * 8)
    ssh = rounds_of(p50_ms=[0.3] * 8, p99_ms=[0.5] * 8)
    tunnel = rounds_of(p50_ms=[0.38, 0.62, 0.62, 0.62, 0.62, 0.62, 0.38, 0.38], p99_ms=[0.8] * 8)
    for i, (others, steal) in enumerate(noise):
        ssh[i].update(others_cpu_cores=others, steal_cores=steal)
        tunnel[i].update(others_cpu_cores=0.0, steal_cores=0.0)
        direct[i].update(others_cpu_cores=0.0, steal_cores=0.0)
    direct[3]["others_cpu_cores"] = 0.4
    out = paired.paired(rows_at(4000, direct=direct, ssh=ssh, tunnel=tunnel), 4000)
    p50 = out["tunnel"]["vs_ssh"]["added_p50_ms"]
    assert p50["by_round"] == [1.4, 2.6, 2.6, 2.6, 2.6, 2.6, 1.4, 1.4]
    assert (p50["n"], p50["interval"], p50["verdict"]) == (8, [1.4, 2.6], "not resolvable")
    quiet = p50["quiet"]
    assert quiet["quiet_rounds"] == [0, 6, 7]
    assert (quiet["n"], quiet["median"], quiet["by_round"]) == (3, 1.4, [1.4, 1.4, 1.4])
    assert quiet["interval"] is None and quiet["verdict"] == "not resolvable"  # 3 rounds: none
    # With six more quiet rounds like them, the quiet ones resolve it.
    more = {
        name: rounds + [rounds[0]] * 6
        for name, rounds in (("direct", direct), ("ssh", ssh), ("tunnel", tunnel))
    }
    quiet = paired.paired(rows_at(4000, **more), 4000)["tunnel"]["vs_ssh"]["added_p50_ms"]["quiet"]
    assert (quiet["n"], quiet["interval"], quiet["verdict"]) == (9, [1.4, 1.4], "met")
    assert "quiet" in out["tunnel"]["vs_ssh"]["relay_cpu_per_client_cpu"]
    assert "goal" not in out["tunnel"]["vs_ssh"]["relay_cpu_per_client_cpu"]["quiet"]


def test_no_ssh_row_and_no_base_no_comparison(paired: ModuleType) -> None:
    direct = rounds_of(p50_ms=[0.1], p99_ms=[0.2])
    tunnel = rounds_of(p50_ms=[0.4], p99_ms=[0.8])
    assert paired.paired(rows_at(1000, direct=direct, tunnel=tunnel), 1000) == {}
    assert paired.paired(rows_at(1000, direct=direct, tunnel=tunnel), 2000) == {}


def test_merge_rows_puts_the_results_rounds_one_after_the_other(paired: ModuleType) -> None:
    a = {"rows": six_rounds()[:3] + six_rounds(1000)[:2]}
    b = {"rows": six_rounds()}  # no 1000 req/s rows, and a tunnel-base row a lacks
    merged = paired.merge_rows([a, b])
    assert [(r["path"], r["rate_target"]) for r in merged] == [
        ("direct", 4000),
        ("ssh", 4000),
        ("tunnel", 4000),
    ]
    assert all(len(r["rounds"]) == 12 for r in merged)
    assert merged[1]["rounds"] == six_rounds()[1]["rounds"] * 2
    out = paired.paired(merged, 4000)["tunnel"]["vs_ssh"]["added_p99_ms"]
    assert (out["n"], out["coverage"]) == (12, 0.961)
    assert paired.merge_rows([]) == []


def test_describe_prints_the_interval_and_the_verdict(paired: ModuleType) -> None:
    lines = paired.describe([{"rate": 4000, **paired.paired(six_rounds(), 4000)}])
    line = next(x for x in lines if " tunnel " in x and "vs_ssh" in x and "added_p99_ms" in x)
    assert " all   median 1.80 [1.80, 1.80] (96.9 %) min-max 1.80-1.80 n=6" in line
    # The rows have no noise sample: no round is quiet, no quiet line.
    assert not any(" quiet " in x for x in lines)
    assert line.endswith("goal <= 2: met")
    two = [{**row, "rounds": row["rounds"][:2]} for row in six_rounds()]
    lines = paired.describe([{"rate": 4000, **paired.paired(two, 4000)}])
    assert any("no interval (too few rounds)" in x and "not resolvable" in x for x in lines)


# -- latency.py: --rounds per rate, the result's ``paired``, the plot, --pool ------------------
def test_rounds_by_rate(latency: ModuleType) -> None:
    assert latency.rounds_by_rate(3, [1000, 4000]) == [3, 3]
    assert latency.rounds_by_rate([3], [1000, 4000]) == [3, 3]
    assert latency.rounds_by_rate([2, 12], [1000, 4000]) == [2, 12]
    with pytest.raises(ValueError, match="3 counts for 2 rates"):
        latency.rounds_by_rate([1, 2, 3], [1000, 4000])
    assert latency._rounds_argument("4") == 4
    assert latency._rounds_argument("2,2,12") == [2, 2, 12]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rates", "1000,4000", "--rounds", "2,3,4"], "--rounds gives 3 counts for 2 rates"),
        (["--rounds", "2,0,2"], "every round count must be at least 1"),
    ],
)
def test_bad_rounds_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert message in proc.stderr


def result_of(latency: ModuleType, rows: list[dict[str, Any]], rates: list[int]) -> dict[str, Any]:
    """A latency.py result from rows of rounds (the pooled figures taken from round 0)."""
    full = [
        {
            **row["rounds"][0],
            "path": row["path"],
            "rate_target": row["rate_target"],
            "rate_achieved": float(row["rate_target"]),
            "relay_cpu_us_per_request": row["rounds"][0].get("relay_cpu_us_per_request"),
            "rounds": row["rounds"],
        }
        for row in rows
    ]
    return {
        "date": "2026-12-05T18:00:00+00:00",
        "machine": {"git_commit": "f667209"},
        "settings": {"rates": rates, "rounds": 6, "connections": 16, "seconds_per_row": 5.0},
        "rows": full,
        "added_latency": latency.compare(full, rates),
        "paired": [{"rate": rate, **latency.paired(full, rate)} for rate in rates],
    }


def test_the_plot_shows_the_paired_panel(latency: ModuleType, tmp_path: Path) -> None:
    rows = six_rounds(1000) + six_rounds(4000)
    result = result_of(latency, rows, [1000, 4000])
    png = tmp_path / "latency.png"
    latency.plot(result, png)
    assert png.stat().st_size > 0
    # one rate, no ssh row: the panel is empty, the plot still drawn
    lone = result_of(latency, [r for r in six_rounds(4000) if r["path"] != "ssh"], [4000])
    latency.plot({**lone, "settings": {**lone["settings"], "rounds": [6]}}, png)


def test_pool_reads_several_results_and_pairs_all_their_rounds(
    latency: ModuleType, tmp_path: Path
) -> None:
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(result_of(latency, six_rounds(), [4000])))
    second.write_text(json.dumps(result_of(latency, six_rounds(), [4000])))
    out = tmp_path / "pooled.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--pool", str(first), str(second), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    pooled = json.loads(out.read_text())
    assert [s["file"] for s in pooled["sources"]] == [str(first), str(second)]
    assert pooled["sources"][0]["git_commit"] == "f667209"
    assert pooled["rounds_by_rate"] == {"4000": 12}
    (entry,) = pooled["paired"]
    p99 = entry["tunnel"]["vs_ssh"]["added_p99_ms"]
    assert (entry["rate"], p99["n"], p99["coverage"], p99["verdict"]) == (4000, 12, 0.961, "met")
    assert any(
        line.split()[:4] == ["4000", "tunnel", "vs_ssh", "added_p99_ms"] and "n=12" in line
        for line in proc.stdout.splitlines()
    )
    # Without --output: only the summary, nothing written.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--pool", str(first)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and "n=6" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "pooled.json"]
