"""benchmarks/idle_cost.py's ``--agents``: the first tunnel is a warm-up left out of the per-agent
figure, so one agent measures nothing; it is refused by name, not divided by zero after a
server and a tunnel were started."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.unit.benchscripts import BENCHMARKS, load_script


@pytest.fixture
def idle_cost() -> Iterator[ModuleType]:
    yield from load_script("idle_cost")


@pytest.mark.parametrize("text", ["1", "-3"])
def test_an_agent_count_that_measures_nothing_is_refused(idle_cost: ModuleType, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="0 to skip, or 2 or more"):
        idle_cost._agent_count(text)


@pytest.mark.parametrize(("text", "count"), [("0", 0), ("2", 2), ("500", 500)])
def test_agent_counts_taken(idle_cost: ModuleType, text: str, count: int) -> None:
    assert idle_cost._agent_count(text) == count


def test_the_command_line_names_the_flag() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "idle_cost.py"), "--agents", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "argument --agents: 1: 0 to skip, or 2 or more" in done.stderr
    assert "Traceback" not in done.stderr
