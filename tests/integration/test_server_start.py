"""``ravenproxy server`` whose --http-addr is taken: exits non-zero with one line naming the flag
and the address (no traceback), and leaves nothing listening."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ravenproxy.pki import init_pki
from tests.helpers import free_port, is_free, taken_port


def test_a_taken_port_is_one_line_and_nothing_listens(tmp_path: Path) -> None:
    init_pki(tmp_path, ("localhost",), ())
    (tmp_path / "inv.yaml").write_text("")
    tunnel = free_port()
    with taken_port() as http:
        done = subprocess.run(
            [
                sys.executable, "-m", "ravenproxy", "server",
                "--inventory", str(tmp_path / "inv.yaml"),
                "--ca-file", str(tmp_path / "ca.crt"),
                "--cert-file", str(tmp_path / "server.crt"),
                "--key-file", str(tmp_path / "server.key"),
                "--tunnel-addr", f"127.0.0.1:{tunnel}",
                "--http-addr", f"127.0.0.1:{http}",
                "--https-addr", "127.0.0.1:0",
                "--metrics-addr", "127.0.0.1:0",
                "--health-addr", "127.0.0.1:0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert errors == [f"ravenproxy server: error: --http-addr: cannot listen on 127.0.0.1:{http}: "
                      "Address already in use"], done.stderr  # fmt: skip
    assert "Traceback" not in done.stderr
    assert is_free(tunnel)
