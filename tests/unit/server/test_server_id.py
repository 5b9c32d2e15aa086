"""``--server-id``: given, else the node name, else the host name; checked once."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.pki import init_pki
from ravenproxy.server.settings import ServerSettings


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.delenv("NODE_NAME", raising=False)
    init_pki(tmp_path, ("127.0.0.1",), ())
    (tmp_path / "inventory.yaml").write_text("")
    return {
        "ca_file": str(tmp_path / "ca.crt"),
        "cert_file": str(tmp_path / "server.crt"),
        "key_file": str(tmp_path / "server.key"),
        "inventory": str(tmp_path / "inventory.yaml"),
    }


def test_identity_defaults(base: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServerSettings.from_mapping(base).identity == socket.gethostname()
    assert ServerSettings.from_mapping({**base, "node_name": "gw-1"}).identity == "gw-1"
    monkeypatch.setenv("NODE_NAME", "gw-env")
    assert ServerSettings.from_mapping(base).identity == "gw-env"
    given = ServerSettings.from_mapping({**base, "node_name": "gw-1", "server_id": "proxy-7"})
    assert given.identity == "proxy-7"


@pytest.mark.parametrize("bad", ["   ", "a\tb", "x" * 254])
def test_bad_server_id_names_the_flag(base: dict[str, Any], bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        ServerSettings.from_mapping({**base, "server_id": bad})
    assert info.value.field == "--server-id"
