"""Helpers shared by the test suite: waiting for a condition, free and taken ports, child
processes that are stopped by PID, one raw HTTP exchange, a process's Prometheus metrics, and a
generated test file run by a real pytest (for the suite's own guards), and the example count of a
hypothesis test that asks for many.

Look here before writing a helper in a test file; the harnesses (``tests/integration/cluster.py``,
``tests/integration/l7/env.py``) are built on these.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import settings


# -- waiting ----------------------------------------------------------------------------------
async def eventually(
    check: Callable[[], object],
    within: float = 5.0,
    *,
    interval: float = 0.02,
    what: str | Callable[[], str] = "condition",
    ignore: tuple[type[Exception], ...] = (),
) -> float:
    """Call ``check()`` (a plain function, or one returning an awaitable) until it is truthy;
    return the seconds it took. After ``within`` seconds the test fails, naming ``what`` (a
    callable is asked only then, e.g. for a process's log) and the last exception of the
    ``ignore`` types, which count as "not yet" (a port not listening yet)."""
    start = time.monotonic()
    last: Exception | None = None
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except ignore as exc:
            last, result = exc, None
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > within:
            detail = what() if callable(what) else what
            error = f" (last error: {last!r})" if last is not None else ""
            pytest.fail(f"{detail}: not met within {within} s{error}", pytrace=False)
        await asyncio.sleep(interval)


# -- ports ------------------------------------------------------------------------------------
def _below_ephemeral() -> range:
    """Ports no outgoing connection is given: below the kernel's ephemeral range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(10000, max(low, 12000))


_PORTS = _below_ephemeral()
# Each test process starts at its own place in the range and never hands a port out twice.
_next_port = _PORTS.start + (os.getpid() * 7919) % len(_PORTS)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` now and stays free for a child process's flags.

    Taken below the ephemeral range, so no outgoing connection (an agent's dial, a test
    client) can be given it between this call and the child's bind, and never the same port
    twice in one test run: bind(port 0) handed out ports any connect() could take meanwhile,
    and a server then failed to start with "address in use"."""
    global _next_port
    for _ in range(len(_PORTS)):
        port = _next_port
        _next_port = _PORTS.start + (port + 1 - _PORTS.start) % len(_PORTS)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_PORTS} on {host}")


def is_free(port: int, host: str = "127.0.0.1", *, udp: bool = False) -> bool:
    """Nothing holds ``host:port``: a TCP socket (``udp``: and a UDP one) may bind it. A port
    in TIME_WAIT counts as free, as it does for a listener (SO_REUSEADDR)."""
    kinds = (socket.SOCK_STREAM, socket.SOCK_DGRAM) if udp else (socket.SOCK_STREAM,)
    for kind in kinds:
        with socket.socket(socket.AF_INET, kind) as s:
            if kind == socket.SOCK_STREAM:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                return False
    return True


@contextlib.contextmanager
def taken_port(*, udp: bool = False) -> Iterator[int]:
    """A loopback port another program holds while the block runs: a listening TCP socket
    (``udp``: and a UDP socket bound to the same port)."""
    with contextlib.ExitStack() as stack:
        tcp = stack.enter_context(socket.create_server(("127.0.0.1", 0)))
        port = int(tcp.getsockname()[1])
        if udp:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            sock.bind(("127.0.0.1", port))
        yield port


# -- child processes ----------------------------------------------------------------------------
def spawn(args: Sequence[str], log: Path, *, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``args`` in its own session, stdout and stderr appended to ``log``, no stdin.
    The caller stops it with :func:`stop` (in a ``finally``), by its PID."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(args),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
        )


def spawn_python(
    args: Sequence[str], log: Path, *, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """:func:`spawn` for ``python ARGS`` with this interpreter."""
    return spawn([sys.executable, *args], log, cwd=cwd)


def stop(popen: subprocess.Popen[bytes], timeout: float = 15) -> int:
    """SIGTERM, then SIGKILL after ``timeout``; returns the exit code (at once if it exited)."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
    return popen.returncode


async def run(*args: str, timeout: float = 30) -> tuple[int, str, str]:
    """Run a command (curl, dig) to its end; return (exit code, stdout, stderr). Killed by PID
    when it overruns ``timeout`` or the test is cancelled. Proxy variables are dropped from its
    environment (the tests name the proxy they mean)."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if "proxy" not in k.lower()},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except BaseException:
        if proc.returncode is None:
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
        raise
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def close_writer(writer: asyncio.StreamWriter, timeout: float = 5) -> None:
    """Close ``writer`` and wait until its socket is gone: a TLS writer's ``close()`` only
    starts the close_notify exchange, and the leak guard sees the socket until it ends (or
    ``timeout`` passes, then it is aborted)."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), timeout)
    except (OSError, TimeoutError):
        writer.transport.abort()


# -- HTTP and metrics -------------------------------------------------------------------------
async def upload(writer: asyncio.StreamWriter, head: str, size: int) -> None:
    """Write a request ``head`` and ``size`` bytes of body after it, all before reading (as a
    client uploading a body does), waiting out TCP's push-back (within 30 s)."""
    writer.write(head.encode())
    chunk = b"x" * (256 * 1024)
    async with asyncio.timeout(30):
        for _ in range(size // len(chunk)):
            writer.write(chunk)
            await writer.drain()  # a front that resets the connection fails this


async def raw_exchange(
    port: int, request: bytes, *, timeout: float = 15, source: str | None = None
) -> bytes:
    """Send ``request`` as it is to 127.0.0.1:``port`` (from address ``source`` if given) and
    read until the peer closes."""
    local = (source, 0) if source else None
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=local)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(timeout):
            return await reader.read()
    finally:
        writer.close()


async def http_get(
    port: int, path: str, host: str = "x", *, source: str | None = None, timeout: float = 10
) -> tuple[int, str]:
    """One HTTP/1.1 GET with ``Connection: close``; (status, body)."""
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    data = await raw_exchange(port, request, timeout=timeout, source=source)
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition → ``{'name{labels}': value}``."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values


async def scrape(port: int) -> dict[str, float]:
    """The /metrics of the process serving them on 127.0.0.1:``port``."""
    _, body = await http_get(port, "/metrics")
    return parse_metrics(body)


# -- hypothesis -------------------------------------------------------------------------------
THOROUGH = "thorough"
"""The hypothesis profile (``pytest --hypothesis-profile=thorough``, registered in
tests/conftest.py) under which :func:`examples` gives every test its full count."""
MANY = 300
"""Above this many examples a test's count is cut in the ordinary run: three times hypothesis's
default, the most any test here asked for outside a review's differential (oracle) tests."""


def examples(full: int, *, least: int = MANY) -> int:
    """``max_examples`` for a test written with ``full`` examples (a review's differential test,
    old code against new over generated inputs, asked for 400 to 3 000 to pin a change once).
    The ordinary run (``make test``, CI) takes a quarter of it and never under ``least``
    (:data:`MANY`; less only for a test whose example costs seconds), to keep the suite inside
    its 20-minute budget; ``--hypothesis-profile=thorough`` runs ``full`` (run it when you change
    what such a test pins)."""
    if settings.get_current_profile_name() == THOROUGH:
        return full
    return max(least, full // 4)


# -- the suite's own guards -------------------------------------------------------------------
GENERATED_INI = """\
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
"""


def run_generated_tests(
    base: Path, conftest: str, tests: str, ini: str = GENERATED_INI
) -> tuple[dict[str, set[str]], str]:
    """Write ``pytest.ini``, ``conftest.py`` and ``test_generated.py`` into ``base`` and run a real
    pytest there (this checkout importable as ``tests``): each generated test's outcomes
    (PASSED, FAILED, ERROR; a test can fail and also error at teardown) and the whole output."""
    (base / "pytest.ini").write_text(ini)
    (base / "conftest.py").write_text(conftest)
    (base / "test_generated.py").write_text(tests)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", "-W", "ignore"],
        cwd=base,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcomes: dict[str, set[str]] = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR) test_generated\.py::(\w+)", done.stdout, re.M):
        outcomes.setdefault(m[2], set()).add(m[1])
    return outcomes, done.stdout + done.stderr
