"""The server's resource-limit settings: defaults, validation naming the flag, and the
connection cap the server actually enforces."""

from __future__ import annotations

import resource

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.model.store import ModelStore
from ravenproxy.server.app import ProxyServer
from ravenproxy.server.limits import front_connection_cap
from ravenproxy.server.settings import ServerSettings


def test_defaults(base: dict[str, str]) -> None:
    s = ServerSettings.from_mapping(base)
    assert s.header_timeout == 10.0
    assert s.max_front_connections == 8192
    assert s.idle_timeout == 4 * 3600.0
    assert s.max_streams_per_client == 1000


def test_values(base: dict[str, str]) -> None:
    s = ServerSettings.from_mapping(
        {
            **base,
            "header_timeout": "2.5",
            "max_front_connections": "50",
            "idle_timeout": 1,
            "max_streams_per_client": "5",
        }
    )
    assert (s.header_timeout, s.max_front_connections) == (2.5, 50)
    assert (s.idle_timeout, s.max_streams_per_client) == (1.0, 5)


@pytest.mark.parametrize(
    ("key", "value", "flag"),
    [
        ("header_timeout", "0", "--header-timeout"),
        ("header_timeout", "nan", "--header-timeout"),
        ("max_front_connections", "-1", "--max-front-connections"),
        ("max_front_connections", "many", "--max-front-connections"),
        ("idle_timeout", "-5", "--idle-timeout"),
        ("max_streams_per_client", "0", "--max-streams-per-client"),
        ("max_streams_per_client", "1.5", "--max-streams-per-client"),
    ],
)
def test_bad_values_name_the_flag(base: dict[str, str], key: str, value: str, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        ServerSettings.from_mapping({**base, key: value})


def test_the_server_enforces_the_cap_under_the_descriptor_limit(base: dict[str, str]) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    s = ServerSettings.from_mapping({**base, "max_front_connections": "1000000"})
    server = ProxyServer(s, ModelStore())
    assert server.front_gate.limit == front_connection_cap(1_000_000, soft) < soft // 2
    assert server.client_streams.limit == 1000
