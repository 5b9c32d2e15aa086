"""benchmarks/latency.py's target: with ``--answer varied`` every answer's head differs from
the previous one on its connection (a Date per second, a Content-Length that changes) and
each is a well-formed HTTP/1.1 response; ``same`` answers today's identical bytes."""

from __future__ import annotations

import email.utils
import itertools
from collections.abc import Iterator
from types import ModuleType

import h11
import pytest

from tests.unit.benchscripts import load_script

GET = b"GET /metrics HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"


@pytest.fixture
def latency() -> Iterator[ModuleType]:
    yield from load_script("latency")


class _Transport:
    def __init__(self) -> None:
        self.out = b""

    def get_extra_info(self, name: str) -> None:
        return None

    def write(self, data: bytes) -> None:
        self.out += data


def _answers(latency: ModuleType, answer: str, batches: list[int]) -> bytes:
    """What one connection of the target writes for ``batches`` of pipelined GETs."""
    target = latency._Target(latency._Answers(answer == "varied"))
    transport = _Transport()
    target.connection_made(transport)
    for n in batches:
        target.data_received(GET * n)
    return transport.out


def _parse(data: bytes, count: int) -> list[tuple[h11.Response, bytes]]:
    client = h11.Connection(h11.CLIENT)
    out = []
    for _ in range(count):
        client.send(h11.Request(method="GET", target="/metrics", headers=[("Host", "edge-1")]))
        client.send(h11.EndOfMessage())
        if not out:
            client.receive_data(data)
        response = client.next_event()
        assert isinstance(response, h11.Response)
        body = b""
        while not isinstance(event := client.next_event(), h11.EndOfMessage):
            assert isinstance(event, h11.Data)
            body += event.data
        out.append((response, body))
        client.start_next_cycle()
    assert client.next_event() is h11.NEED_DATA  # nothing beyond the answers
    return out


def test_varied_answers_differ_from_the_last_and_parse(latency: ModuleType) -> None:
    data = _answers(latency, "varied", [1, 3, 1, 10])
    answers = _parse(data, 15)
    heads = [dict(response.headers) for response, _ in answers]
    for (response, body), head in zip(answers, heads, strict=True):
        assert response.status_code == 200
        assert int(head[b"content-length"]) == len(body) >= 2
        assert email.utils.parsedate_to_datetime(head[b"date"].decode()).tzname() == "UTC"
        assert head[b"date"].endswith(b" GMT")  # IMF-fixdate
    for last, this in itertools.pairwise(heads):
        assert last[b"content-length"] != this[b"content-length"]


def test_varied_answers_take_the_date_of_their_second(
    latency: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1_800_000_000.2]
    monkeypatch.setattr(latency.time, "time", lambda: clock[0])
    answers = latency._Answers(True)
    first = answers.now()
    assert answers.now() is first  # built once per second
    clock[0] += 1
    assert b"Date: Fri, 15 Jan 2027 08:00:01 GMT\r\n" in answers.now()[0]


def test_same_answers_are_the_fixed_response(latency: ModuleType) -> None:
    assert _answers(latency, "same", [1, 2]) == latency.RESPONSE * 3
    assert [r.status_code for r, _ in _parse(latency.RESPONSE * 3, 3)] == [200] * 3
