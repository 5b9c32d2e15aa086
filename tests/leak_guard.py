"""The suite-wide leak guard: a test that leaves asyncio tasks or sockets behind fails.

``tests/conftest.py`` imports the fixture and the hook from here, so every test gets it; the
proof that it catches leaks (and lets clean tests pass) is ``tests/test_leak_guard.py``.

- **Tasks** (async tests): when the test body and every function-scoped fixture have finished,
  no task may still be pending on the test's loop. A task that is finishing (cancelled, or one
  step from its end) gets a grace of a few loop iterations, then up to ``GRACE`` seconds.
- **Sockets**: the process's own sockets (``/proc/self/fd`` links ``socket:[inode]``) after the
  function-scoped fixtures are torn down, compared with before they were set up. The baseline is
  taken after every wider-scoped fixture exists (pytest sets those up first), so a package fixture
  that holds sockets on purpose (the L7 test bed) is never counted against a test. Before a
  socket is called leaked, the loop runs (a transport closes its socket one iteration after
  ``close()``) and ``gc.collect()`` runs (an unreferenced socket is closed by its finaliser).
  The failure names each socket by its address from ``/proc/net``.

A test that already failed is not also reported for what it left behind: its leaks are most likely
the failure's consequence, and the runner cancels the tasks anyway.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
from pytest_asyncio import is_async_test

GRACE = 0.5
"""Seconds a finishing task or a closing socket may take after the test before it is a leak."""

_CALL_FAILED = pytest.StashKey[bool]()


# -- sockets ----------------------------------------------------------------------------------
def open_sockets() -> dict[int, int]:
    """The sockets this process holds open: inode → one file descriptor of it."""
    found: dict[int, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing (or the listing's own fd)
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(fd)
    return found


def _hex_address(text: str) -> str:
    """``/proc/net/tcp`` form (``0100007F:1F90``, 32-bit words in host order) → ``ip:port``."""
    addr, port = text.split(":")
    raw = bytes.fromhex(addr)
    # Each 32-bit word is stored little-endian on the machines we run on (x86, arm64).
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        return f"{socket.inet_ntop(socket.AF_INET, raw)}:{int(port, 16)}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{int(port, 16)}"


def _by_fd(fd: int) -> str:
    """Ask the socket itself (a bound TCP socket that neither listens nor connects is in no
    ``/proc/net`` table)."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return "(address unknown)"
    with sock:
        try:
            name = sock.getsockname()
        except OSError:
            name = "?"
        kind = {socket.SOCK_STREAM: "stream", socket.SOCK_DGRAM: "dgram"}.get(sock.type, "")
        return f"{sock.family.name} {kind} {name or '(unbound)'}"


def describe_sockets(inodes: dict[int, int]) -> list[str]:
    """One line per socket (inode → fd): kind, local and remote address."""
    known: dict[int, str] = {}
    for kind in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/self/net/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            inode = int(cols[9])
            if inode in inodes:
                local, remote = _hex_address(cols[1]), _hex_address(cols[2])
                known[inode] = f"{kind} {local} -> {remote}"
    try:
        unix = Path("/proc/self/net/unix").read_text().splitlines()[1:]
    except OSError:
        unix = []
    for line in unix:
        cols = line.split()
        if len(cols) >= 7 and int(cols[6]) in inodes:
            known[int(cols[6])] = f"unix {cols[7] if len(cols) > 7 else '(unnamed)'}"
    return [f"socket:[{i}] {known.get(i) or _by_fd(fd)}" for i, fd in sorted(inodes.items())]


def _socket_report(leaked: dict[int, int]) -> str:
    lines = describe_sockets(leaked)
    return f"{len(leaked)} socket(s) left open by the test:\n  " + "\n  ".join(lines)


def _new_sockets(before: dict[int, int]) -> dict[int, int]:
    """Sockets opened since ``before`` and still open; the collector runs only when there are
    some (it costs milliseconds, most tests leave nothing)."""
    for collect in (False, True):
        if collect:
            gc.collect()
        new = {inode: fd for inode, fd in open_sockets().items() if inode not in before}
        if not new:
            break
    return new


# -- tasks ------------------------------------------------------------------------------------
def _pending_tasks() -> set[asyncio.Task[object]]:
    me = asyncio.current_task()
    return {t for t in asyncio.all_tasks() if t is not me and not t.done()}


def _where(task: asyncio.Task[object]) -> str:
    """The task's coroutine and the line it waits at (its creator is not recorded outside
    asyncio debug mode; the coroutine's name and file usually tell)."""
    coro = task.get_coro()
    name = getattr(coro, "__qualname__", repr(coro))
    frame = getattr(coro, "cr_frame", None)
    if frame is None:
        return str(name)
    return f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}"


def _task_report(tasks: set[asyncio.Task[object]]) -> str:
    lines = sorted(f"{t.get_name()}: {_where(t)}" for t in tasks)
    return f"{len(tasks)} asyncio task(s) still pending after the test:\n  " + "\n  ".join(lines)


# -- fixtures ---------------------------------------------------------------------------------
def _failed(request: pytest.FixtureRequest) -> bool:
    return bool(request.node.stash.get(_CALL_FAILED, False))


@pytest.fixture
async def _async_leak_guard(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """The guard for an async test, run on the test's own loop (which already exists here, so
    its self-pipe sockets are part of the baseline)."""
    before = open_sockets()
    yield
    if _failed(request):
        return
    deadline = time.monotonic() + GRACE
    # A few bare iterations first: a task cancelled without being awaited, or a transport
    # closed without wait_closed(), finishes within one or two.
    for _ in range(3):
        await asyncio.sleep(0)
    tasks = _pending_tasks()
    while tasks and time.monotonic() < deadline:
        await asyncio.wait(tasks, timeout=deadline - time.monotonic())
        tasks = _pending_tasks()
    leaked = _new_sockets(before)
    while leaked and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        leaked = _new_sockets(before)
    problems = []
    if tasks:
        problems.append(_task_report(tasks))
    if leaked:
        problems.append(_socket_report(leaked))
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
def leak_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Autouse, function-scoped and first of its scope: see the module docstring."""
    if is_async_test(request.node):
        # Only async tests get a loop; a sync test keeps running without one.
        request.getfixturevalue("_async_leak_guard")
        yield
        return
    before = open_sockets()
    yield
    if _failed(request):
        return
    deadline = time.monotonic() + GRACE
    leaked = _new_sockets(before)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.02)
        leaked = _new_sockets(before)
    if leaked:
        pytest.fail(_socket_report(leaked), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test's setup or body failed, for the guard's teardown."""
    report = yield
    if report.when in ("setup", "call") and report.failed:
        item.stash[_CALL_FAILED] = True
    return report
