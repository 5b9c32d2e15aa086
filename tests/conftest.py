"""Suite-wide rules: root-only tests are skipped loudly when not root, never silently; a test that
leaves asyncio tasks or sockets behind fails (the leak guard, tests/leak_guard.py); an async test
that hangs fails naming the await it hung at, and still cleans up (the hang guard,
tests/hang_guard.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from tests.hang_guard import pytest_runtest_call, pytest_runtest_setup
from tests.helpers import THOROUGH
from tests.leak_guard import _async_leak_guard, leak_guard, pytest_runtest_makereport

__all__ = [
    "_async_leak_guard",
    "leak_guard",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "pytest_runtest_setup",
]

# ``pytest --hypothesis-profile=thorough``: the tests that ask for many examples run all of them
# (tests/helpers.py ``examples``); the default profile is the ordinary run's (make test, CI).
settings.register_profile(THOROUGH)

IS_ROOT = os.geteuid() == 0
_skipped_root: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (network namespaces, iptables): run as root")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)
            _skipped_root.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _skipped_root:
        terminalreporter.section("ROOT-ONLY TESTS SKIPPED", sep="!", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(_skipped_root)} test(s) need root and were NOT run; CI runs them as root."
        )
