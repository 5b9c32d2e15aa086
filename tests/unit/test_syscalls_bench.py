"""benchmarks/syscalls.py's counting: ``strace -c -f`` attached to a real running process for a
while, read back by kind, with the calls that failed counted apart; and the context switches and
CPU sampled from /proc for it."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.benchscripts import load_script, needs_ssh

# Per millisecond: a getppid (succeeds) and a stat of a missing path (fails with ENOENT).
CHILD = """
import os, time
while True:
    os.getppid()
    try:
        os.stat("/nonexistent-ravenproxy-syscalls-test")
    except FileNotFoundError:
        pass
    time.sleep(0.001)
"""


# Serial (tests/conftest.py): counts a running process's syscalls and context switches.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def syscalls() -> Iterator[ModuleType]:
    yield from load_script("syscalls")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_traced_counts_a_running_process_by_kind_with_failures_apart(
    syscalls: ModuleType, child: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    time.sleep(0.2)  # the child's imports are done
    traced = syscalls.Traced(tmp_path, [child.pid])
    traced.start()
    time.sleep(0.5)
    counts = traced.stop()[child.pid]
    assert child.poll() is None  # detached, not killed
    calls, errors = counts["getppid"]
    assert calls >= 50 and errors == 0
    stat_kind = next(k for k in ("newfstatat", "stat", "statx") if k in counts)
    calls, errors = counts[stat_kind]
    assert calls >= 50 and errors == calls


def test_sample_reads_context_switches_and_cpu(
    syscalls: ModuleType, child: subprocess.Popen[bytes]
) -> None:
    before = syscalls.sample([child.pid])[child.pid]
    time.sleep(0.3)
    after = syscalls.sample([child.pid])[child.pid]
    assert after[0] - before[0] >= 50  # voluntary: each sleep
    assert all(a >= b for a, b in zip(after, before, strict=True))
    assert syscalls.sample([2**22 + 1]) == {2**22 + 1: [0, 0, 0, 0]}  # no such process


@needs_ssh
@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_the_ssh_way_runs_through_its_forwarded_port(syscalls: ModuleType) -> None:
    """The ssh row connects to the ``ssh -R`` forward (start_ssh answers a list of forwarded
    ports: the first is the row's), and counts its requests over sshd and ssh."""
    args = argparse.Namespace(
        ways="ssh",
        requests=60,
        rate=200,
        connections=2,
        rounds=1,
        baseline=None,
        answer="varied",
    )
    result = syscalls.run(args)
    (row,) = result["rounds"]
    assert row["way"] == "ssh" and row["errors"] == []
    assert row["requests"] == [60, 60]
    assert row["per_request"] and result["machine"]["openssh"]
