"""Another agent's GOAWAY leaves a keep-alive client where it is (gendrain, issue 15), through
real processes: the server and two agents of edge-1 (HA) through the CLI, a hand-made tunnel
peer as edge-2's agent (it sends GOAWAY when told), a plain HTTP/1.1 keep-alive target in the
test that counts the connections it accepts.

A keep-alive client's requests go through one agent of edge-1 over one kept target
connection. Another agent coming (edge-1's second) and another node's agent draining (edge-2's
GOAWAY) must not move it: at ebcf73b each moved the registry's generation and the next request
was routed anew, to the least loaded agent of edge-1 — the other one, since the kept
connection's stream counts as load — and the kept connection was dropped for a new one. Its own
agent draining moves it: the next request goes to the other agent, over a new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import pytest

from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import GoAway
from tests.integration.cluster import Cluster, Proc
from tests.integration.targets import tcp_server
from tests.integration.tunnel.rawpeer import RawPeer, raw_peer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


class Target:
    """HTTP/1.1 keep-alive: ``200 ok`` to every request; counts the connections accepted."""

    def __init__(self) -> None:
        self.accepted = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()


class Client:
    """One keep-alive connection to the server's HTTP front, ``Host: edge-1:PORT``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.host, self.n = reader, writer, "", 0

    async def get(self) -> int:
        self.n += 1
        self.writer.write(f"GET /r{self.n} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        await asyncio.wait_for(self.reader.readexactly(length), 10)
        return int(head.split(b" ", 2)[1])


def _agent(cluster: Cluster, port: int, tag: str) -> Proc:
    """edge-1's agent, its log named by ``tag`` (both would write agent-edge-1.log)."""
    proc = cluster.start_agent("edge-1", f"127.0.0.1:{port}")
    named = proc.log.with_name(f"agent-edge-1-{tag}.log")
    proc.log.rename(named)
    proc.log = named
    return proc


def _lines(proc: Proc, text: str, node: str) -> int:
    return sum(1 for line in proc.output().splitlines() if text in line and f"node={node}" in line)


async def _registered(server: Proc, node: str, n: int) -> None:
    await server.wait_until(lambda: _lines(server, "agent registered", node) == n, f"{node} x{n}")


async def _drained(server: Proc, x: RawPeer) -> None:
    """edge-2's agent (the raw peer) sends GOAWAY; until the server has it."""
    await x.send(GoAway(0, ErrorCode.OK, "draining"))
    await server.wait_until(
        lambda: _lines(server, "peer is draining", "edge-2") == 1, "edge-2's GOAWAY"
    )


@contextlib.asynccontextmanager
async def _client(cluster: Cluster, port: int) -> AsyncIterator[Client]:
    client = Client(*await asyncio.open_connection("127.0.0.1", cluster.http_port))
    client.host = f"edge-1:{port}"
    try:
        yield client
    finally:
        client.writer.close()


async def test_another_nodes_agents_drain_keeps_an_ha_clients_upstream(cluster: Cluster) -> None:
    """Both agents of edge-1 up first: the client's first request goes through either; edge-2's
    agent drains; the client's next requests go through the same agent, same connection."""
    target = Target()
    server = cluster.start_server()
    async with tcp_server(target.handle) as port:
        for tag in "ab":
            _agent(cluster, port, tag)
        await _registered(server, "edge-1", 2)
        async with raw_peer(cluster, "edge-2") as x:
            await x.handshake()
            await _registered(server, "edge-2", 1)
            async with _client(cluster, port) as client:
                assert await client.get() == 200
                accepted = target.accepted
                await _drained(server, x)
                for _ in range(3):
                    assert await client.get() == 200
                assert target.accepted == accepted, "another agent's drain moved the client"


async def test_another_agents_coming_or_drain_keeps_the_clients_upstream_its_own_moves_it(
    cluster: Cluster,
) -> None:
    target = Target()
    server = cluster.start_server()
    async with tcp_server(target.handle) as port:
        mine = _agent(cluster, port, "a")
        await cluster.wait_routable(f"edge-1:{port}")
        await _registered(server, "edge-1", 1)
        async with raw_peer(cluster, "edge-2") as x:
            await x.handshake()
            await _registered(server, "edge-2", 1)
            async with _client(cluster, port) as client:
                assert await client.get() == 200  # through ``mine``, edge-1's only agent
                accepted = target.accepted
                assert await client.get() == 200
                assert target.accepted == accepted  # kept

                other = _agent(cluster, port, "b")  # edge-1's second agent comes
                await _registered(server, "edge-1", 2)
                assert await client.get() == 200
                assert target.accepted == accepted, "another agent's coming moved the client"

                await _drained(server, x)
                for _ in range(3):
                    assert await client.get() == 200
                assert target.accepted == accepted, "another agent's drain moved the client"

                mine.kill()  # its own agent goes: the next request goes to the other one
                await server.wait_until(
                    lambda: _lines(server, "agent unregistered", "edge-1") == 1, "its end"
                )
                assert await client.get() == 200
                assert target.accepted == accepted + 1
                assert await client.get() == 200
                assert target.accepted == accepted + 1
                assert other.running
