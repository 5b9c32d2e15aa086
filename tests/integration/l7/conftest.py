from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.l7.env import L7, start_l7


@pytest.fixture(scope="package")
def l7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[L7]:
    """One server, one agent and one fake kubelet shared by the L7 tests (they start in ~2 s;
    the tests only read through them, so sharing keeps the suite fast)."""
    env = start_l7(tmp_path_factory.mktemp("l7"))
    try:
        yield env
    finally:
        env.stop()
