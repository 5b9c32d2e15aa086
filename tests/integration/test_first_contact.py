"""First contact: what a newcomer's mistakes look like. A port in use, an unreadable file, a
listen host that does not resolve, a bad --log-level and an unknown inventory field are each
exactly one line on stderr naming the flag or the field, exit 2, for every long-running
command; and each process logs its version and effective settings at start-up, in one line."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ravenproxy import __version__
from ravenproxy.pki import init_pki
from tests.helpers import eventually, free_port, http_get, run, spawn_python, stop, taken_port

DOCS = Path(__file__).resolve().parents[2] / "docs"
COMMANDS = ("server", "agent", "controller", "dns")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    certs = tmp_path / "certs"
    init_pki(certs, ("localhost", "127.0.0.1"), ("edge-1",))
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text((DOCS / "inventory-example.yaml").read_text())
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    directory = tmp_path / "a-directory"
    directory.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    return {
        "certs": certs,
        "inventory": inventory,
        "kubeconfig": kubeconfig,
        "dir": directory,
        "fifo": fifo,
    }


def base_args(command: str, f: dict[str, Path]) -> list[str]:
    """A command line that starts (every listener on a free loopback port)."""
    certs = f["certs"]
    if command == "server":
        return [
            "server", "--inventory", str(f["inventory"]),
            "--ca-file", str(certs / "ca.crt"), "--cert-file", str(certs / "server.crt"),
            "--key-file", str(certs / "server.key"),
            *(arg for name in ("tunnel", "http", "https", "metrics", "health")
              for arg in (f"--{name}-addr", f"127.0.0.1:{free_port()}")),
        ]  # fmt: skip
    if command == "agent":
        return [
            "agent", "--server-addr", "wss://127.0.0.1:1", "--node-name", "edge-1",
            "--ca-file", str(certs / "ca.crt"), "--cert-file", str(certs / "edge-1.crt"),
            "--key-file", str(certs / "edge-1.key"), "--inventory", str(f["inventory"]),
            "--metrics-addr", f"127.0.0.1:{free_port()}",
        ]  # fmt: skip
    if command == "controller":
        return [
            "controller", "--kubeconfig", str(f["kubeconfig"]),
            "--metrics-addr", f"127.0.0.1:{free_port()}",
            "--health-addr", f"127.0.0.1:{free_port()}",
        ]  # fmt: skip
    return ["dns", "--inventory", str(f["inventory"]), "--listen", f"127.0.0.1:{free_port()}"]


LISTEN_FLAG = {
    "server": "--metrics-addr",
    "agent": "--metrics-addr",
    "controller": "--health-addr",
    "dns": "--listen",
}
FILE_FLAG = {"server": "--inventory", "agent": "--inventory", "controller": "--kubeconfig",
             "dns": "--inventory"}  # fmt: skip


async def one_line_error(command: str, args: list[str], *, started: bool = False) -> str:
    """Run ``ravenproxy ARGS``; it must exit 2 with exactly one line on stderr: the error. A
    mistake found only once the process has ``started`` (the inventory's content, read by the
    running parts) follows the start-up line and the INFO records of what started, no
    traceback, no other error."""
    code, out, err = await run(sys.executable, "-m", "ravenproxy", *args, timeout=60)
    assert code == 2, (code, out, err)
    if started:
        lines = err.splitlines(keepends=True)
        assert f"INFO ravenproxy: ravenproxy {command} starting version=" in lines[0], err
        assert all(re.match(r"\d{4}-\d\d-\d\d [\d:,]+ INFO ", line) for line in lines[:-1]), err
        err = lines[-1]
    assert err.endswith("\n") and err.count("\n") == 1, err
    prefix = f"ravenproxy {command}: error: "
    assert err.startswith(prefix), err
    return err[len(prefix) :].rstrip("\n")


def cannot(command: str) -> str:
    """How a listener that cannot be had is told (the DNS server binds UDP first)."""
    return "cannot bind UDP" if command == "dns" else "cannot listen on"


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback TCP and UDP port another program holds."""
    with taken_port(udp=True) as port:
        yield port


@pytest.mark.parametrize("command", COMMANDS)
async def test_a_port_in_use(command: str, files: dict[str, Path], taken: int) -> None:
    flag = LISTEN_FLAG[command]
    args = [*base_args(command, files), flag, f"127.0.0.1:{taken}"]
    error = await one_line_error(command, args)
    assert error.startswith(f"{flag}: {cannot(command)} 127.0.0.1:{taken}: "), error
    assert "in use" in error, error


