"""Root-only fixtures: a private network namespace per test, always deleted afterwards."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@contextlib.contextmanager
def _topology(netns_factory: Callable[[], str], vpn_driver: str) -> Iterator[Any]:
    from .cloud_edge import cloud_edge

    # Short paths: a unix socket path (charon's VICI socket) must fit in 108 bytes.
    workdir = Path(tempfile.mkdtemp(prefix="rp-e2e-"))
    try:
        with cloud_edge(netns_factory, workdir, vpn_driver) as topo:
            yield topo
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def ipsec_topo(netns_factory: Callable[[], str]) -> Iterator[Any]:
    """cloud-node — cloud-gw — nat-router — edge-gw — edge-node, charon on both gateways."""
    with _topology(netns_factory, "strongswan") as topo:
        yield topo


@pytest.fixture
def wg_topo(netns_factory: Callable[[], str]) -> Iterator[Any]:
    """The same topology for WireGuard (the driver starts wireguard-go on each gateway)."""
    with _topology(netns_factory, "wireguard") as topo:
        yield topo
