"""What the tests of the benchmarks/ scripts share: a script loaded as a module, the mark of
the tests that need OpenSSH (the ssh rows), and the processes a run may leave behind, read
from /proc."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

needs_ssh = pytest.mark.skipif(
    not os.access("/usr/sbin/sshd", os.X_OK) or shutil.which("ssh") is None,
    reason="sshd or ssh not installed",
)


def load_script(name: str) -> Iterator[ModuleType]:
    """``benchmarks/NAME.py`` as the module ``NAME_under_test``, for a fixture to yield from;
    it is in ``sys.modules`` until the fixture ends (dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def cmdline(pid: int) -> str:
    """Process ``pid``'s command line, its arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def running(pid: int) -> bool:
    """Process ``pid`` exists and has not ended (a zombie has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_ended(pids: Sequence[int], within: float = 5) -> None:
    """Wait until none of ``pids`` runs; fail naming the command lines of those still running
    after ``within`` seconds."""
    deadline = time.monotonic() + within
    while alive := [pid for pid in pids if running(pid)]:
        assert time.monotonic() < deadline, [cmdline(pid) for pid in alive]
        time.sleep(0.1)
