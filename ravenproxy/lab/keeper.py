"""Keeps one process running, as a kubelet keeps a pod's container: restarts it after
``--delay`` seconds whenever it exits, until SIGTERM (which it passes on, then exits).

``python -m ravenproxy.lab.keeper --child-pid-file F --events F --delay S -- ARGV...``
writes the running child's PID to the child PID file and one line per exit and start to the
events file (``<unix time> started <pid>`` / ``<unix time> exited <code>``): ``lab status``
shows restarts from it, ``lab fault agent`` kills the child it names.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType


def _event(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(f"{time.time():.3f} {text}\n")


def keep(argv: list[str], child_pid_file: Path, events: Path, delay: float) -> int:
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, _: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    while not stopping:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        child_pid_file.write_text(f"{child.pid}\n")
        _event(events, f"started {child.pid}")
        code = child.wait()
        _event(events, f"exited {code}")
        if stopping:
            break
        deadline = time.monotonic() + delay
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.05)
    with contextlib.suppress(FileNotFoundError):
        child_pid_file.unlink()
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child-pid-file", type=Path, required=True)
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("no command to keep running")
    sys.exit(keep(argv, args.child_pid_file, args.events, args.delay))


if __name__ == "__main__":
    main()
