"""`ravenproxy demo` is what a new user runs first: it must keep working."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_demo_runs_end_to_end_and_exits_zero() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ravenproxy", "demo", "--upload-mib", "16"],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "GET  /hello     → 200 'hello from edge-1'" in out
    assert "GET  /stream    → 10 lines" in out
    assert "POST /upload    → 16 MiB, SHA-256 matches" in out
    assert "summary: 4 streams opened" in out
