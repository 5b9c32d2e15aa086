"""The fronts' accept loop against the real kernel: the connection gate closes what is past the
cap, and running out of descriptors (a real EMFILE, from a lowered RLIMIT_NOFILE) is counted and
logged at most once a second while the loop keeps going."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ravenproxy.metrics import ServerMetrics
from ravenproxy.server.accept import FrontListener
from ravenproxy.server.limits import ConnectionGate


def value(metrics: ServerMetrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(name, labels)
    return got or 0.0


@contextlib.asynccontextmanager
async def listener(
    gate: ConnectionGate, metrics: ServerMetrics, served: list[Any]
) -> AsyncIterator[tuple[FrontListener, int, set[asyncio.Task[Any]]]]:
    tasks: set[asyncio.Task[Any]] = set()
    hold = asyncio.Event()

    async def handler(conn: socket.socket, peer: Any) -> None:
        served.append(peer)
        try:
            await hold.wait()
        finally:
            conn.close()

    front = FrontListener("http", handler, gate, metrics, tasks.add)
    port = await front.start("127.0.0.1", 0)
    try:
        yield front, port, tasks
    finally:
        await front.stop()
        hold.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_connections_past_the_cap_are_closed_at_once() -> None:
    gate, metrics, served = ConnectionGate(3), ServerMetrics(), []
    async with listener(gate, metrics, served) as (_, port, _tasks):
        clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        try:
            for reader, _ in clients[3:]:
                assert await asyncio.wait_for(reader.read(), 2) == b""
            assert len(served) == 3 and gate.open == 3
            assert (
                value(metrics, "ravenproxy_server_front_connections_refused_total", front="http")
                == 2
            )
        finally:
            for _, writer in clients:
                writer.close()


def _first_free_fd() -> int:
    used = {int(name) for name in os.listdir("/proc/self/fd")}
    fd = 0
    while fd in used:
        fd += 1
    return fd


async def test_out_of_descriptors_is_counted_and_logged_once_a_second(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate, metrics, served = ConnectionGate(100), ServerMetrics(), []
    caplog.set_level(logging.WARNING, logger="ravenproxy.server.accept")
    async with listener(gate, metrics, served) as (_, port, _tasks):
        # Connections wait in the backlog; then no descriptor is left for accept(2).
        waiting = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (_first_free_fd(), hard))
            await asyncio.sleep(0.55)  # the loop retries every 0.1 s meanwhile
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        try:
            failed = value(
                metrics, "ravenproxy_server_accept_errors_total", front="http", error="emfile"
            )
            assert failed >= 3, failed
            lines = [r for r in caplog.records if "out of file descriptors" in r.getMessage()]
            assert len(lines) == 1, [r.getMessage() for r in caplog.records]
            # Descriptors back: the waiting connections are served.
            for _ in range(100):
                if len(served) == 3:
                    break
                await asyncio.sleep(0.02)
            assert len(served) == 3
        finally:
            for s in waiting:
                s.close()
