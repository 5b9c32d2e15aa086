"""benchmarks/latency.py's ``relay_cpu_per_client_cpu``: the relays' CPU per request over this
client's in the same row (the client is the same code in every row: a yardstick of the row's
machine speed), per round, the median of the rounds' per path, and compared ``vs_ssh`` and
``vs_base`` beside the raw relay CPU. From given rows: no processes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.unit.benchscripts import load_script


@pytest.fixture(scope="module")
def latency() -> Iterator[ModuleType]:
    yield from load_script("latency")


def row(
    latency: ModuleType, name: str, relay: float | None, client: float | None, n: int = 100
) -> Any:
    """A 1 s row of ``n`` 1 ms answers; ``relay`` and ``client``: CPU seconds (None: not
    measured: no relay processes, no noise sample)."""
    noise = None if client is None else latency.Noise(client, 0.0, 0.0)
    cpu_by_pid = [] if relay is None else [relay]
    return latency.Row(name, 1000, 1.0, [0.001] * n, [], 1.0, relay, cpu_by_pid, noise)


def test_a_row_divides_its_relay_cpu_by_the_clients(latency: ModuleType) -> None:
    summary = row(latency, "tunnel", 0.025, 0.010).summary()
    assert summary["relay_cpu_us_per_request"] == 250.0
    assert summary["client_cpu_us_per_request"] == 100.0
    assert summary["relay_cpu_per_client_cpu"] == 2.5


@pytest.mark.parametrize(
    ("relay", "client", "n"),
    [(None, 0.01, 100), (0.025, None, 100), (0.025, 0.0, 100), (0.025, 0.01, 0)],
    ids=["no-relay-cpu", "no-client-cpu", "client-read-nothing", "no-requests"],
)
def test_the_ratio_is_null_when_either_side_is_missing(
    latency: ModuleType, relay: float | None, client: float | None, n: int
) -> None:
    assert row(latency, "tunnel", relay, client, n).summary()["relay_cpu_per_client_cpu"] is None


def test_a_path_takes_the_median_of_its_rounds_ratios(latency: ModuleType) -> None:
    # Rounds: relay/client 2.0, 3.0, 2.2; pooled (totals) it would read 7.2 / 3 = 2.4, and the
    # mean of the rounds 2.4 too: the median, 2.2, is neither.
    runs = [
        (0, row(latency, "tunnel", 0.020, 0.010)),
        (1, row(latency, "tunnel", 0.030, 0.010)),
        (0, row(latency, "tunnel", 0.022, 0.010)),
    ]
    summary = latency.pooled_summary(runs)
    assert [r["relay_cpu_per_client_cpu"] for r in summary["rounds"]] == [2.0, 3.0, 2.2]
    assert [r["position"] for r in summary["rounds"]] == [0, 1, 0]
    assert summary["relay_cpu_per_client_cpu"] == 2.2
    # The existing pooled figures are unchanged: total CPU / total requests.
    assert summary["relay_cpu_us_per_request"] == 240.0
    assert summary["requests"] == 300


def test_a_path_whose_round_has_no_ratio_has_none(latency: ModuleType) -> None:
    runs = [(0, row(latency, "tunnel", 0.020, 0.010)), (1, row(latency, "tunnel", 0.020, None))]
    assert latency.pooled_summary(runs)["relay_cpu_per_client_cpu"] is None


def paths(latency: ModuleType, cpus: dict[str, list[tuple[float | None, float]]]) -> list[Any]:
    """Each path's pooled summary from its rounds' (relay, client) CPU seconds."""
    return [
        latency.pooled_summary(
            [(i, row(latency, name, relay, client)) for i, (relay, client) in enumerate(rounds)]
        )
        for name, rounds in cpus.items()
    ]


def test_compare_puts_the_ratio_beside_the_raw_cpu_vs_ssh_and_vs_base(
    latency: ModuleType,
) -> None:
    # The machine ran 10 % slower in the tunnel row's rounds: its relay CPU reads +10 % over
    # the base's, the client's read +10 % as well, and over the client the tunnel is even.
    rows = paths(
        latency,
        {
            "direct": [(None, 0.010), (None, 0.010)],
            "ssh": [(0.010, 0.010), (0.010, 0.010)],
            "tunnel-base": [(0.020, 0.010), (0.024, 0.010)],
            "tunnel": [(0.022, 0.011), (0.0264, 0.011)],
            "tunnel-connect": [(0.015, 0.010), (0.015, 0.010)],
        },
    )
    (entry,) = latency.compare(rows, [1000])
    assert entry["rate"] == 1000
    tunnel, base = entry["tunnel"], entry["tunnel-base"]
    assert (tunnel["relay_cpu_us_per_request"], base["relay_cpu_us_per_request"]) == (242.0, 220.0)
    assert (tunnel["relay_cpu_per_client_cpu"], base["relay_cpu_per_client_cpu"]) == (2.2, 2.2)
    assert tunnel["vs_base"]["relay_cpu_us_per_request"] == 1.1
    assert tunnel["vs_base"]["relay_cpu_per_client_cpu"] == 1.0
    assert tunnel["vs_base"]["relay_cpu_us_per_request_by_round"] == [1.1, 1.1]
    assert tunnel["vs_base"]["relay_cpu_per_client_cpu_by_round"] == [1.0, 1.0]
    # Direct and tunnel rows answer alike here: nothing added, so no ratio of the added.
    assert tunnel["added_p50_ms"] == 0.0 and tunnel["vs_base"]["added_p50_ms"] is None
    # vs_ssh: the ssh row reads 100 µs, 1.0 of its client's.
    assert tunnel["vs_ssh"]["relay_cpu_us_per_request"] == 2.42
    assert tunnel["vs_ssh"]["relay_cpu_per_client_cpu"] == 2.2
    assert entry["tunnel-connect"]["vs_ssh"]["relay_cpu_per_client_cpu"] == 1.5
    # No tunnel-connect-base row: no vs_base for tunnel-connect.
    assert "vs_base" not in entry["tunnel-connect"] and "vs_base" not in base


def test_compare_gives_tunnel_connect_its_vs_base_over_tunnel_connect_base(
    latency: ModuleType,
) -> None:
    rows = paths(
        latency,
        {
            "direct": [(None, 0.010), (None, 0.010)],
            "tunnel-base": [(0.020, 0.010), (0.020, 0.010)],
            "tunnel-connect-base": [(0.016, 0.010), (0.016, 0.010)],
            "tunnel": [(0.020, 0.010), (0.020, 0.010)],
            "tunnel-connect": [(0.012, 0.010), (0.016, 0.010)],
        },
    )
    (entry,) = latency.compare(rows, [1000])
    connect = entry["tunnel-connect"]
    assert connect["vs_base"]["relay_cpu_us_per_request_by_round"] == [0.75, 1.0]
    assert connect["vs_base"]["relay_cpu_us_per_request"] == 0.875
    assert entry["tunnel"]["vs_base"]["relay_cpu_us_per_request"] == 1.0
    assert "vs_base" not in entry["tunnel-connect-base"]


def test_compare_without_a_baseline_or_ssh_row_keeps_the_old_shape(latency: ModuleType) -> None:
    rows = paths(latency, {"direct": [(None, 0.01)], "tunnel": [(0.02, 0.01)]})
    (entry,) = latency.compare(rows, [1000])
    assert set(entry) == {"rate", "tunnel"}
    assert set(entry["tunnel"]) == {
        "added_p50_ms",
        "added_p99_ms",
        "achieved",
        "relay_cpu_us_per_request",
        "relay_cpu_per_client_cpu",
    }
    assert entry["tunnel"]["relay_cpu_per_client_cpu"] == 2.0


def test_the_clients_cpu_is_read_finer_than_a_tick(latency: ModuleType) -> None:
    """The yardstick's resolution: ~3 ms of this process's CPU reads as such, not as 0 or one
    10 ms tick (os.times(), which a 5 s row at 1 000 req/s saw as ~50 ticks: 2 % a tick)."""
    before = latency.Noise.sample([])
    end = time.process_time() + 0.003
    while time.process_time() < end:
        pass
    client = latency.Noise.sample([]).since(before).client
    assert 0.003 <= client < 0.009
