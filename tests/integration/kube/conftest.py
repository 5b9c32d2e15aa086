"""The Kubernetes API emulator, one per test, and a kubeconfig that points at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from tests.integration.kube.apiserver import APIServer


@pytest.fixture
async def apiserver() -> AsyncIterator[APIServer]:
    srv = APIServer()
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def kubeconfig(path: Path, apiserver: APIServer) -> Path:
    """A kubeconfig file for the emulator (no credentials: it needs none)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": apiserver.url}}],
                "users": [{"name": "emu", "user": {}}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    return path
