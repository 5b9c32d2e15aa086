from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.integration.apiserver.env import Env, start_env, wait_ready


@pytest.fixture(scope="package")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One server, agent, ``ravenproxy dns`` and fake kubelet shared by these tests (they only
    read through them); stopped by PID at the end, also on failure."""
    bed = start_env(tmp_path_factory.mktemp("apiserver"))
    try:
        asyncio.run(wait_ready(bed))
        yield bed
    finally:
        bed.stop()
