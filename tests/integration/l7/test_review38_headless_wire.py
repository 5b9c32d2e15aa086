"""review38: answerpath's head-less near answers (an answer of the last one's layout, whole in a
read, queued as ``(layout head, bytes, cut)``: its own head made only when unfolded) through the
real server front and agent. A target scripted by path answers a run of four answers of one
layout (from the third on, the near path's), then a ``way``: an answer whose own head differs
from the layout's in a field the exchange reads or should read (status, reason, version, a
field name's case, ``Connection: close`` or ``keep-alive`` in a field as long, a second
Content-Length, a Content-Length of another digit count, ``00``, a leading zero, obs-text, a
control, a 1xx first, 204 and 304 heads, chunked, a close, a stray answer), for clients of
every framing (HTTP/1.1 kept, HTTP/1.0 kept or not, a last request, HEAD); then the layout
again, the fifth answer's values again (the plan head's, or the last near answer's, after the
way) and the fourth's. The reference is a fresh connection each (llhttp's only): each request
alone gets what it gets in the run, byte for byte, and ends where it ends alone; the front's
request counter counts each final status the clients got once."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.l7.test_review34_near_wire import _read_all
from tests.integration.l7.test_review36_answer_event_wire import _counted, _dateless, _finals
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

_HEAD = (
    b"HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 12:%02d:%02d GMT\r\nContent-Type: text/plain\r\n"
    b"X-Trace-Number: n%04d\r\nContent-Length: 10\r\n\r\n"
)


def _head(n: int) -> bytes:
    return _HEAD % (n // 60 % 60, n % 60, n)


def _ok(n: int) -> bytes:
    return _head(n) + b"body-%05d" % n


def _swap(old: bytes, new: bytes) -> Callable[[int], bytes]:
    return lambda n: _ok(n).replace(old, new, 1)


def _headonly(old: bytes, new: bytes) -> Callable[[int], bytes]:
    return lambda n: _head(n).replace(old, new, 1)


_WAYS: dict[bytes, Callable[[int], bytes]] = {
    b"ok": _ok,
    b"status": _swap(b"200 OK", b"203 OK"),
    b"reason": _swap(b"200 OK", b"200 Ok"),
    b"ten": _swap(b"HTTP/1.1", b"HTTP/1.0"),
    b"lower": _swap(b"Content-Length", b"content-length"),
    b"conn-close": _swap(b"Content-Type: text/plain", b"Connection: close, x-abc"),
    b"conn-keep": _swap(b"Content-Type: text/plain", b"Connection: keep-alive,x"),
    b"dup": lambda n: _ok(n).replace(b"X-Trace-Number: n%04d" % n, b"Content-Length: 00010"),
    b"dup-differ": lambda n: _ok(n).replace(b"X-Trace-Number: n%04d" % n, b"Content-Length: 00011"),
    b"long": lambda n: _ok(n).replace(b"Length: 10", b"Length: 100") + b"x" * 90,
    b"short": lambda n: _ok(n).replace(b"Length: 10", b"Length: 9")[:-1],
    b"zero": lambda n: _head(n).replace(b"Length: 10", b"Length: 00"),
    b"lead0": lambda n: _ok(n).replace(b"Length: 10", b"Length: 09")[:-1],
    b"obs": lambda n: _ok(n).replace(b": n%04d" % n, b": n\xe9\xff%02d" % (n % 100)),
    b"ctl": lambda n: _ok(n).replace(b": n%04d" % n, b": n\x01%03d" % n),
    b"interim": lambda n: b"HTTP/1.1 100 Continue\r\n\r\n" + _ok(n),
    b"204": _headonly(b"200 OK", b"204 OK"),
    b"304": _headonly(b"200 OK", b"304 OK"),
    b"chunked": lambda n: (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\np%03d\r\n0\r\n\r\n" % n
    ),
    b"stray": lambda n: _ok(n) + _ok(n + 50),
    b"close": _ok,
}
"""What the target sends for ``/v/N/way`` (a HEAD: the head of it)."""


def _target() -> Handler:
    """Answers ``/v/N/way`` (``hK``: the layout with answer K's values and N's body)."""

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                _, n, way = head.split(b" ", 2)[1].split(b"/")[1:4]
                if way.startswith(b"h"):
                    answer = _head(int(way[1:])) + b"body-%05d" % int(n)
                else:
                    answer = _WAYS[way](int(n))
                if head.startswith(b"HEAD"):
                    answer = answer[: answer.index(b"\r\n\r\n") + 4]
                writer.write(answer)
                await writer.drain()
                if way == b"close":
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    return target


def _request(port: int, client: bytes, target: bytes, n: int) -> bytes:
    host = b"Host: edge-1:%d\r\n" % port
    path = b"/v/%d/%b" % (n, target)
    if client == b"ten":
        return b"GET %b HTTP/1.0\r\n%b\r\n" % (path, host)
    if client == b"ten-keep":
        return b"GET %b HTTP/1.0\r\n%bConnection: keep-alive\r\n\r\n" % (path, host)
    if client == b"last":
        return b"GET %b HTTP/1.1\r\n%bConnection: close\r\n\r\n" % (path, host)
    if client == b"head":
        return b"HEAD %b HTTP/1.1\r\n%b\r\n" % (path, host)
    return b"GET %b HTTP/1.1\r\n%b\r\n" % (path, host)


Asked = tuple[bytes, bytes, int]  # (client, target way, n)


async def _run(l7: L7, port: int, asked: list[Asked]) -> list[tuple[bytes, bool]]:
    """The requests one at a time on one client connection (a new one after the front closed
    it): what the client got for each, and whether the front closed after it."""
    got: list[tuple[bytes, bool]] = []
    at = 0
    while at < len(asked):
        async with front_client(l7.http, abort=True) as (reader, writer):
            while at < len(asked):
                writer.write(_request(port, *asked[at]))
                at += 1
                got.append(await _read_all(reader))
                if got[-1][1]:
                    break
    return got


_CASES: list[tuple[bytes, bytes]] = [
    (b"ok", b"runs"),
    *((b"ok", way) for way in _WAYS),
    *(
        (client, way)
        for client in (b"ten", b"ten-keep", b"last", b"head")
        for way in (b"ok", b"status", b"ten", b"conn-close", b"long", b"lead0", b"stray")
    ),
]


def _asked(client: bytes, way: bytes) -> list[Asked]:
    """Four answers of the layout (kept HTTP/1.1), the case's fifth, then the layout's answers:
    a new one, the fifth's values, the fourth's, the third's to a client of the case's kind.
    ``runs``: four of the layout, two of one as long with another status (203: another plan),
    then the fourth's head again (the first run's last near answer) and the third's."""
    if way == b"runs":
        return [
            *((b"ok", b"ok", n) for n in range(1, 5)),
            *((b"ok", b"status", n) for n in (5, 6)),
            (b"ok", b"h4", 7),
            (b"ok", b"h3", 8),
        ]
    return [
        *((b"ok", b"ok", n) for n in range(1, 5)),
        (client, way, 5),
        (b"ok", b"ok", 6),
        (b"ok", b"h5", 7),
        (b"ok", b"h4", 8),
        (client, b"h3", 9),
        (b"ok", b"h3", 10),
    ]


