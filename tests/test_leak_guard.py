"""The suite-wide leak guard (tests/leak_guard.py) fails a test that leaves a task or a socket
behind, and passes clean ones: proved on a generated test file run by a real pytest process."""

from __future__ import annotations

import re

import pytest

from tests.helpers import run_generated_tests

CONFTEST = """\
import asyncio
import socket

import pytest

from tests.leak_guard import _async_leak_guard, leak_guard, pytest_runtest_makereport  # noqa


KEEP = []


def bound(keep=False):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    if keep:  # referenced for good: the collector cannot close it
        KEEP.append(s)
    return s


@pytest.fixture(scope="module")
def held():
    # Holds a socket on purpose for the whole module, like the L7 test bed.
    with bound() as s:
        yield s


@pytest.fixture
def leaky_fixture():
    yield bound(keep=True)


@pytest.fixture
def tidy_fixture():
    with bound() as s:
        yield s


@pytest.fixture
async def tidy_async_fixture():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    yield server
    server.close()
    await server.wait_closed()


@pytest.fixture
async def leaky_async_fixture():
    task = asyncio.create_task(asyncio.sleep(60), name="fixture-sleeper")
    yield task
"""

TESTS = """\
import asyncio
import socket

from conftest import KEEP, bound


async def test_leaks_a_task():
    asyncio.create_task(asyncio.sleep(60), name="forgotten-sleeper")


async def test_leaks_a_socket():
    bound(keep=True)


def test_sync_leaks_a_socket():
    bound(keep=True)


async def test_leaks_a_listening_server():
    KEEP.append(await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0))


async def test_fixture_leaks_a_socket(leaky_fixture):
    pass


async def test_async_fixture_leaks_a_task(leaky_async_fixture):
    pass


async def test_clean_async(tidy_fixture, tidy_async_fixture):
    # A cancelled task not awaited, a task ending within the grace, a connection closed
    # without wait_closed(): all finish on their own right after the test.
    asyncio.create_task(asyncio.sleep(60)).cancel()
    asyncio.create_task(asyncio.sleep(0.05))
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    writer.close()
    server.close()
    await server.wait_closed()


def test_clean_sync(tidy_fixture):
    bound().close()
    # A socket in an unreachable reference cycle: the collector closes it before the guard
    # counts (only a socket something still references is a leak).
    cycle = [socket.socket()]
    cycle.append(cycle)


async def test_wider_fixture_first_use(held):
    assert held.fileno() >= 0


def test_wider_fixture_again(held):
    assert held.fileno() >= 0


async def test_failing_test_is_not_also_blamed_for_leaks():
    asyncio.create_task(asyncio.sleep(60))
    KEEP.append(socket.socket())
    assert False, "the test's own failure"
"""

SOCKET_LEAKS = """test_leaks_a_socket test_sync_leaks_a_socket test_leaks_a_listening_server
    test_fixture_leaks_a_socket""".split()
CLEAN = "test_clean_async test_clean_sync test_wider_fixture_first_use test_wider_fixture_again"

Outcome = tuple[dict[str, set[str]], str]
"""Each generated test's outcomes (PASSED, FAILED, ERROR), and the run's whole output."""


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    """Each generated test's outcomes (PASSED, FAILED, ERROR) and the whole output."""
    return run_generated_tests(tmp_path_factory.mktemp("leak-guard"), CONFTEST, TESTS)


def teardown_error(out: str, test: str) -> str:
    """The text pytest printed for ``test``'s error at teardown."""
    found = re.search(rf"ERROR at teardown of {test} _+\n(.*?)\n[_=]{{3}}", out, re.S)
    assert found, out
    return found[1]


@pytest.mark.parametrize(
    ("test", "name"),
    [
        ("test_leaks_a_task", "forgotten-sleeper"),
        ("test_async_fixture_leaks_a_task", "fixture-sleeper"),
    ],
)
def test_a_leaked_task_fails_the_test_and_is_named(outcome: Outcome, test: str, name: str):
    outcomes, out = outcome
    assert "ERROR" in outcomes[test], out
    section = teardown_error(out, test)
    assert "1 asyncio task(s) still pending after the test" in section, section
    assert f"{name}: sleep at" in section, section


@pytest.mark.parametrize("test", SOCKET_LEAKS)
def test_a_leaked_socket_fails_the_test(outcome: Outcome, test: str):
    outcomes, out = outcome
    assert "ERROR" in outcomes[test], out
    section = teardown_error(out, test)
    assert "1 socket(s) left open by the test" in section, section
    # Named by its address: bound only (asked of the socket), or listening (from /proc/net).
    assert re.search(r"127\.0\.0\.1'?[:,] ?\d+", section), section


@pytest.mark.parametrize("test", CLEAN.split())
def test_clean_tests_pass(outcome: Outcome, test: str):
    outcomes, out = outcome
    assert outcomes[test] == {"PASSED"}, out


def test_a_failing_test_reports_only_its_failure(outcome: Outcome):
    outcomes, out = outcome
    assert outcomes["test_failing_test_is_not_also_blamed_for_leaks"] == {"FAILED"}, out
    assert "the test's own failure" in out
