"""Suite-wide rules: root-only tests are skipped loudly when not root, never silently."""

from __future__ import annotations

import os

import pytest

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
