"""DNS over TCP under idle-connection pressure: a real ``ravenproxy dns`` process, and the
server object for the caps' finer points.

300 idle TCP connections from one address used to fill every slot, and every other client was
closed at once for 10 s at a time. Now idle clients are closed after a few seconds, one source
address holds at most a few connections, and when the server is full overall the longest-idle
connection makes room for a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import dns.asyncquery
import dns.exception
import dns.message
import pytest

from ravenproxy.controller.dns import DNSServer, TCPLimits, _source_key
from tests.helpers import free_port
from tests.integration.cluster import INVENTORY, Proc

pytestmark = pytest.mark.timeout(120)

HOST = "127.0.0.1"
RECORDS = {"edge-1": ["10.0.0.1"]}


def addresses(reply: dns.message.Message) -> list[str]:
    return sorted(r.to_text() for rrset in reply.answer for r in rrset)


async def tcp_query(port: int, name: str, source: str, timeout: float = 2) -> dns.message.Message:
    query = dns.message.make_query(name, "A")
    return await dns.asyncquery.tcp(query, HOST, port=port, timeout=timeout, source=source)


async def udp_query(port: int, name: str, source: str = HOST) -> dns.message.Message:
    query = dns.message.make_query(name, "A")
    return await dns.asyncquery.udp(query, HOST, port=port, timeout=2, source=source)


@contextlib.asynccontextmanager
async def idle_connections(
    port: int, count: int, source: str = HOST
) -> AsyncIterator[list[socket.socket]]:
    """``count`` TCP connections from ``source`` that never send a byte; closed on exit."""
    loop = asyncio.get_running_loop()
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setblocking(False)
            sock.bind((source, 0))
            await asyncio.wait_for(loop.sock_connect(sock, (HOST, port)), 10)
        yield socks
    finally:
        for sock in socks:
            sock.close()


async def closed_by_peer(sock: socket.socket, within: float) -> bool:
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.sock_recv(sock, 1), within) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def dns_process(tmp_path: Path) -> Iterator[Proc]:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    port = free_port()
    args = ["dns", "--inventory", str(inventory), "--listen", f"{HOST}:{port}"]
    proc = Proc("dns", args, tmp_path / "dns.log", ports={"dns": port}).start()
    try:
        yield proc
    finally:
        proc.stop()


async def wait_answering(proc: Proc) -> None:
    async def answering() -> bool:
        return addresses(await udp_query(proc.ports["dns"], "edge-1")) == ["127.0.0.1"]

    await proc.wait_until(answering, "dns answering", ignore=(OSError, dns.exception.Timeout))


async def test_300_idle_tcp_clients_do_not_lock_out_another_client(dns_process: Proc) -> None:
    """Default flags: the other client (another loopback address) is answered at once, UDP
    too, and every idle connection is closed within the idle timeout (3 s) plus a margin."""
    await wait_answering(dns_process)
    port = dns_process.ports["dns"]
    async with idle_connections(port, 300) as idle:
        await asyncio.sleep(0.5)  # let the server accept (and judge) all of them
        started = time.monotonic()
        reply = await tcp_query(port, "edge-1", source="127.0.0.2")
        assert addresses(reply) == ["127.0.0.1"]
        assert time.monotonic() - started < 2
        assert addresses(await udp_query(port, "edge-1", source="127.0.0.3")) == ["127.0.0.1"]
        results = await asyncio.gather(*(closed_by_peer(sock, 10) for sock in idle))
        assert all(results), f"{results.count(False)} idle connections still open"
    log = dns_process.output()
    assert "dns: TCP connection refused reason=per-source-cap source=127.0.0.1" in log, log
    # Rate-limited: a flood of refusals is a line a second; the trailing line sums it up.
    refusals = [line for line in log.splitlines() if "dns: TCP connection refused" in line]
    assert 1 <= len(refusals) < 30, refusals
    assert sum(int(line.rsplit("count=", 1)[1]) for line in refusals) >= 250, refusals
    assert dns_process.running


async def test_flags_set_the_tcp_limits(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    port = free_port()
    args = [
        "dns", "--inventory", str(inventory), "--listen", f"{HOST}:{port}",
        "--tcp-idle-timeout", "0.5", "--max-tcp-clients-per-source", "2",
        "--max-tcp-clients", "50",
    ]  # fmt: skip
    proc = Proc("dns", args, tmp_path / "dns.log", ports={"dns": port}).start()
    try:
        await wait_answering(proc)
        async with idle_connections(port, 3, source="127.0.0.4") as idle:
            # The third one from the same address is closed at once; the others after 0.5 s.
            assert await closed_by_peer(idle[2], 1)
            started = time.monotonic()
            assert all(await asyncio.gather(*(closed_by_peer(s, 3) for s in idle[:2])))
            assert 0.2 < time.monotonic() - started < 2.5
    finally:
        proc.stop()


@pytest.mark.parametrize(
    "flag,value", [("--tcp-idle-timeout", "0"), ("--max-tcp-clients-per-source", "x")]
)
def test_bad_flag_values_name_the_flag(tmp_path: Path, flag: str, value: str) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    args = ["dns", "--inventory", str(inventory), "--listen", f"{HOST}:0", flag, value]
    proc = Proc("dns", args, tmp_path / "dns.log").start()
    assert proc.popen is not None
    assert proc.popen.wait(30) == 2
    assert f"ravenproxy dns: error: {flag}:" in proc.output()


# --- the caps, on the server object -----------------------------------------------------------


async def test_when_full_the_longest_idle_connection_makes_room() -> None:
    srv = DNSServer(
        RECORDS, limits=TCPLimits(idle_timeout=30, max_clients=6, max_clients_per_source=3)
    )
    await srv.start(HOST, 0)
    try:
        async with (
            idle_connections(srv.port, 3, source="127.0.0.2") as first,
            idle_connections(srv.port, 3, source="127.0.0.3") as second,
        ):
            # Full (6 of 6), all idle: a new client evicts the oldest, first[0], and is served.
            reply = await tcp_query(srv.port, "edge-1", source="127.0.0.4")
            assert addresses(reply) == ["10.0.0.1"]
            assert await closed_by_peer(first[0], 2)
            for sock in first[1:] + second:
                assert not await closed_by_peer(sock, 0.05)
            assert srv.tcp_evicted == 1 and not srv.tcp_refused
    finally:
        await srv.close()


async def test_a_client_sending_a_query_slowly_is_cut_off() -> None:
    """The timeout covers a whole message, not each byte: a trickle does not keep a slot."""
    srv = DNSServer(RECORDS, limits=TCPLimits(idle_timeout=0.5))
    await srv.start(HOST, 0)
    loop = asyncio.get_running_loop()
    try:
        with socket.socket() as sock:
            sock.setblocking(False)
            await loop.sock_connect(sock, (HOST, srv.port))
            started = time.monotonic()
            wire = dns.message.make_query("edge-1", "A").to_wire()
            frame = len(wire).to_bytes(2, "big") + wire
            with contextlib.suppress(ConnectionError):
                for byte in frame[:-1]:
                    await loop.sock_sendall(sock, bytes([byte]))
                    await asyncio.sleep(0.1)
            assert await closed_by_peer(sock, 2)
            assert time.monotonic() - started < 2
    finally:
        await srv.close()


def test_a_taken_port_is_a_one_line_error_exit(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((HOST, 0))
        port = taken.getsockname()[1]
        args = ["dns", "--inventory", str(inventory), "--listen", f"{HOST}:{port}"]
        proc = Proc("dns", args, tmp_path / "dns.log").start()
        assert proc.popen is not None
        assert proc.popen.wait(30) == 2
    out = proc.output()
    # One line, naming the flag; the dns server's own sockets and its inventory watcher are
    # stopped with it (an exit, not a hang).
    errors = [line for line in out.splitlines() if "error:" in line]
    assert errors == [line for line in out.splitlines() if line.strip()], out
    assert len(errors) == 1, out
    assert f"ravenproxy dns: error: --listen: cannot bind UDP {HOST}:{port}: " in out, out
    assert ": None" not in out, out
    assert "Traceback" not in out, out


@pytest.mark.parametrize(
    "peer,key",
    [
        (("127.0.0.1", 5353), "127.0.0.1"),
        (("2001:db8:1:2:aaaa::1", 5353, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 5353, 0, 0), "2001:db8:1:2::/64"),
        (("::ffff:10.0.0.7", 5353, 0, 0), "10.0.0.7"),
        (("fe80::1%eth0", 5353, 0, 2), "fe80::/64"),
    ],
)
def test_sources_are_counted_by_address_and_ipv6_by_64(peer: tuple[object, ...], key: str) -> None:
    assert _source_key(peer) == key
