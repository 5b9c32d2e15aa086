"""latency.py's paired ratios: a path's figure over another path's *of the same round*, and per
rate the median of those ratios with a distribution-free interval for it.

Why paired: every row's figures move with the machine's speed over tens of seconds (an ssh row's
added p99 at 4 000 req/s read 0.287 ms in one run and 0.45-0.47 ms in others), and the pooled
ratio of two rows divides one run's luck by another row's. Rows of the same round ran seconds
apart (benchmarks/README.md, latency.py, "Rounds"), so a round's ratio divides out what the
machine did in that round; what is left moves less, and the rounds' ratios give a spread and an
interval to read a goal against.

The interval is the order statistics' interval for the median (no bootstrap, no assumption on
the ratios' distribution): with ``n`` rounds sorted, ``[x_(k), x_(n+1-k)]`` (1-based) holds
the median of the rounds' distribution with probability ``1 - 2 * P(B <= k - 1)``, ``B`` binomial
(``n``, 1/2), for any continuous distribution. ``k`` is the largest that keeps that coverage at
``CONFIDENCE`` or more: 6 rounds give ``[min, max]`` at 96.9 %, 8 rounds ``[min, max]`` at 99.2 %
(``k`` = 2 would be 93.0 %), 9 rounds ``[x_(2), x_(8)]`` at 96.1 %, 12 rounds ``[x_(3), x_(10)]``
at 96.1 %, 20 rounds ``[x_(6), x_(15)]`` at 95.9 %; 5 rounds or fewer give no interval (their
``[min, max]`` holds 93.8 % at most). It assumes the rounds are independent draws: a drift of
the machine across a run is not noise of that kind (the order alternates round by round, so a
linear drift lands on both rows of a pair alike).

A goal's verdict from the interval: ``met`` when its upper end is at or below the goal, ``not
met`` when its lower end is above it, ``not resolvable`` otherwise (also when there is no
interval).
"""

from __future__ import annotations

import datetime
import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

CONFIDENCE = 0.95
# The figures a round's pair is compared by: p50/p99 less the same round's direct ones, relay
# CPU per request, and that over the client's CPU in the same row.
ADDED = ("added_p50_ms", "added_p99_ms")
KEYS = (*ADDED, "relay_cpu_us_per_request", "relay_cpu_per_client_cpu")
# Issue 15's goals at every rate, each the most a path's figure may be over ssh -R's.
GOALS = {"added_p50_ms": 1.5, "added_p99_ms": 2.0, "relay_cpu_us_per_request": 2.0}
OVER_SSH = ("tunnel", "tunnel-base", "tunnel-connect", "tunnel-connect-base", "floor")
BASE_OF = {"tunnel": "tunnel-base", "tunnel-connect": "tunnel-connect-base"}
"""A path's row through the ``--baseline`` checkout (``vs_base``)."""
# A round of a pair is quiet when neither row nor the round's direct row saw this much of other
# processes' CPU and steal (cores over the row): under ~1 core of other load on 2 cores the
# Python relays lose more than ssh does, so such a round measures the load, not the code
# (benchmarks/README.md, "pool, 2026-12-05").
QUIET_CORES = 0.1
SETTING = (
    "per rate and path, each round's figure over the ssh row's (vs_ssh) or tunnel-base's "
    "(vs_base) of the same round (added p50/p99: less that round's direct p50/p99); over the "
    "rounds: median, min, max and the order statistics' distribution-free interval for the "
    "median (coverage >= 0.95; none under 6 rounds); a goal is met when the interval's upper "
    "end is at or below it, not met when its lower end is above it, else not resolvable; "
    f"quiet: the same over the rounds where the pair's rows and direct's saw under "
    f"{QUIET_CORES:g} core of other processes' CPU and steal"
)


