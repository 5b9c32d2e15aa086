"""review32: SIGTERM to a real ``ravenproxy server`` / ``agent`` while its inventory reader (the
child of :func:`ravenproxy.model.inventory.aload_inventory`) runs, at start-up and during a
reload: the process exits as a SIGTERM makes it exit otherwise, without a traceback, and the
child is killed and reaped with it (no process left behind, no zombie). A server still starting
has no handler yet and dies of the signal: its reader ends with it (``PR_SET_PDEATHSIG``) and is
reaped by whoever adopts it (here the test, as a container's init would)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cluster import INVENTORY, Cluster, Proc
from tests.unit.model.test_inventory_child_review import SLOW_YAML, replace, started

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def gone(pid: int) -> bool:
    """Neither alive nor a zombie anywhere (a zombie keeps its /proc entry)."""
    return not Path(f"/proc/{pid}").exists()


def readers_of(proc: Proc, pids: Path) -> list[int]:
    """The inventory readers started (:data:`SLOW_YAML`'s record) whose parent is ``proc``."""
    assert proc.popen is not None
    found = []
    for pid in started(pids):
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
            if f"\nPPid:\t{proc.popen.pid}\n" in status:
                found.append(pid)
    return found


def start(cluster: Cluster, role: str) -> Proc:
    if role == "server":
        return cluster.start_server()
    cluster.start_server()
    return cluster.start_agent("edge-1", extra=("--inventory", str(cluster.inventory)))


async def agent_up(cluster: Cluster) -> None:
    await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v >= 1)


async def sigterm_exit(proc: Proc) -> int:
    assert proc.popen is not None
    proc.popen.send_signal(signal.SIGTERM)
    return await asyncio.to_thread(proc.popen.wait, 20)


_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


@contextlib.contextmanager
def subreaper() -> Iterator[None]:
    """This process adopts its descendants' orphans while in the block, as a container's init
    would (this host's pid 1 leaves them zombies): a child killed with its parent is reaped
    here (:func:`reaped_after_its_parent`)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    assert prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


async def reaped_after_its_parent(pid: int) -> None:
    """``pid``, adopted by this process (:func:`subreaper`), ends within 5 s, killed by
    SIGKILL (``PR_SET_PDEATHSIG``: :func:`ravenproxy.children.main`); it is reaped here."""
    async with asyncio.timeout(5):
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)  # noqa: ASYNC222 - WNOHANG: never blocks
            if done:
                break
            await asyncio.sleep(0.02)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status


@pytest.mark.parametrize(
    ("role", "when"),
    [("server", "start"), ("server", "reload"), ("agent", "start"), ("agent", "reload")],
)
async def test_sigterm_while_the_inventory_reader_runs(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, role: str, when: str
) -> None:
    site = tmp_path / "slow"
    site.mkdir()
    mark, pids = tmp_path / "slow.mark", tmp_path / "slow.pids"
    (site / "yaml.py").write_text(SLOW_YAML.format(mark=str(mark), pids=str(pids)))
    monkeypatch.setenv("PYTHONPATH", str(site))  # inherited by the processes, their children
    stack = contextlib.ExitStack()
    try:
        # The exit of an undisturbed SIGTERM, for comparison; a server has no handler before
        # it has started (as in 1bb5933): SIGTERM's default action.
        proc = start(cluster, role)
        await cluster.wait_up(cluster.server)
        if role == "agent":
            await agent_up(cluster)
        usual = await sigterm_exit(proc)
        if (role, when) == ("server", "start"):
            usual = -signal.SIGTERM
        cluster.stop_all()
        cluster.procs.clear()

        if role == "agent":
            cluster.start_server()
            await cluster.wait_up(cluster.server)
        if when == "start":
            mark.write_text("60")  # every child from now on hangs a minute
        if role == "server":
            if when == "start":  # the server dies of SIGTERM, its reader with it
                stack.enter_context(subreaper())
            proc = cluster.start_server()
        else:
            proc = cluster.start_agent("edge-1", extra=("--inventory", str(cluster.inventory)))
        if when == "reload":
            if role == "server":
                await cluster.wait_up(proc)
            else:
                await agent_up(cluster)
            mark.write_text("60")
            replace(cluster.inventory, INVENTORY + "# an edit\n")
        # The server reads the same file: its reader is not the one this test is about.
        await proc.wait_until(lambda: readers_of(proc, pids), "the inventory reader started")
        children = readers_of(proc, pids)
        assert children and all(not gone(pid) for pid in children)
        code = await sigterm_exit(proc)
        out = proc.output()
        assert "Traceback" not in out, out
        assert code == usual, out
        if (role, when) == ("server", "start"):
            for pid in children:
                await reaped_after_its_parent(pid)
        await asyncio.sleep(0.5)
        for pid in children:
            assert gone(pid), (pid, out)
    finally:
        for pid in started(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stack.close()
