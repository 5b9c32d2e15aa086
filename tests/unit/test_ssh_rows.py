"""The ssh rows of benchmarks/throughput.py and idle_cost.py, as latency.py's
(benchmarks/sshrow.py): the ``ssh -R`` client runs a session (sshd sets TCP_NODELAY only then),
``--ssh-n`` adds the ``ssh -N`` form; both forms forward, the session's remote command ends with
the processes, and with ``--ssh-n`` the session and ``-N`` rows take turns going first. Real
processes: a private sshd, ssh clients, throughput.py's sink."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.benchscripts import cmdline, load_script, needs_ssh, wait_ended

# Serial (tests/conftest.py): real sshd, ssh clients and the benchmark's sink, with deadlines.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def throughput() -> Iterator[ModuleType]:
    yield from load_script("throughput")


@pytest.fixture(scope="module")
def idle_cost() -> Iterator[ModuleType]:
    yield from load_script("idle_cost")


def _tree(t: ModuleType, pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += t._children(out[-1])
    return out


@needs_ssh
async def test_throughput_forwards_run_a_session_unless_n_and_leave_nothing_behind(
    throughput: ModuleType, tmp_path: Path
) -> None:
    """Both forms carry a segment to the sink; the default forward runs its remote command
    under sshd (``-N`` runs none: the throughput rows were ``-N`` before), and stopping the
    processes ends that command too."""
    t = throughput
    procs = t.Procs()
    started: list[int] = []
    try:
        sink = await t.start_sink(procs, tmp_path)
        ssh = await t.start_sshd(procs, tmp_path)
        session = t.Forward(ssh, t.SSH_CIPHERS[0][1])
        no_session = t.Forward(ssh, t.SSH_CIPHERS[0][1], session=False)
        for forward in (session, no_session):
            await forward.start(procs, sink)

            def connect(f: Any = forward) -> Any:
                return asyncio.open_connection("127.0.0.1", f.port)

            nbytes, _ = await asyncio.wait_for(t.measure(connect, 2, t.MIB, 0), 30)
            assert nbytes == 2 * t.MIB
        assert "-N" not in cmdline(session.proc.pid).split()
        assert "-N" in cmdline(no_session.proc.pid).split()
        deadline = time.monotonic() + 10
        while not [p for p in _tree(t, ssh.pid) if "tail --pid" in cmdline(p)]:
            assert time.monotonic() < deadline, [cmdline(p) for p in _tree(t, ssh.pid)]
            await asyncio.sleep(0.05)
        # One session: the -N client's connection runs no command.
        assert len([p for p in _tree(t, ssh.pid) if "tail --pid" in cmdline(p)]) == 1
        started = [*_tree(t, ssh.pid), session.proc.pid, no_session.proc.pid]
    finally:
        await procs.stop()
    await asyncio.to_thread(wait_ended, started)


def test_session_and_n_rows_take_turns_going_first(throughput: ModuleType) -> None:
    """With ``--ssh-n`` the forwards' order is reversed every other round, and the ssh rows'
    slots follow it (as the tunnel rows' follow their pairs'); the other rows stay put."""
    t = throughput
    ssh = t.Ssh(Path("/nowhere"), 0, Path("/nowhere/key"), "plain", "", 0)
    aes, chacha = t.SSH_CIPHERS[0][1], t.SSH_CIPHERS[1][1]
    forwards = [t.Forward(ssh, aes), t.Forward(ssh, chacha), t.Forward(ssh, aes, session=False)]
    pairs = [t.Pair("tunnel", "tunnel", None), t.Pair("base", "base", Path("/base"))]

    def row(key: str, **owner: Any) -> Any:
        return t.Row(key, key, 1, None, 1, 0, **owner)

    rows = [
        row("direct"),
        row("tunnel", pair=pairs[0]),
        row("base", pair=pairs[1]),
        row("ssh_aes128", forward=forwards[0]),
        row("ssh_aes128_x8", forward=forwards[0]),
        row("ssh_chacha20", forward=forwards[1]),
        row("ssh-N_aes128", forward=forwards[2]),
        row("ssh-N_aes128_x8", forward=forwards[2]),
        row("direct_x8"),
    ]
    keys = [r.key for r in t._in_start_order(rows, pairs, forwards)]
    assert keys == [r.key for r in rows]
    keys = [r.key for r in t._in_start_order(rows, pairs[::-1], forwards[::-1])]
    assert keys == [
        "direct",
        "base",
        "tunnel",
        "ssh-N_aes128",
        "ssh-N_aes128_x8",
        "ssh_chacha20",
        "ssh_aes128",
        "ssh_aes128_x8",
        "direct_x8",
    ]


@needs_ssh
async def test_idle_cost_measures_the_session_client_and_with_n_the_other(
    idle_cost: ModuleType, tmp_path: Path
) -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        row = await idle_cost._ssh_client_rss(tmp_path, port, ssh_n=True)
    finally:
        server.close()
        await server.wait_closed()
    assert "error" not in row, row
    assert row["ssh_client"].startswith("ssh -T -R")
    # An idle OpenSSH client is some MB, either form.
    assert 1024 < row["ssh_client_rss_kib"] < 65536
    assert 1024 < row["ssh_n_client_rss_kib"] < 65536
