"""`ravenproxy demo` is what a new user runs first: it must keep working, and every curl command
the README's Quick start and "Using the tunnel" show must work against `demo --keep-running`
(read from README.md itself, so the two cannot drift)."""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ravenproxy.config import Address
from ravenproxy.demo import curl_commands
from tests.helpers import eventually, free_port, run, spawn_python, stop, taken_port

README = Path(__file__).resolve().parents[2] / "README.md"


def section(text: str, heading: str) -> str:
    """The text of a README section, from its heading to the next heading of any level."""
    start = text.index(f"{heading}\n")
    end = re.compile(r"^#{2,3} ", re.M).search(text, start + len(heading) + 1)
    return text[start : end.start() if end else len(text)]


def readme_curls() -> list[str]:
    text = README.read_text()
    found = []
    for heading in ("## Quick start", "### Using the tunnel"):
        lines = section(text, heading).splitlines()
        found += [line.split(" #", 1)[0].strip() for line in lines if line.startswith("curl ")]
    return found


@pytest.fixture
def ports() -> dict[str, int]:
    return {"http": free_port(), "metrics": free_port(), "target": free_port()}


def demo_args(ports: dict[str, int]) -> list[str]:
    return [
        "--http-addr", f"127.0.0.1:{ports['http']}",
        "--metrics-addr", f"127.0.0.1:{ports['metrics']}",
        "--target-port", str(ports["target"]),
    ]  # fmt: skip


def localize(command: str, ports: dict[str, int]) -> str:
    """A README command for the demo's ports (the README shows the defaults)."""
    for default, port in ((":10264", ports["http"]), (":10266", ports["metrics"])):
        command = command.replace(default, f":{port}")
    command = command.replace(":9100", f":{ports['target']}")
    return command.replace("proxy.example.com", "127.0.0.1")


@pytest.mark.timeout(120)
def test_demo_runs_end_to_end_and_exits_zero(ports: dict[str, int]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ravenproxy", "demo", "--upload-mib", "16", *demo_args(ports)],
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


class Demo:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc, self.log = proc, log

    def output(self) -> str:
        return self.log.read_text()

    def directory(self) -> Path:
        match = re.search(r"^files and logs: (\S+)", self.output(), re.M)
        assert match, self.output()
        return Path(match.group(1))

    def printed_curls(self) -> list[str]:
        lines = [line.strip() for line in self.output().splitlines()]
        return [line.split(" #", 1)[0].strip() for line in lines if line.startswith("curl ")]


@pytest.fixture
def demo(ports: dict[str, int], tmp_path: Path) -> Iterator[Demo]:
    log = tmp_path / "demo.log"
    proc = spawn_python(
        ["-m", "ravenproxy", "demo", "--keep-running", "--upload-mib", "1", *demo_args(ports)],
        log,
    )
    try:
        yield Demo(proc, log)
    finally:
        stop(proc)


async def started(demo: Demo) -> None:
    await eventually(
        lambda: "files and logs:" in demo.output() or demo.proc.poll() is not None,
        within=60,
        what=demo.output,
    )
    assert demo.proc.poll() is None, demo.output()


def expected(url_or_command: str) -> tuple[int, str]:
    """What the demo answers to a documented command: (status, text the body contains)."""
    if "edge-9" in url_or_command:
        return 404, "edge-9: unknown node"
    if url_or_command.endswith("/hello"):
        return 200, "hello from edge-1\n"
    if url_or_command.endswith("/stream"):
        return 200, " line 9\n"
    if "edge-1" in url_or_command and url_or_command.endswith("/metrics"):
        return 200, "demo_target_up 1\n"
    if url_or_command.endswith("/metrics"):
        return 200, "ravenproxy_server_streams_open"
    raise AssertionError(f"the test does not know what {url_or_command!r} should answer")


async def test_every_readme_curl_works_against_the_kept_demo(
    demo: Demo, ports: dict[str, int]
) -> None:
    await started(demo)
    documented = readme_curls()
    assert len(documented) >= 6, documented
    # The demo prints the Quick start's commands (for its own addresses).
    quick = readme_curls()[: len(demo.printed_curls())]
    assert demo.printed_curls() == [localize(c, ports) for c in quick]
    assert [" ".join(c.split()) for c in quick] == [
        " ".join(c.split(" #", 1)[0].split())
        for c in curl_commands(Address("127.0.0.1", 10264), Address("127.0.0.1", 10266), 9100)
    ]
    for command in documented:
        curl, _, grep = localize(command, ports).partition(" | grep ")
        argv = shlex.split(curl)
        status, want = expected(argv[-1])
        code, out, err = await run(
            *argv, "-sS", "--max-time", "10", "-w", "\n%{http_code}", timeout=20
        )
        body, _, got = out.rpartition("\n")
        assert code == 0, (command, err)
        assert int(got) == status, (command, out)
        assert want in body, (command, body)
        if grep:
            assert any(grep.strip() in line for line in body.splitlines()), (command, body)
    # Stopped by SIGTERM: exit 0, the temporary directory (with ca.key) is gone.
    directory = demo.directory()
    assert (directory / "certs" / "ca.key").exists()
    demo.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(demo.proc.wait, 30) == 0, demo.output()
    assert not directory.exists()


async def test_sigint_removes_the_temporary_directory(demo: Demo) -> None:
    await started(demo)
    directory = demo.directory()
    demo.proc.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(demo.proc.wait, 30) == 0, demo.output()
    assert not directory.exists()


async def test_a_given_directory_is_kept(ports: dict[str, int], tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    mine = tmp_path / "mine"
    proc = spawn_python(
        ["-m", "ravenproxy", "demo", "--keep-running", "--upload-mib", "1", "--dir", str(mine),
         *demo_args(ports)],
        log,
    )  # fmt: skip
    try:
        await started(Demo(proc, log))
        proc.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(proc.wait, 30) == 0
        assert (mine / "certs" / "ca.key").exists() and (mine / "inventory.yaml").exists()
    finally:
        await asyncio.to_thread(stop, proc)


async def test_a_taken_front_port_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    with taken_port() as port:
        code, out, err = await run(
            sys.executable, "-m", "ravenproxy", "demo", "--http-addr", f"127.0.0.1:{port}"
        )
    assert code == 2, (out, err)
    assert err.count("\n") == 1, err
    assert err.startswith(f"ravenproxy demo: error: --http-addr: cannot listen on 127.0.0.1:{port}")