async def _gated(gate: asyncio.Semaphore, l7: L7, port: int, asked: list[Asked]) -> Any:
    async with gate:
        return await _run(l7, port, asked)


async def test_answers_after_a_run_of_the_layout_are_what_a_fresh_connection_gets(l7: L7) -> None:
    port = l7.spare_port
    before = _counted(await l7.cluster.metrics())
    gate = asyncio.Semaphore(24)
    runs = [_asked(*case) for case in _CASES]
    alone = sorted({one for asked in runs for one in asked})  # (each once: the reference)
    async with tcp_server(_target(), EDGE_IP, port):
        done = await asyncio.gather(
            *(_gated(gate, l7, port, asked) for asked in [*runs, *([one] for one in alone)])
        )
    fresh_of = {one: got[0] for one, got in zip(alone, done[len(runs) :], strict=True)}
    got = [
        (run, [fresh_of[one] for one in asked])
        for run, asked in zip(done[: len(runs)], runs, strict=True)
    ]
    differ = {}
    for case, (run, fresh) in zip(_CASES, got, strict=True):
        assert run[0] == (_ok(1), False), run
        if [_dateless(g) for g in run] != [_dateless(f) for f in fresh]:
            differ[case] = (run, fresh)
    assert not differ, differ
    seen = Counter(s for run in done for g in run for s in _finals(g[0]))
    await asyncio.sleep(0.2)  # (a count after the write: the relay's task ends)
    assert _counted(await l7.cluster.metrics()) - before == seen
    # Spelled out: a kept HTTP/1.1 client gets the target's bytes as they came, a near
    # answer's values its own (not the layout head's) on every path.
    by_case = dict(zip(_CASES, got, strict=True))
    run = by_case[(b"ok", b"ok")][0]
    assert run[4:] == [(_ok(5), False), (_ok(6), False)] + [
        (_head(k) + b"body-%05d" % n, False) for k, n in ((5, 7), (4, 8), (3, 9), (3, 10))
    ]
    ten = by_case[(b"ten", b"ok")][0]
    assert ten[4][1] and ten[4][0].startswith(b"HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 12:00:05")
    assert b"X-Trace-Number: n0005\r\n" in ten[4][0] and ten[4][0].endswith(b"body-00005")
    ten = by_case[(b"ten-keep", b"ok")][0]
    assert b"X-Trace-Number: n0003\r\n" in ten[8][0] and ten[8][0].endswith(b"body-00009")
