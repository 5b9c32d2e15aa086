"""Which servers an agent dials: discovery from the model, slot addresses, settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ravenproxy.agent.servers import discovered_servers, slot_address
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.errors import ConfigError
from ravenproxy.model.objects import EXPOSE_LOAD_BALANCER, EXPOSE_NONE, Endpoint, Gateway
from ravenproxy.model.snapshot import Model
from ravenproxy.pki import init_pki


def proxy(ip: str, port: int, type_: str = "proxy") -> Endpoint:
    return Endpoint("cloud-1", type_, public_ip=ip, public_port=port)


def test_discovery_takes_active_proxy_endpoints_of_exposed_gateways() -> None:
    model = Model.build(
        gateways=[
            Gateway(
                "gw-a",
                expose_type=EXPOSE_LOAD_BALANCER,
                active_endpoints=(
                    proxy("203.0.113.1", 10262),
                    proxy("2001:db8::1", 10262),
                    proxy("203.0.113.9", 4500, type_="tunnel"),  # not a proxy
                    proxy("", 10262),  # not elected yet: no public address
                    proxy("203.0.113.1", 10262),  # twice: one server
                ),
                # Configured but not active: not dialled.
                endpoints=(proxy("198.51.100.7", 10262),),
            ),
            Gateway(
                "gw-edge",
                expose_type=EXPOSE_NONE,
                active_endpoints=(proxy("198.51.100.1", 10262),),
            ),
        ]
    )
    assert discovered_servers(model) == (
        "wss://203.0.113.1:10262",
        "wss://[2001:db8::1]:10262",
    )
    assert discovered_servers(Model.build()) == ()


def test_each_slot_starts_on_its_own_address_and_moves_on_in_turn() -> None:
    addrs = ("wss://a:1", "wss://b:1", "wss://c:1")
    assert [slot_address(addrs, slot, 0) for slot in range(3)] == list(addrs)
    assert [slot_address(addrs, 1, turn) for turn in range(4)] == [
        "wss://b:1",
        "wss://c:1",
        "wss://a:1",
        "wss://b:1",
    ]
    assert {slot_address(("wss://lb:1",), slot, 5) for slot in range(3)} == {"wss://lb:1"}


@pytest.fixture
def certs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("NODE_NAME", raising=False)
    init_pki(tmp_path, ("127.0.0.1",), ("edge-1",))
    (tmp_path / "inventory.yaml").write_text("")
    return tmp_path


def values(certs: Path, **overrides: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ca_file": str(certs / "ca.crt"),
        "cert_file": str(certs / "edge-1.crt"),
        "key_file": str(certs / "edge-1.key"),
    }
    out.update(overrides)
    return out


def test_server_count_defaults_to_the_distinct_addresses(certs: Path) -> None:
    s = AgentSettings.from_mapping(
        values(certs, server_addr=["wss://a:1", "wss://b:1", "wss://a:1"])
    )
    assert s.server_urls == ("wss://a:1", "wss://b:1")
    assert s.slots == 2
    assert s.server_url == "wss://a:1"
    one = AgentSettings.from_mapping(values(certs, server_addr="wss://lb:1", server_count=3))
    assert one.slots == 3


@pytest.mark.parametrize(
    ("overrides", "flag", "words"),
    [
        ({}, "--server-addr", "required (or --discover-servers)"),
        ({"server_addr": ["wss://a:1", "http://b:1"]}, "--server-addr", "wss://HOST:PORT"),
        ({"server_addr": "wss://a:1", "server_count": 0}, "--server-count", "> 0"),
        ({"discover_servers": True}, "--discover-servers", "needs --inventory"),
        (
            {"discover_servers": True, "server_addr": "wss://a:1", "inventory": "INV"},
            "--server-addr",
            "either",
        ),
    ],
)
def test_bad_server_settings_name_the_flag(
    certs: Path, overrides: dict[str, Any], flag: str, words: str
) -> None:
    if overrides.get("inventory") == "INV":
        overrides["inventory"] = str(certs / "inventory.yaml")
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(values(certs, **overrides))
    assert info.value.field == flag
    assert words in str(info.value)


def test_discover_servers_with_an_inventory(certs: Path) -> None:
    s = AgentSettings.from_mapping(
        values(certs, discover_servers=True, inventory=str(certs / "inventory.yaml"))
    )
    assert s.discover_servers and s.server_urls == () and s.server_count is None
