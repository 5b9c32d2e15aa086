from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.egress.env import Egress, start_egress


@pytest.fixture(scope="package")
def egress(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Egress]:
    """One server (both egress listeners), two agents and a fake kubelet, shared by the egress
    tests (they only read through them)."""
    env = start_egress(tmp_path_factory.mktemp("egress"))
    try:
        yield env
    finally:
        env.stop()
