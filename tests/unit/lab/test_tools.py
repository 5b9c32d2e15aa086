"""A missing tool is named with the Debian package that brings it, before anything is made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ravenproxy.errors import LabError
from ravenproxy.lab import runtime
from ravenproxy.lab import state as st


def test_missing_tools_name_their_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    missing = runtime.missing_tools("wireguard")
    assert "curl (curl)" in missing and "ip (iproute2)" in missing
    assert "wireguard-go (wireguard-go)" in missing and "wg (wireguard-tools)" in missing
    assert not any("swanctl" in m for m in missing)


def test_up_refuses_before_making_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    if os.geteuid() != 0:
        with pytest.raises(LabError, match="needs root"):
            runtime.up(runtime.UpOptions(name="unitlab"), print)
        return
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LabError, match=r"missing tools: .*curl \(curl\)"):
        runtime.up(runtime.UpOptions(name="unitlab", directory=tmp_path / "d"), print)
    assert st.load("unitlab") is None and not (tmp_path / "d").exists()
