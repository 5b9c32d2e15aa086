"""review32: the key generator moved onto :mod:`ravenproxy.children` refuses, fails and times
out as it did at 1bb5933: its one-line failure against 1bb5933's ``_failure`` (kept verbatim
below) over generated exit statuses and stderr, and a child that hangs timed out or cancelled,
killed and reaped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.errors import PKIError
from ravenproxy.pki import csrprocess
from tests.helpers import examples


def old_failure(status: int, stderr: str) -> str:
    """1bb5933's ``csrprocess._failure``, verbatim but for its debug log line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if status == 2 and lines:
        return lines[-1]
    detail = f": {lines[-1]}" if lines else ""
    return f"key generator failed (exit status {status}){detail}"


LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
STDERR = st.lists(
    st.one_of(
        st.text(alphabet=st.sampled_from(" \tab:é" + LINE_BREAKS), max_size=12),
        st.sampled_from(["Traceback (most recent call last):", "ValueError: x", "  "]),
        st.binary(max_size=6).map(lambda b: b.decode("latin-1")),
    ),
    max_size=5,
).map("".join)


@settings(max_examples=examples(2000), deadline=None)
@given(
    status=st.sampled_from([0, 1, 2, 3, 120, -9, -15, -1]),
    stderr=STDERR,
    raw=st.binary(max_size=12),
    use_raw=st.booleans(),
)
def test_failure_is_1bb5933s(status: int, stderr: str, raw: bytes, use_raw: bool) -> None:
    data = raw if use_raw else stderr.encode()
    assert csrprocess._failure(status, data) == old_failure(status, data.decode(errors="replace"))


HANGING = "import os\nopen({pidfile!r}, 'w').write(str(os.getpid()))\nimport time\ntime.sleep(60)\n"


@contextlib.contextmanager
def hanging_cryptography(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A ``cryptography`` first on the children's path that writes its pid and sleeps; killed
    by its pid at the end whatever happened."""
    site = tmp_path / "site" / "cryptography"
    site.mkdir(parents=True)
    pidfile = tmp_path / "child.pid"
    (site / "__init__.py").write_text(HANGING.format(pidfile=str(pidfile)))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    try:
        yield pidfile
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def reaped(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


async def test_a_key_generator_past_its_time_is_refused_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hanging_cryptography(tmp_path, monkeypatch) as pidfile:
        began = time.monotonic()
        with pytest.raises(PKIError) as caught:
            await csrprocess.new_request("cloud-1", timeout=1.5)
        assert time.monotonic() - began < 10  # at its time, not the child's minute
        assert str(caught.value) == "key generator: no answer within 1.5s"
        assert reaped(int(pidfile.read_text()))


async def test_a_cancelled_key_generator_is_killed_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with hanging_cryptography(tmp_path, monkeypatch) as pidfile:
        task = asyncio.create_task(csrprocess.new_request("cloud-1"))
        async with asyncio.timeout(30):
            while not pidfile.exists() or not pidfile.read_text():
                await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert reaped(int(pidfile.read_text()))


async def test_a_key_generator_that_cannot_start_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.executable", "/nonexistent/python")
    with pytest.raises(PKIError) as caught:
        await csrprocess.new_request("cloud-1")
    assert str(caught.value) == "cannot start the key generator: No such file or directory"


async def test_an_answer_that_is_not_a_key_and_a_csr_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child that exits 0 with something else on stdout (a foreign ``ravenproxy.pki.csr``
    cannot run: ours is first; here the answer is emptied by a broken ``cryptography``)."""
    site = tmp_path / "site" / "cryptography"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("import sys\nprint('hello')\nsys.exit(0)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    with pytest.raises(PKIError, match=r"^key generator: answer is not a key and a CSR$"):
        await csrprocess.new_request("cloud-1")
