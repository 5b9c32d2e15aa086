"""The agent's node name comes from its certificate; a name given otherwise must equal it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ravenproxy.agent.settings import AgentSettings
from ravenproxy.errors import ConfigError
from ravenproxy.pki import init_pki


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    init_pki(tmp_path, ("127.0.0.1",), ("edge-1", "edge-2"))
    return tmp_path


def values(certs: Path, cert_node: str = "edge-1", **overrides: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "server_addr": "wss://cloud.example:10262",
        "ca_file": str(certs / "ca.crt"),
        "cert_file": str(certs / f"{cert_node}.crt"),
        "key_file": str(certs / f"{cert_node}.key"),
    }
    out.update(overrides)
    return out


@pytest.fixture(autouse=True)
def no_node_name_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)


def test_without_a_name_the_agent_is_its_certificates_node(certs: Path) -> None:
    assert AgentSettings.from_mapping(values(certs)).node_name == "edge-1"
    assert AgentSettings.from_mapping(values(certs, "edge-2")).node_name == "edge-2"


def test_a_matching_name_is_accepted(certs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert AgentSettings.from_mapping(values(certs, node_name="edge-1")).node_name == "edge-1"
    monkeypatch.setenv("NODE_NAME", "edge-1")
    assert AgentSettings.from_mapping(values(certs)).node_name == "edge-1"


def test_a_flag_that_differs_from_the_certificate_is_refused_naming_both(certs: Path) -> None:
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(values(certs, node_name="edge-2"))
    assert info.value.field == "--node-name"
    message = str(info.value)
    assert "edge-1" in message and "edge-2" in message
    assert str(certs / "edge-1.crt") in message
    assert "\n" not in message


def test_node_name_env_that_differs_is_refused(
    certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "edge-2")
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(values(certs))
    assert info.value.field == "NODE_NAME"
    assert "edge-1" in str(info.value) and "edge-2" in str(info.value)


def test_a_matching_flag_wins_over_a_differing_env(
    certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Flags win over NODE_NAME everywhere; the flag is what is checked against the certificate.
    monkeypatch.setenv("NODE_NAME", "edge-2")
    assert AgentSettings.from_mapping(values(certs, node_name="edge-1")).node_name == "edge-1"


def test_an_invalid_name_is_refused_before_the_comparison(certs: Path) -> None:
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(values(certs, node_name="Edge_1"))
    assert info.value.field == "--node-name"


@pytest.mark.parametrize(
    ("cert", "says"),
    [
        ("server.crt", "not a client certificate"),  # the server's: no clientAuth
        ("ca.key", "no certificate"),  # a key file: no CERTIFICATE block in it
    ],
)
def test_a_certificate_that_names_no_node_is_refused(certs: Path, cert: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        AgentSettings.from_mapping(values(certs, cert_file=str(certs / cert)))
    assert info.value.field == "--cert-file"
    assert says in str(info.value)
    assert str(certs / cert) in str(info.value)
