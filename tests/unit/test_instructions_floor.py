"""benchmarks/instructions.py's ``--floor``: latency.py's two floor relays counted as the server
(relay A) and the agent (relay B), each started behind its role's wrapper (the valgrind command
line) so the PID counted is the relay's; what the tunnel does above them per role; and no floor
with ``--connect`` (the relays would pass a CONNECT on to the target)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.benchscripts import cmdline, load_script, wait_ended


@pytest.fixture(scope="module")
def instructions() -> Iterator[ModuleType]:
    yield from load_script("instructions")


@pytest.fixture(scope="module")
def latency() -> Iterator[ModuleType]:
    yield from load_script("latency")


def test_floor_relays_start_behind_their_roles_wrappers(
    latency: ModuleType, tmp_path: Path
) -> None:
    procs = latency.Procs(tmp_path)
    asked: list[str] = []

    def wrap(role: str) -> list[str]:
        asked.append(role)
        return ["env", f"FLOOR_ROLE={role}"]  # exec's the relay: the PID stays the relay's

    try:
        port, (a, b) = latency.start_floor(tmp_path, procs, 9, wrap=wrap)
        assert asked == ["agent", "server"]  # B (the agent's place) is started first
        assert port > 0
        assert "floor_relay.py" in cmdline(a) and "--tls-out" in cmdline(a)  # A dials B
        assert "floor_relay.py" in cmdline(b) and "--tls-in" in cmdline(b)
        assert Path(f"/proc/{a}/environ").read_bytes().count(b"FLOOR_ROLE=server\0") == 1
        assert Path(f"/proc/{b}/environ").read_bytes().count(b"FLOOR_ROLE=agent\0") == 1
    finally:
        procs.stop()
    wait_ended([p.pid for p in procs.procs])


def _round(checkout: str, server: int, agent: int) -> dict[str, object]:
    per = {"server": server, "agent": agent, "sum": server + agent}
    return {"checkout": checkout, "per_request": per}


def test_summary_says_what_the_tunnel_does_above_the_floor(instructions: ModuleType) -> None:
    rounds = [
        _round("tunnel", 120_000, 66_000),
        _round("floor", 40_000, 30_000),
        _round("tunnel", 122_000, 66_400),
        _round("floor", 40_400, 30_200),
    ]
    out = instructions.summarize(rounds, ["tunnel", "floor"])
    assert out["floor"]["agent"] == {"median": 30_100, "spread_pct": 0.66}
    assert out["tunnel-floor"] == {"server": 80_800, "agent": 36_100, "sum": 116_900}
    assert "tunnel/base" not in out


def test_floor_is_refused_with_connect(
    instructions: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["instructions.py", "--floor", "--connect"])
    monkeypatch.setattr(instructions, "run", lambda args: pytest.fail("ran"))
    with pytest.raises(SystemExit) as ended:
        instructions.main()
    assert ended.value.code == 2
    assert "--floor" in capsys.readouterr().err
