"""Helpers of the HA tests: several servers, agents' readiness, an echo round trip through a
chosen server, and a TCP round-robin load balancer."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

from tests.helpers import eventually, free_port, http_get, scrape
from tests.integration.cluster import Cluster, Proc

PORTS = ("tunnel", "http", "https", "metrics", "health")


def server_ports() -> dict[str, int]:
    return {k: free_port() for k in PORTS}


async def start_servers(cluster: Cluster, ids: tuple[str, ...]) -> dict[str, Proc]:
    """One server per id (``--server-id``), each on its own ports; returns once all listen."""
    servers = {
        sid: cluster.start_server("--server-id", sid, ports=server_ports(), name=f"server-{sid}")
        for sid in ids
    }
    for server in servers.values():
        await cluster.wait_up(server)
    return servers


def tunnel_addr(server: Proc) -> str:
    return f"wss://127.0.0.1:{server.ports['tunnel']}"


async def readyz(agent: Proc) -> tuple[int, str]:
    status, body = await http_get(agent.ports["metrics"], "/readyz")
    return status, body.strip()


async def wait_tunnels(cluster: Cluster, agent: Proc, text: str, within: float = 20) -> float:
    """Until the agent's /readyz body is ``text`` (e.g. ``tunnels up 3/3``); the seconds."""
    seen: list[tuple[int, str]] = []

    async def check() -> bool:
        seen.append(await readyz(agent))
        return seen[-1][1] == text

    return await eventually(
        check,
        within,
        interval=0.05,
        what=lambda: f"{agent.name} /readyz {text!r}, last {seen[-1:]}\n{cluster.logs()}",
        ignore=(OSError,),
    )


async def echo_via(cluster: Cluster, server: Proc, target: str, payload: bytes) -> None:
    """One CONNECT through ``server`` to an echo target, one round trip."""
    reader, writer = await cluster.connect(target, via=server)
    try:
        writer.write(payload)
        await writer.drain()
        async with asyncio.timeout(10):
            got = await reader.readexactly(len(payload))
        assert got == payload
    finally:
        writer.close()


def tunnel_up_key(server_id: str, address: str) -> str:
    """The agent's per-server tunnel gauge, as :func:`scrape` keys it."""
    return f'ravenproxy_agent_server_tunnel_up{{address="{address}",server="{server_id}"}}'


async def agent_metrics(agent: Proc) -> dict[str, float]:
    return await scrape(agent.ports["metrics"])


@contextlib.asynccontextmanager
async def round_robin(backends: list[int]) -> AsyncIterator[int]:
    """A TCP load balancer on 127.0.0.1: each new connection goes to the next port of
    ``backends`` in turn (a port listed twice gets two turns), bytes copied both ways."""
    turn = itertools.cycle(backends)
    tasks: set[asyncio.Task[None]] = set()  # the copy loops
    handlers: set[asyncio.Task[None]] = set()

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        assert me is not None
        handlers.add(me)  # type: ignore[arg-type]
        try:
            await relay(reader, writer)
        finally:
            handlers.discard(me)  # type: ignore[arg-type]
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", next(turn))
        except OSError:
            writer.close()
            return
        both = [
            asyncio.create_task(pipe(reader, up_writer)),
            asyncio.create_task(pipe(up_reader, writer)),
        ]
        tasks.update(both)
        try:
            # Cancelled at teardown: the handler still ends normally (asyncio logs a
            # connection callback that ends cancelled).
            await asyncio.gather(*both, return_exceptions=True)
        finally:
            tasks.difference_update(both)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, *handlers, return_exceptions=True)
        await server.wait_closed()
