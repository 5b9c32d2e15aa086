"""A start that fails half-way undoes itself: every listener bound before the failure is closed
again, and the failure is one ConfigError naming the flag and the address."""

from __future__ import annotations

import asyncio
import socket

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.model.store import ModelStore
from ravenproxy.server.app import ProxyServer
from ravenproxy.server.settings import ServerSettings


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def bindable(port: int) -> bool:
    """Nothing listens on 127.0.0.1:``port`` (a socket may bind it)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_a_taken_http_port_undoes_the_start(base: dict[str, str]) -> None:
    tunnel = _free_port()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        http = taken.getsockname()[1]
        settings = ServerSettings.from_mapping(
            {
                **base,
                "tunnel_addr": f"127.0.0.1:{tunnel}",
                "http_addr": f"127.0.0.1:{http}",
                **{k: "127.0.0.1:0" for k in ("https_addr", "metrics_addr", "health_addr")},
            }
        )
        server = ProxyServer(settings, ModelStore())
        before = asyncio.all_tasks()
        with pytest.raises(ConfigError) as info:
            await server.start()
    assert info.value.field == "--http-addr"
    assert f"127.0.0.1:{http}" in str(info.value) and "\n" not in str(info.value)
    assert bindable(tunnel), "the tunnel listener bound before the failure is still open"
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before, "a task of the failed start is left running"
