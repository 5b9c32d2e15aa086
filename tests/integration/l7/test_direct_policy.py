"""The server's own dials follow the agent's policy (issue 8, item 2).

A target in the server's own gateway is dialled by the server itself. It may reach exactly what an
agent of that gateway may: the gateway's nodes on their kubelet port and on ``--metrics-port``s,
plus ``--allow``; link-local and metadata addresses never. Everything else is a 403 naming the
address — a service bound to loopback only, the server's own metrics, health and tunnel ports.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.helpers import run
from tests.integration.cluster import Cluster
from tests.integration.l7.env import curl
from tests.integration.targets import tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class _Target:
    """A tiny HTTP service on 127.0.0.1 (a stand-in for a loopback-only daemon)."""

    def __init__(self) -> None:
        self.port = 0
        self.hits = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.hits += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nsecret")
        await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def loopback_service() -> AsyncIterator[_Target]:
    """A :class:`_Target` listening while the block runs."""
    target = _Target()
    async with tcp_server(target.handle) as target.port:
        yield target


@pytest.fixture
async def loopback_only() -> AsyncIterator[_Target]:
    async with loopback_service() as target:
        yield target


async def test_direct_dial_refuses_what_the_policy_does_not_admit(
    cluster: Cluster, loopback_only: _Target
) -> None:
    async with loopback_service() as allowed:
        server = cluster.start_server("--allow", f"127.0.0.1:{allowed.port}")
        await cluster.wait_up()
        http = server.ports["http"]
        # A service bound to loopback only, and the server's own non-front listeners.
        for port in (
            loopback_only.port,
            server.ports["metrics"],
            server.ports["health"],
            server.ports["tunnel"],
        ):
            status, body = await curl("-H", f"Host: cloud-1:{port}", f"http://127.0.0.1:{http}/")
            assert status == 403, (port, body)
            assert body == f"cloud-1: 127.0.0.1:{port} is not in the server's allowlist\n", body
            # The same through CONNECT.
            code, out, err = await run(
                "curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}",
                "-p", "-x", f"http://127.0.0.1:{http}", f"http://cloud-1:{port}/",
            )  # fmt: skip
            assert out.strip() == "403", (port, code, out, err)
        # Through the terminated HTTPS front (TLS would be re-originated; refused first).
        status, body = await curl(
            "--cacert", str(cluster.certs / "ca.crt"),
            "-H", f"Host: cloud-1:{loopback_only.port}",
            f"https://127.0.0.1:{server.ports['https']}/",
        )  # fmt: skip
        assert status == 403, body
        assert loopback_only.hits == 0
        # What --allow names is dialled.
        status, body = await curl(
            "-H", f"Host: cloud-1:{allowed.port}", f"http://127.0.0.1:{http}/"
        )
        assert (status, body) == (200, "secret")
        m = await cluster.metrics()
        assert m['ravenproxy_server_direct_dials_total{result="refused"}'] >= 9
        assert m['ravenproxy_server_direct_dials_total{result="ok"}'] == 1
        assert "not in the server's allowlist" in server.output()


async def test_the_kubelet_and_metrics_ports_of_the_gateway_are_dialled(cluster: Cluster) -> None:
    # cloud-1's kubelet port (10250 by default in this inventory) and --metrics-port are the
    # policy: an HTTP listener on a metrics port of 127.0.0.1 is reached through the server.
    async with loopback_service() as exporter:
        server = cluster.start_server("--metrics-port", str(exporter.port))
        await cluster.wait_up()
        status, body = await curl(
            "-H", f"Host: cloud-1:{exporter.port}", f"http://127.0.0.1:{server.ports['http']}/"
        )
        assert (status, body) == (200, "secret")


async def test_own_listeners_are_refused_even_where_the_policy_admits_them(
    cluster: Cluster, loopback_only: _Target
) -> None:
    # --allow admits every port of 127.0.0.1 (cloud-1's InternalIP): a loopback service is
    # reached, yet the server's own metrics, health and tunnel listeners are not (403), and its
    # fronts are loops (508).
    server = cluster.start_server("--allow", "127.0.0.1:*")
    await cluster.wait_up()
    http = server.ports["http"]
    status, body = await curl(
        "-H", f"Host: cloud-1:{loopback_only.port}", f"http://127.0.0.1:{http}/"
    )
    assert (status, body) == (200, "secret")
    for name in ("metrics", "health", "tunnel"):
        port = server.ports[name]
        status, body = await curl("-H", f"Host: cloud-1:{port}", f"http://127.0.0.1:{http}/")
        assert status == 403, (name, body)
        assert body == f"cloud-1: 127.0.0.1:{port} is not in the server's allowlist\n", body
    for name in ("http", "https"):
        port = server.ports[name]
        status, body = await curl("-H", f"Host: cloud-1:{port}", f"http://127.0.0.1:{http}/")
        assert status == 508, (name, body)
    m = await cluster.metrics()
    assert m['ravenproxy_server_direct_dials_total{result="refused"}'] == 5
    assert m['ravenproxy_server_direct_dials_total{result="ok"}'] == 1
