"""The suite-wide hang guard (tests/hang_guard.py): an async test still running at 85 % of its
pytest-timeout fails naming the await it hung at, and its cleanup runs; a test that raises its own
TimeoutError, or finishes, is left alone. Proved on a generated test file run by a real pytest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import GENERATED_INI, run_generated_tests

CONFTEST = """\
from tests.hang_guard import pytest_runtest_call, pytest_runtest_setup  # noqa
"""

TESTS = """\
import asyncio
from pathlib import Path

import pytest

CLEANED = Path(__file__).with_name("cleaned")


async def wait_for_a_reply_that_never_comes():
    await asyncio.Event().wait()


@pytest.mark.timeout(4)
async def test_hangs():
    try:
        await wait_for_a_reply_that_never_comes()
    finally:
        CLEANED.write_text("yes")


@pytest.mark.timeout(30)
async def test_own_timeout():
    await asyncio.wait_for(asyncio.Event().wait(), 0.1)


@pytest.mark.timeout(30)
async def test_quick(tmp_path):
    await asyncio.sleep(0.01)
    assert tmp_path.is_dir()


def test_sync():
    pass
"""

INI = GENERATED_INI + "timeout = 60\n"

Run = tuple[dict[str, set[str]], str, Path]
"""Each generated test's outcomes, the whole output, and the generated directory."""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    base = tmp_path_factory.mktemp("hang-guard")
    return (*run_generated_tests(base, CONFTEST, TESTS, INI), base)


def test_a_hung_test_fails_naming_the_await_and_cleans_up(
    run: Run,
) -> None:
    outcomes, out, base = run
    assert outcomes["test_hangs"] == {"FAILED"}, out
    assert re.search(r"hung: still running after 3\.\d s \(its pytest-timeout is 4 s", out), out
    # The traceback reaches the coroutine that was waiting, not the loop's select().
    assert "in wait_for_a_reply_that_never_comes" in out, out
    assert "await asyncio.Event().wait()" in out, out
    assert "from pytest-timeout" not in out, out
    assert (base / "cleaned").read_text() == "yes"


def test_other_tests_are_left_alone(run: Run) -> None:
    outcomes, out, _ = run
    assert outcomes["test_own_timeout"] == {"FAILED"}, out
    own = out[out.index("test_own_timeout") :]
    assert "TimeoutError" in own and "hung:" not in own.split("short test summary")[0], out
    assert outcomes["test_quick"] == {"PASSED"}, out
    assert outcomes["test_sync"] == {"PASSED"}, out