@pytest.mark.parametrize("command", COMMANDS)
async def test_an_unresolvable_listen_host(command: str, files: dict[str, Path]) -> None:
    flag = LISTEN_FLAG[command]
    args = [*base_args(command, files), flag, "no-such-host.invalid:10999"]
    error = await one_line_error(command, args)
    assert error.startswith(f"{flag}: {cannot(command)} no-such-host.invalid:10999: "), error
    assert "Unknown error" not in error, error


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("kind", ["dir", "fifo"])
async def test_an_unreadable_file(command: str, kind: str, files: dict[str, Path]) -> None:
    flag = FILE_FLAG[command]
    args = [*base_args(command, files), flag, str(files[kind])]
    error = await one_line_error(command, args)
    what = "is a directory, not a file" if kind == "dir" else "not a regular file"
    assert error == f"{flag}: {files[kind]}: {what}", error


async def test_an_inventory_without_read_permission(files: dict[str, Path]) -> None:
    """Unreadable by the user running the command (the tests run as root: the check is made by
    opening the file, which for root only fails on a file root cannot read either, so this
    runs where the tests are not root)."""
    if os.geteuid() == 0:
        pytest.skip("root reads every file; the directory and FIFO cases cover the check")
    files["inventory"].chmod(0)
    error = await one_line_error("dns", base_args("dns", files))
    assert error.startswith(f"--inventory: {files['inventory']}: cannot read it: "), error


@pytest.mark.parametrize("command", COMMANDS)
async def test_a_bad_log_level(command: str, files: dict[str, Path]) -> None:
    args = [*base_args(command, files), "--log-level", "LOUD"]
    error = await one_line_error(command, args)
    assert error == "--log-level: 'LOUD' is not one of DEBUG, INFO, WARNING, ERROR"


@pytest.mark.parametrize("command", ["server", "agent", "dns"])
async def test_an_unknown_gateway_field_in_the_inventory(
    command: str, files: dict[str, Path]
) -> None:
    """Raven's ``Replicas`` spelled ``replicas``: refused with its path and the right name."""
    text = files["inventory"].read_text()
    assert "Replicas: 1" in text
    files["inventory"].write_text(text.replace("Replicas: 1", "replicas: 1", 1))
    error = await one_line_error(command, base_args(command, files), started=True)
    assert error.endswith(
        ": Gateway gw-cloud: spec.proxyConfig.replicas: unknown field (did you mean Replicas?)"
    ), error
    assert error.startswith(str(files["inventory"])), error


async def test_the_controller_inventory_names_an_unknown_field(files: dict[str, Path]) -> None:
    text = files["inventory"].read_text()
    files["inventory"].write_text(text.replace("exposeType:", "exposetype:", 1))
    args = ["controller", "--inventory", str(files["inventory"]), "--dry-run"]
    error = await one_line_error("controller", args)
    assert error.endswith("spec.exposetype: unknown field (did you mean exposeType?)"), error


@pytest.mark.parametrize("command", COMMANDS)
async def test_start_up_logs_version_and_effective_settings(
    command: str, files: dict[str, Path], tmp_path: Path
) -> None:
    log = tmp_path / f"{command}.log"
    proc = spawn_python(["-m", "ravenproxy", *base_args(command, files)], log)
    try:
        await eventually(
            lambda: f"ravenproxy {command} starting" in log.read_text() or proc.poll() is not None,
            within=30,
            what=log.read_text,
        )
    finally:
        stop(proc)
    lines = [
        line for line in log.read_text().splitlines() if f"ravenproxy {command} starting" in line
    ]
    assert len(lines) == 1, log.read_text()
    line = lines[0]
    assert f"version={__version__}" in line
    flag = LISTEN_FLAG[command]
    assert f"{flag.removeprefix('--').replace('-', '_')}=127.0.0.1:" in line, line
    if command in ("server", "agent"):
        assert "key_file=" in line and "BEGIN" not in line, line


async def test_the_agent_health_address_serves_only_the_probes(
    files: dict[str, Path], tmp_path: Path
) -> None:
    metrics, health = free_port(), free_port()
    args = [*base_args("agent", files), "--metrics-addr", f"127.0.0.1:{metrics}",
            "--health-addr", f"127.0.0.1:{health}"]  # fmt: skip
    log = tmp_path / "agent.log"
    proc = spawn_python(["-m", "ravenproxy", *args], log)
    try:
        await eventually(lambda: http_get(health, "/healthz"), within=30, ignore=(OSError,))
        assert await http_get(health, "/healthz") == (200, "ok\n")
        status, body = await http_get(health, "/readyz")
        assert status == 503, body  # no server to reach
        for path in ("/metrics", "/agents"):
            assert (await http_get(health, path))[0] == 404, path
        status, body = await http_get(metrics, "/metrics")
        assert status == 200 and "ravenproxy_agent_tunnels_up" in body
    finally:
        await asyncio.to_thread(stop, proc)
