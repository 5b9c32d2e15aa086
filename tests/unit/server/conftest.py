"""Shared fixtures of the server's unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from ravenproxy.pki import init_pki


@pytest.fixture
def base(tmp_path: Path) -> dict[str, str]:
    init_pki(tmp_path, ("localhost",), ("edge-1",))
    (tmp_path / "inv.yaml").write_text("")
    return {
        "inventory": str(tmp_path / "inv.yaml"),
        "ca_file": str(tmp_path / "ca.crt"),
        "cert_file": str(tmp_path / "server.crt"),
        "key_file": str(tmp_path / "server.key"),
    }
