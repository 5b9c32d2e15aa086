"""Suite-wide rules: root-only tests are skipped loudly when not root, never silently; a test that
leaves asyncio tasks or sockets behind fails (the leak guard, tests/leak_guard.py); an async test
that hangs fails naming the await it hung at, and still cleans up (the hang guard,
tests/hang_guard.py). The Python processes the tests start load the project from bytecode they
cache for the run (see ``pytest_configure``), not from source at every start.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

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

# `make test` runs the suite in two tiers (README "Tests"): the tests not marked `serial` two at a
# time (pytest-xdist, `-n 2 -m "not serial"`), then the `serial` ones one at a time (`-m serial`).
# Serial are those that start real servers, agents, daemons or namespaces (tests/integration,
# tests/e2e: timing-sensitive, fixed names), need root, or are `slow`; a unit test that times itself
# against the wall clock with little slack is marked `serial` in its own file. A few files of
# tests/integration run in the parallel tier: free ports, their own tmp_path and API emulator,
# no contended leadership, no wall-clock bound with under 2 s of slack (first contact: processes
# that refuse a bad start; the controller's CSR path and the certificate requester: a rotation at
# 70-90 % of a 30 or 60 s lifetime; the functional L7 files, though `slow`: each worker starts its
# own server, agent and fake kubelet on free ports; the L7 files with timing bounds stay serial:
# the slow relay and client, limits, idle 408, keep-alive, streaming's p99 < 0.1 s).
_SERIAL_DIRS = ("integration", "e2e")
_PARALLEL_L7 = (
    "answeragain_same_answers", "answerparse_values", "curl", "direct_policy", "errors",
    "exec_ws", "framing", "front_identity", "loops", "pipelined", "prometheus",
    "review22_kept_answers", "review24_taken_answers", "review27_near_wire",
    "review30_reused_heads", "review31_near_wire", "review33_answer_edges", "stale_upstream",
    "stray_answer", "upgrade",
)  # fmt: skip
_PARALLEL_FILES = (
    "integration/test_first_contact.py",
    "integration/kube/test_cert_issuance.py",
    "integration/kube/test_cert_requester.py",
    "integration/kube/test_csr_api.py",
    "integration/kube/test_key_publish.py",
    "integration/kube/test_model_source.py",
    *(f"integration/l7/test_{name}.py" for name in _PARALLEL_L7),
)
_TESTS = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs root (network namespaces, iptables): run as root")
    for item in items:
        where = item.path.relative_to(_TESTS)
        if "root" in item.keywords or (
            where.as_posix() not in _PARALLEL_FILES
            and (where.parts[0] in _SERIAL_DIRS or "slow" in item.keywords)
        ):
            item.add_marker(pytest.mark.serial)
        if "root" in item.keywords and not IS_ROOT:
            item.add_marker(skip)
            _skipped_root.append(item.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _skipped_root:
        terminalreporter.section("ROOT-ONLY TESTS SKIPPED", sep="!", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(_skipped_root)} test(s) need root and were NOT run; CI runs them as root."
        )


# The Python processes the tests start (servers, agents, the CLI, the lab's daemons: hundreds per
# run) would compile every project module they import from source at each start where the
# environment forbids writing bytecode (PYTHONDONTWRITEBYTECODE=1 on the test bed, and a clone
# has no __pycache__): ~0.2 s of CPU each for a server or an agent. They get a bytecode cache of
# the run's own instead, in a temporary directory (the checkout stays free of __pycache__, as
# the setting wants), removed when the run ends. A cache the user asked for
# (PYTHONPYCACHEPREFIX) is left as it is.
_BYTECODE_ENV = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
_bytecode: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    _bytecode.update({k: os.environ.get(k) for k in _BYTECODE_ENV})
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="ravenproxy-test-bytecode-")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _bytecode:
        return
    shutil.rmtree(os.environ["PYTHONPYCACHEPREFIX"], ignore_errors=True)
    for key, value in _bytecode.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _bytecode.clear()
