"""Root-only fixtures: a private network namespace per test, always deleted afterwards."""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest

_counter = itertools.count()


def sh(*argv: str, netns: str | None = None, check: bool = True) -> str:
    full = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    done = subprocess.run(full, capture_output=True, text=True, check=False, timeout=30)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(full)} failed: {done.stderr.strip()}")
    return done.stdout


@pytest.fixture
def netns_factory() -> Iterator[Callable[[], str]]:
    """Make fresh namespaces ``rp-<pid>-<n>`` with lo up; all deleted when the test ends,
    also when it fails."""
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces", allow_module_level=False)
    made: list[str] = []

    def make() -> str:
        name = f"rp-{os.getpid()}-{next(_counter)}"
        sh("ip", "netns", "add", name)
        made.append(name)
        sh("ip", "link", "set", "lo", "up", netns=name)
        return name

    try:
        yield make
    finally:
        for name in made:
            sh("ip", "netns", "del", name, check=False)


@pytest.fixture
def netns(netns_factory: Callable[[], str]) -> str:
    return netns_factory()


def add_bridge(netns: str, name: str, cidr: str) -> None:
    """An empty bridge holding an address: stands in for the underlay NIC or the CNI device
    (dummy links are not available on the test bed)."""
    sh("ip", "link", "add", name, "type", "bridge", netns=netns)
    sh("ip", "addr", "add", cidr, "dev", name, netns=netns)
    sh("ip", "link", "set", name, "up", netns=netns)
