"""A start that fails half-way undoes itself: every listener bound before the failure is closed
again, and the failure is one ConfigError naming the flag and the address."""

from __future__ import annotations

import asyncio

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.model.store import ModelStore
from ravenproxy.server.app import ProxyServer
from ravenproxy.server.settings import ServerSettings
from tests.helpers import free_port, is_free, taken_port


async def test_a_taken_http_port_undoes_the_start(base: dict[str, str]) -> None:
    tunnel = free_port()
    with taken_port() as http:
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
    assert is_free(tunnel), "the tunnel listener bound before the failure is still open"
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before, "a task of the failed start is left running"