def median_interval(n: int, confidence: float = CONFIDENCE) -> tuple[int, float] | None:
    """``(k, coverage)``: the 1-based rank ``k`` such that ``[x_(k), x_(n+1-k)]`` of ``n``
    sorted values holds the median with probability ``coverage`` >= ``confidence``, the
    largest such ``k``; None when even ``[min, max]`` falls short."""
    best = None
    below = 1  # 2**n * P(B <= k - 1), B ~ Binomial(n, 1/2): for k = 1, P(B = 0)
    for k in range(1, (n + 1) // 2 + 1):
        coverage = 1 - 2 * below / 2**n
        if coverage < confidence:
            break
        best = (k, coverage)
        below += math.comb(n, k)
    return best


def spread(values: Iterable[float | None], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """The rounds' ratios ``by_round`` (None where a round has none) and over those that have
    one: ``n``, ``median``, ``min``, ``max``, the median's ``interval`` [low, high] and its
    ``coverage`` (both None with too few rounds), ``missing`` (rounds without a ratio)."""
    by_round = list(values)
    xs = sorted(x for x in by_round if x is not None)
    n = len(xs)
    found = median_interval(n, confidence)
    return {
        "by_round": by_round,
        "n": n,
        "missing": len(by_round) - n,
        "median": round(statistics.median(xs), 3) if xs else None,
        "min": xs[0] if xs else None,
        "max": xs[-1] if xs else None,
        "interval": None if found is None else [xs[found[0] - 1], xs[n - found[0]]],
        "coverage": None if found is None else round(found[1], 3),
    }


def verdict(stats: dict[str, Any], goal: float) -> str:
    """``met`` / ``not met`` / ``not resolvable``: the interval against a most-allowed ratio."""
    interval = stats["interval"]
    if interval is None:
        return "not resolvable"
    if interval[1] <= goal:
        return "met"
    if interval[0] > goal:
        return "not met"
    return "not resolvable"


def round_figures(rows: Sequence[dict[str, Any]], rate: int) -> dict[str, list[dict[str, Any]]]:
    """Per path at ``rate``, each round's figures with ``added_p50_ms``/``added_p99_ms`` (the
    round's p50/p99 less the ``direct`` row's of the same round: rounds are matched by their
    place in ``rounds``)."""
    at = {r["path"]: r.get("rounds", []) for r in rows if r["rate_target"] == rate}
    direct = at.get("direct", [])
    out = {}
    for name, rounds in at.items():
        if name == "direct":
            continue
        figures = []
        for i, r in enumerate(rounds):
            d = direct[i] if i < len(direct) else {}
            figures.append(
                {
                    **{key: r.get(key) for key in KEYS if key not in ADDED},
                    "quiet": _quiet(r) and _quiet(d),
                    "added_p50_ms": _less(r.get("p50_ms"), d.get("p50_ms")),
                    "added_p99_ms": _less(r.get("p99_ms"), d.get("p99_ms")),
                }
            )
        out[name] = figures
    return out


def ratios(top: list[dict[str, Any]], bottom: list[dict[str, Any]], key: str) -> list[float | None]:
    """Round i's ``key`` of ``top`` over round i's of ``bottom`` (None where either is missing
    or the bottom one is not above 0: an ssh row that added nothing has no ratio)."""
    return [_over(a.get(key), b.get(key)) for a, b in zip(top, bottom, strict=False)]


def compared(
    top: list[dict[str, Any]], bottom: list[dict[str, Any]], key: str, goal: float | None = None
) -> dict[str, Any]:
    """``key``'s :func:`spread` of ``top`` over ``bottom`` round by round, and the same over
    their quiet rounds only as ``quiet`` (with ``quiet_rounds``: which, by index); with a
    ``goal``, each gets ``goal`` and ``verdict``."""
    by_round = ratios(top, bottom, key)
    calm = [
        i for i, (a, b) in enumerate(zip(top, bottom, strict=False)) if a["quiet"] and b["quiet"]
    ]
    stats = spread(by_round)
    stats["quiet"] = spread(by_round[i] for i in calm)
    stats["quiet"]["quiet_rounds"] = calm
    if goal is not None:
        for s in (stats, stats["quiet"]):
            s["goal"] = goal
            s["verdict"] = verdict(s, goal)
    return stats


def paired(rows: Sequence[dict[str, Any]], rate: int) -> dict[str, Any]:
    """Per path at ``rate``: ``vs_ssh`` (the tunnel-like paths over the ``ssh`` row) and, for
    ``tunnel`` and ``tunnel-connect``, ``vs_base`` (over the ``--baseline`` checkout's row:
    :data:`BASE_OF`), each key's :func:`compared` over the
    rounds; ``vs_ssh`` also gives each goal's ``goal`` and ``verdict``."""
    figures = round_figures(rows, rate)
    out: dict[str, Any] = {}
    ssh = figures.get("ssh")
    for name in OVER_SSH:
        mine = figures.get(name)
        if mine is None:
            continue
        entry: dict[str, Any] = {}
        if ssh is not None:
            entry["vs_ssh"] = {key: compared(mine, ssh, key, GOALS.get(key)) for key in KEYS}
        base = figures.get(BASE_OF.get(name, ""))
        if base is not None:
            entry["vs_base"] = {key: compared(mine, base, key) for key in KEYS}
        if entry:
            out[name] = entry
    return out


def merge_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Several latency.py results as one set of rows for :func:`paired`: per (path, rate), the
    rounds of every result in the order given (a path or rate some result lacks is left out,
    as its rounds would pair with another path's from other runs)."""
    keys = [{(r["path"], r["rate_target"]) for r in result["rows"]} for result in results]
    common = set.intersection(*keys) if keys else set()
    order = [(r["path"], r["rate_target"]) for r in results[0]["rows"]] if results else []
    merged = []
    for path, rate in order:
        if (path, rate) not in common:
            continue
        rounds = []
        for result in results:
            row = next(r for r in result["rows"] if (r["path"], r["rate_target"]) == (path, rate))
            rounds += row.get("rounds", [])
        merged.append({"path": path, "rate_target": rate, "rounds": rounds})
    return merged


def describe(paired_by_rate: Sequence[dict[str, Any]]) -> list[str]:
    """The stdout summary: per rate, path, comparison and key, a line over all rounds and one
    over the quiet ones: the median of the rounds' ratios, its interval and coverage, min-max,
    rounds, and a goal's verdict."""
    lines = []
    for entry in paired_by_rate:
        for name, comparisons in entry.items():
            if name == "rate":
                continue
            for against, by_key in comparisons.items():
                for key, stats in by_key.items():
                    for which, s in (("all", stats), ("quiet", stats.get("quiet"))):
                        if s is not None and s["median"] is not None:
                            head = (
                                f"{entry['rate']:>6} {name:<14} {against:<7} {key:<25} {which:<5}"
                            )
                            lines.append(f"{head} {_line(s)}")
    return lines


def _line(s: dict[str, Any]) -> str:
    interval = (
        "no interval (too few rounds)"
        if s["interval"] is None
        else f"[{s['interval'][0]:.2f}, {s['interval'][1]:.2f}] ({s['coverage'] * 100:.1f} %)"
    )
    goal = f"  goal <= {s['goal']:g}: {s['verdict']}" if "goal" in s else ""
    return (
        f"median {s['median']:.2f} {interval} "
        f"min-max {s['min']:.2f}-{s['max']:.2f} n={s['n']}{goal}"
    )


def pool(results: list[dict[str, Any]], sources: list[Path]) -> dict[str, Any]:
    """latency.py's ``--pool``: the paired ratios over the rounds of several results
    (:func:`merge_rows`), at the rates they all have, and where the results came from."""
    rows = merge_rows(results)
    rates = list(dict.fromkeys(r["rate_target"] for r in rows))
    return {
        "benchmark": "latency-pooled",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "sources": [
            {
                "file": str(path),
                "date": result.get("date"),
                "git_commit": result.get("machine", {}).get("git_commit"),
                "baseline_commit": result.get("machine", {}).get("baseline_commit"),
                "settings": result.get("settings"),
            }
            for path, result in zip(sources, results, strict=True)
        ],
        "settings": {"paired": SETTING},
        "rounds_by_rate": {
            str(row["rate_target"]): len(row["rounds"]) for row in rows if row["path"] == "direct"
        },
        "paired": [{"rate": rate, **paired(rows, rate)} for rate in rates],
    }


def print_paired(paired_by_rate: list[dict[str, Any]], output: str | None) -> None:
    """The paired ratios' summary, to stdout (to stderr when the JSON went there)."""
    lines = describe(paired_by_rate)
    if lines:
        print("\n".join(lines), file=sys.stderr if output == "-" else sys.stdout)


def _quiet(r: dict[str, Any]) -> bool:
    """A round of a row whose others' CPU and steal are known and under :data:`QUIET_CORES`."""
    others, steal = r.get("others_cpu_cores"), r.get("steal_cores")
    return others is not None and steal is not None and others + steal < QUIET_CORES


def _less(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 3)
