"""The embedded DNS server on loopback, queried by dnspython and by the real ``dig``."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import dns.asyncquery
import dns.message
import dns.rcode
import pytest

from ravenproxy.controller.dns import DNSServer, DNSServerError, TCPLimits
from ravenproxy.controller.dnsfeed import run_dns
from ravenproxy.controller.dnsmap import dns_map
from ravenproxy.model.inventory import InventoryWatcher
from ravenproxy.model.store import ModelStore
from tests.helpers import eventually, run

HOST = "127.0.0.1"
RECORDS = {"edge-1": ["10.0.0.1", "fd00::1"], "edge-2": ["10.0.0.2"]}


@pytest.fixture
async def server() -> AsyncIterator[DNSServer]:
    srv = DNSServer(RECORDS, suffix="tunnel.local")
    await srv.start(HOST, 0)
    try:
        yield srv
    finally:
        await srv.close()


def dig_path() -> str:
    path = shutil.which("dig")
    if path is None:
        pytest.fail(
            "dig not found: install Debian's bind9-dnsutils (`make test` does); these tests use "
            "the real dig client on purpose"
        )
    return path


async def dig(port: int, *args: str) -> str:
    code, out, err = await run(
        dig_path(), f"@{HOST}", "-p", str(port), "+time=2", "+tries=1", *args
    )
    assert code == 0, err
    return out


async def query(port: int, name: str, rdtype: str = "A", tcp: bool = False) -> dns.message.Message:
    q = dns.message.make_query(name, rdtype)
    if tcp:
        return await dns.asyncquery.tcp(q, HOST, port=port, timeout=2)
    return await dns.asyncquery.udp(q, HOST, port=port, timeout=2)


def ips(reply: dns.message.Message) -> list[str]:
    return sorted(r.to_text() for rrset in reply.answer for r in rrset)


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
async def test_dnspython_gets_the_mapped_addresses(server: DNSServer, tcp: bool) -> None:
    assert ips(await query(server.port, "edge-1", "A", tcp)) == ["10.0.0.1"]
    assert ips(await query(server.port, "edge-1", "AAAA", tcp)) == ["fd00::1"]
    assert ips(await query(server.port, "EDGE-2.tunnel.local", "A", tcp)) == ["10.0.0.2"]
    reply = await query(server.port, "nope", "A", tcp)
    assert reply.rcode() == dns.rcode.NXDOMAIN


@pytest.mark.parametrize("transport", [[], ["+tcp"]], ids=["udp", "tcp"])
async def test_dig_gets_the_mapped_address(server: DNSServer, transport: list[str]) -> None:
    assert (await dig(server.port, "edge-1", "+short", *transport)).split() == ["10.0.0.1"]
    assert (
        await dig(server.port, "edge-1.tunnel.local", "AAAA", "+short", *transport)
    ).split() == ["fd00::1"]
    full = await dig(server.port, "unknown-node", *transport)
    assert "status: NXDOMAIN" in full
    assert "flags: qr aa" in full


async def test_a_map_update_is_answered_within_a_second(server: DNSServer) -> None:
    server.update({"edge-1": ["10.0.0.99"], "edge-3": ["10.0.0.3"]})

    async def answered() -> bool:
        return ips(await query(server.port, "edge-1")) == ["10.0.0.99"] and ips(
            await query(server.port, "edge-3", tcp=True)
        ) == ["10.0.0.3"]

    await eventually(answered, within=1.0)
    assert (await dig(server.port, "edge-3", "+short")).split() == ["10.0.0.3"]
    assert (await query(server.port, "edge-2")).rcode() == dns.rcode.NXDOMAIN


async def test_garbage_does_not_stop_the_server(server: DNSServer) -> None:
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        sock.connect((HOST, server.port))
        sock.send(struct.pack("!HHHHHH", 99, 0, 1, 0, 0, 0) + b"\xde\xad")
        reply = dns.message.from_wire(await asyncio.wait_for(loop.sock_recv(sock, 512), 2))
        assert reply.id == 99 and reply.rcode() == dns.rcode.FORMERR
        sock.send(b"\x01")  # too short to answer: dropped
    # TCP: a frame of garbage gets FORMERR on the same connection, which stays usable.
    reader, writer = await asyncio.open_connection(HOST, server.port)
    try:
        junk = struct.pack("!HHHHHH", 7, 0, 1, 0, 0, 0) + b"\xff"
        writer.write(struct.pack("!H", len(junk)) + junk)
        good = dns.message.make_query("edge-2", "A").to_wire()
        writer.write(struct.pack("!H", len(good)) + good)
        await writer.drain()
        for expect in ("formerr", "answer"):
            (n,) = struct.unpack("!H", await asyncio.wait_for(reader.readexactly(2), 2))
            msg = dns.message.from_wire(await reader.readexactly(n))
            if expect == "formerr":
                assert msg.rcode() == dns.rcode.FORMERR
            else:
                assert ips(msg) == ["10.0.0.2"]
    finally:
        writer.close()
        await writer.wait_closed()
    assert ips(await query(server.port, "edge-1")) == ["10.0.0.1"]


async def test_close_drops_idle_tcp_clients_and_frees_the_port() -> None:
    srv = DNSServer(RECORDS)
    await srv.start(HOST, 0)
    port = srv.port
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        await eventually(lambda: len(srv._clients) == 1, within=1.0)
        await asyncio.wait_for(srv.close(), 2)
        assert await asyncio.wait_for(reader.read(), 2) == b""
    finally:
        writer.close()
    # Both protocols are released: a new server binds the same port at once.
    again = DNSServer(RECORDS)
    await again.start(HOST, port)
    try:
        assert ips(await query(port, "edge-2", tcp=True)) == ["10.0.0.2"]
    finally:
        await again.close()


async def test_idle_tcp_connections_time_out() -> None:
    srv = DNSServer(RECORDS, limits=TCPLimits(idle_timeout=0.2))
    await srv.start(HOST, 0)
    try:
        reader, writer = await asyncio.open_connection(HOST, srv.port)
        try:
            assert await asyncio.wait_for(reader.read(), 2) == b""
        finally:
            writer.close()
    finally:
        await srv.close()


async def test_binding_a_taken_port_is_a_typed_error(server: DNSServer) -> None:
    other = DNSServer(RECORDS)
    with pytest.raises(DNSServerError, match=str(server.port)):
        await other.start(HOST, server.port)
    await other.close()


# --- wired to the YAML inventory --------------------------------------------------------------

INVENTORY = """\
apiVersion: v1
kind: Node
metadata: {{name: edge-1, labels: {{raven.openyurt.io/gateway: gw-edge}}}}
status:
  addresses: [{{type: InternalIP, address: {ip}}}]
  conditions: [{{type: Ready, status: "True"}}]
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-edge}}
spec:
  endpoints: [{{nodeName: edge-1, type: proxy}}]
