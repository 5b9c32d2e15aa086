"""benchmarks/callback_cycle.py (branch callpath): the cycle it counts is the callbacks'
keep-alive request — each request sent on whole to the target and each answer to the client,
the connection still in callback mode and waiting after each — on the route the router's memo
keeps; and the child refuses to count another checkout's code than the one named."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.benchscripts import BENCHMARKS, load_script


@pytest.fixture(scope="module")
def cycle() -> Iterator[ModuleType]:
    yield from load_script("callback_cycle")


@pytest.mark.parametrize("request_kind", ["same", "varied"])
def test_a_cycle_is_a_request_and_its_answer(cycle: ModuleType, request_kind: str) -> None:
    reads = cycle.exchange_cycle.requests(cycle.WARM + 20, request_kind)
    sent, answered = cycle.cycles(reads, 20, keep=True)
    assert len(sent) == len(answered) == cycle.WARM + 20
    for data, head in zip(reads, sent, strict=True):
        line = data.split(b"\r\n", 1)[0] + b"\r\n"
        assert head.startswith(line), (data, head)  # the target as the client sent it
        assert b"\r\nVia: 1.1 ravenproxy\r\n" in head and head.endswith(b"\r\n\r\n")
    assert len(set(sent)) == (1 if request_kind == "same" else len(sent))
    assert all(a.startswith(b"HTTP/1.1 200 OK\r\n") and a.endswith(b"\r\n\r\nok") for a in answered)


def test_the_requests_are_counted_by_the_proxy(cycle: ModuleType) -> None:
    from ravenproxy.server.http_proxy import HttpProxy

    calls: list[int] = []
    count = HttpProxy.count

    def counting(self: HttpProxy, status: int) -> None:
        calls.append(status)
        count(self, status)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HttpProxy, "count", counting)
        cycle.cycles(cycle.exchange_cycle.requests(cycle.WARM + 5, "same"), 5)
    assert calls == [200] * (cycle.WARM + 5)


def test_the_child_refuses_code_from_elsewhere(tmp_path: Path) -> None:
    script = BENCHMARKS / "callback_cycle.py"
    done = subprocess.run(
        [sys.executable, str(script), "--child", str(tmp_path), "same", "1", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "not " + str(tmp_path) in done.stderr, done.stderr
