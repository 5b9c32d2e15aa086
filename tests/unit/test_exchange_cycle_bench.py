"""benchmarks/exchange_cycle.py (branch reqpath): the cycle it counts is the callbacks' keep-alive
request on the path it names — the same bytes again (the kept head, no parse) or each with a
target of its own (a near head) — sent on whole to the target, the exchange back at ``head``
after each answer; and the child refuses to count another checkout's code than the one named."""

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
    yield from load_script("exchange_cycle")


@pytest.mark.parametrize("request_kind", ["same", "varied"])
def test_a_cycle_sends_each_request_on_whole(cycle: ModuleType, request_kind: str) -> None:
    reads = cycle.requests(cycle.WARM + 20, request_kind)
    sent = cycle.cycles(reads, 20)
    assert len(sent) == cycle.WARM + 20
    for data, head in zip(reads, sent, strict=True):
        line = data.split(b"\r\n", 1)[0] + b"\r\n"
        assert head.startswith(line), (data, head)  # the target as the client sent it
        assert b"\r\nVia: 1.1 ravenproxy\r\n" in head and head.endswith(b"\r\n\r\n")
    assert len(set(sent)) == (1 if request_kind == "same" else len(sent))


def test_the_near_and_the_kept_path_are_the_ones_taken(cycle: ModuleType) -> None:
    """Varied reads make a head without llhttp (Parsed.again's near path); the same reads reuse
    the kept head: llhttp is fed the first read only."""
    from ravenproxy.server import http_messages

    fed: list[bytes] = []
    feed = http_messages.Parsed.feed

    def counting(self: http_messages.Parsed, data: bytes) -> bytes | None:
        fed.append(data)
        return feed(self, data)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(http_messages.Parsed, "feed", counting)
        for kind in ("same", "varied"):
            fed.clear()
            cycle.cycles(cycle.requests(cycle.WARM + 5, kind), 5)
            requests = [d for d in fed if d.startswith(b"GET")]
            assert len(requests) == 1, (kind, len(requests))  # the first read only


def test_the_child_refuses_code_from_elsewhere(tmp_path: Path) -> None:
    script = BENCHMARKS / "exchange_cycle.py"
    done = subprocess.run(
        [sys.executable, str(script), "--child", str(tmp_path), "same", "1", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "not " + str(tmp_path) in done.stderr, done.stderr