"""


def write_inventory(path: Path, ip: str) -> None:
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(INVENTORY.format(ip=ip))
    # Same size, same second: make sure the watcher's stamp sees a change on any filesystem.
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


async def test_inventory_change_reaches_the_dns_answers(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    write_inventory(path, "10.0.0.1")
    store = ModelStore()
    watcher = InventoryWatcher(path, store)
    srv = DNSServer(dns_map(watcher.load_initial()))
    store.subscribe(lambda model: srv.update(dns_map(model)))
    await srv.start(HOST, 0)
    try:
        assert (await dig(srv.port, "edge-1", "+short")).split() == ["10.0.0.1"]
        write_inventory(path, "10.0.0.42")
        assert watcher.check()
        await eventually(lambda: _answers(srv.port, "edge-1", ["10.0.0.42"]), within=1.0)
        assert (await dig(srv.port, "edge-1", "+short", "+tcp")).split() == ["10.0.0.42"]
    finally:
        await srv.close()


async def _answers(port: int, name: str, expect: list[str]) -> bool:
    return ips(await query(port, name)) == expect


async def test_run_dns_serves_and_follows_the_inventory_until_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    write_inventory(path, "10.0.0.1")
    started: asyncio.Future[DNSServer] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_dns(path, (HOST, 0), suffix="edge.local", interval=0.05, started=started.set_result)
    )
    try:
        srv = await asyncio.wait_for(started, 5)
        port = srv.port
        assert ips(await query(port, "edge-1.edge.local")) == ["10.0.0.1"]
        write_inventory(path, "10.0.0.77")
        took = await eventually(lambda: _answers(port, "edge-1", ["10.0.0.77"]), within=1.0)
        assert took < 1.0
        path.write_text("kind: [broken")  # a half-written edit keeps the last good map
        await asyncio.sleep(0.2)
        assert ips(await query(port, "edge-1")) == ["10.0.0.77"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # Cancelling run_dns closed the sockets.
    with pytest.raises(OSError):
        await asyncio.wait_for(asyncio.open_connection(HOST, port), 2)
