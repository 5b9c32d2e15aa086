"""The lab's processes: each started in its namespace under a :mod:`~ravenproxy.lab.keeper`,
with its PID files, log and restart events under ``DIR/run/``; stopped by PID.

A PID is trusted only while ``/proc/PID/cmdline`` still names the keeper and this lab's PID
file (a recycled PID is never signalled). The keeper leads its own session: SIGTERM to the
group stops it and its child; what is still there after the grace period gets SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

STOP_GRACE = 10.0


@dataclass(frozen=True)
class Proc:
    """One supervised process: ``name`` (unique in the lab), the host it runs in, its argv."""

    name: str
    host: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


class Supervisor:
    def __init__(self, directory: Path) -> None:
        self.run_dir = directory / "run"

    def pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def child_pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.child"

    def events_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.events"

    def log_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.log"

    def start(self, proc: Proc, namespace: str, delay: float) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            "ip", "netns", "exec", namespace,
            sys.executable, "-m", "ravenproxy.lab.keeper",
            "--child-pid-file", str(self.child_pid_file(proc.name)),
            "--events", str(self.events_file(proc.name)),
            "--delay", str(delay),
            "--", *proc.argv,
        ]  # fmt: skip
        env = {**os.environ, **dict(proc.env)}
        with self.log_file(proc.name).open("ab") as out:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        self.pid_file(proc.name).write_text(f"{child.pid}\n")
        return child.pid

    def keeper_pid(self, name: str) -> int | None:
        """The keeper's PID while it runs (``ip netns exec`` execs it in place)."""
        return _live(self.pid_file(name), b"ravenproxy.lab.keeper", name)

    def child_pid(self, name: str) -> int | None:
        """The kept process's PID while it runs."""
        if self.keeper_pid(name) is None:
            return None
        return _live(self.child_pid_file(name), b"", name)

    def restarts(self, name: str) -> list[float]:
        """When the kept process was started again after exiting (unix times)."""
        try:
            lines = self.events_file(name).read_text().splitlines()
        except FileNotFoundError:
            return []
        starts = [float(line.split()[0]) for line in lines if " started " in line]
        return starts[1:]

    def names(self) -> list[str]:
        if not self.run_dir.is_dir():
            return []
        return sorted(p.stem for p in self.run_dir.glob("*.pid"))

    def stop(self, names: Sequence[str]) -> list[str]:
        """SIGTERM every keeper's group, wait, SIGKILL what is left; what was stopped."""
        pids = {n: pid for n in names if (pid := self.keeper_pid(n)) is not None}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while time.monotonic() < deadline and any(_alive(pid) for pid in pids.values()):
            time.sleep(0.05)
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for name in names:
            for path in (self.pid_file(name), self.child_pid_file(name)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return [f"{n} (pid {pid})" for n, pid in pids.items()]


def _alive(pid: int) -> bool:
    """Running (a zombie of ours counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _live(pid_file: Path, marker: bytes, name: str) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    if marker and (marker not in cmdline or f"/{name}.".encode() not in cmdline):
        return None
    return pid if _alive(pid) else None
