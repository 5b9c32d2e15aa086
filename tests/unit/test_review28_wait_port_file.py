"""Review of agent66's latency.py change (5f99d80): ``_wait_port_file`` waits by a deadline
(``seconds``, 10 by default as the 200 tries of 0.05 s were), not a count of tries. Real child
processes: a port written late is still found, a process that lives and writes nothing is
given up at the deadline (not before, and with the deadline said), one that exits is said so
at once; ``start_floor``'s ``seconds`` reaches it."""

from __future__ import annotations

import inspect
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.benchscripts import load_script


@pytest.fixture(scope="module")
def latency() -> Iterator[ModuleType]:
    yield from load_script("latency")


def _child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_port_written_late_is_found(latency: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "late.port"
    write = f"pathlib.Path({str(path)!r}).write_text('4321')"
    proc = _child(f"import time, pathlib; time.sleep(0.6); {write}; time.sleep(5)")
    try:
        assert latency._wait_port_file(path, proc, seconds=3.0) == 4321
    finally:
        proc.kill()
        proc.wait()


def test_a_silent_process_is_given_up_at_the_deadline_not_before(
    latency: ModuleType, tmp_path: Path
) -> None:
    proc = _child("import time; time.sleep(10)")
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"silent did not start within 0\.8 s"):
            latency._wait_port_file(tmp_path / "silent.port", proc, seconds=0.8)
        took = time.monotonic() - start
        assert 0.8 <= took < 0.8 + 0.5, took
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_exits_is_said_so_at_once(latency: ModuleType, tmp_path: Path) -> None:
    proc = _child("pass")
    proc.wait()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="gone exited"):
        latency._wait_port_file(tmp_path / "gone.port", proc, seconds=30.0)
    assert time.monotonic() - start < 1.0


def test_the_default_is_ten_seconds_as_before(latency: ModuleType) -> None:
    assert inspect.signature(latency._wait_port_file).parameters["seconds"].default == 10.0
    assert inspect.signature(latency.start_floor).parameters["seconds"].default == 10.0
