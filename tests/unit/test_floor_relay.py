"""benchmarks/floor_relay.py (latency.py's ``floor`` row): two real relay processes, chained
over mTLS, in front of a target in the test. A client connection relays both ways, and its end
ends the relayed connections behind it — also when the client leaves before its relay has
dialled on (its end used to be lost then: the late connection stayed open for the life of the
relays, at A and at B)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ravenproxy.pki import init_pki

RELAY = Path(__file__).resolve().parents[2] / "benchmarks" / "floor_relay.py"


class Target:
    """Echoes; keeps every connection it accepted, open or not."""

    def __init__(self) -> None:
        self.ended: list[asyncio.Event] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ended = asyncio.Event()
        self.ended.append(ended)
        try:
            while data := await reader.read(65536):
                writer.write(data)
        except ConnectionError:
            pass
        finally:
            ended.set()
            writer.close()

    def open(self) -> int:
        return sum(not e.is_set() for e in self.ended)


def _port(path: Path, proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        assert proc.poll() is None, f"{path.stem} exited"
        time.sleep(0.02)
    raise AssertionError(f"{path.stem} did not start")


@pytest.fixture
def relays(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield tmp_path, procs
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def start_floor(base: Path, procs: list[subprocess.Popen[bytes]], target_port: int) -> int:
    certs = base / "certs"
    init_pki(certs, ("localhost", "127.0.0.1"), ("edge-1",))

    def start(name: str, to_port: int, tls: str, who: str) -> int:
        port_file = base / f"{name}.port"
        proc = subprocess.Popen(
            [sys.executable, str(RELAY), str(port_file), str(to_port), tls,
             str(certs / "ca.crt"), str(certs / f"{who}.crt"), str(certs / f"{who}.key")],
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(proc)
        return _port(port_file, proc)

    b = await asyncio.to_thread(start, "floor-b", target_port, "--tls-in", "server")
    return await asyncio.to_thread(start, "floor-a", b, "--tls-out", "edge-1")


async def wait_all_ended(target: Target, timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while target.open() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def test_a_client_leaving_before_the_relay_dialled_on_leaves_nothing_open(
    relays: tuple[Path, list[subprocess.Popen[bytes]]],
) -> None:
    base, procs = relays
    target = Target()
    server = await asyncio.start_server(target.handle, "127.0.0.1", 0)
    try:
        port = await start_floor(base, procs, server.sockets[0].getsockname()[1])

        # A relayed connection carries bytes both ways; its client's close ends it behind.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
        writer.close()
        await wait_all_ended(target)
        assert (len(target.ended), target.open()) == (1, 0)

        # Clients that leave at once (before relay A's TLS connection to B is up).
        for _ in range(10):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.transport.abort()
        deadline = time.monotonic() + 3  # B dials the target as it accepts A: up to 10 more
        while len(target.ended) < 11 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(target.ended) >= 2, "relay B never dialled the target"
        await wait_all_ended(target)
        assert target.open() == 0, f"{target.open()} of {len(target.ended)} left open"
    finally:
        server.close()
        await server.wait_closed()
