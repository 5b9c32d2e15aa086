"""review36: answerside's one-event answer (an answer of the last one's layout, whole in a read,
queued as one ``ANSWER``: sent on as its bytes to a kept HTTP/1.1 client, else unfolded into
HEAD, DATA, END) through the real server front and agent, a target scripted by path, after a run
of four answers of the layout on one client connection (from the third on, the path's): an
HTTP/1.0 client (kept alive or not), a client's last request, a POST answered before its body
came, an upgrade answered by an answer of the layout and one switched by a 101 (its raw bytes
both ways), an answer with a stray one in the same write, a target closing right after its
answer, an answer with its next one's partial head, and requests pipelined three a write.
The reference is a fresh connection (review34's): each request alone on a new client
connection (a new target connection: llhttp's) gets what it gets in the run, byte for byte,
and ends where it ends alone; the front's request counter counts each final status the
clients got once (``ravenproxy_server_front_requests_total{front="http"}``)."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.l7.test_review34_near_wire import _read_all
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

_HEAD = (
    b"HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 09:%02d:%02d GMT\r\nX-Tag: t%02dab\r\n"
    b"Content-Length: 10\r\n\r\n"
)
SWITCHED = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n"


def _ok(n: int) -> bytes:
    return _HEAD % (n // 60 % 60, n % 60, n % 100) + b"body-%05d" % n


def _target() -> Handler:
    """Answers ``/w/N/way`` (the request's body, if any, not waited for): ``ok`` an answer of
    the layout, ``stray`` one more after it in the write, ``partial`` the next one's first 30
    bytes after it, ``close`` closing after it, ``switch`` a 101 and ``hi`` and then an echo."""

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                _, n, way = head.split(b" ", 2)[1].split(b"/")[1:4]
                answer = _ok(int(n))
                if head.startswith(b"HEAD"):  # its head (then any stray answer)
                    answer = answer[: answer.index(b"\r\n\r\n") + 4]
                if way == b"switch":
                    writer.write(SWITCHED + b"hi")
                    while data := await reader.read(1024):
                        writer.write(b"echo:" + data)
                    return
                if way == b"stray":
                    answer += _ok(int(n) + 50)
                elif way == b"partial":
                    answer += _ok(int(n) + 50)[:30]
                writer.write(answer)
                await writer.drain()
                if way == b"close":
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    return target


def _request(port: int, way: bytes, n: int) -> tuple[bytes, bytes]:
    """The bytes a client sends for ``way`` (``client:target``, or one word for both; request
    ``n``), and what it sends once the front went quiet (a POST's body, bytes past a 101)."""
    client, _, target = way.partition(b":")
    host = b"Host: edge-1:%d\r\n" % port
    path = b"/w/%d/%b" % (n, target or (client if client in _ANSWERS else b"ok"))
    if client == b"ten":
        return b"GET %b HTTP/1.0\r\n%b\r\n" % (path, host), b""
    if client == b"ten-keep":
        return b"GET %b HTTP/1.0\r\n%bConnection: keep-alive\r\n\r\n" % (path, host), b""
    if client == b"last":
        return b"GET %b HTTP/1.1\r\n%bConnection: close\r\n\r\n" % (path, host), b""
    if client == b"post":
        return b"POST %b HTTP/1.1\r\n%bContent-Length: 4\r\n\r\n" % (path, host), b"body"
    if client == b"head":
        return b"HEAD %b HTTP/1.1\r\n%b\r\n" % (path, host), b""
    if client in (b"ws", b"switch"):
        upgrade = b"Connection: Upgrade\r\nUpgrade: x\r\n"
        return b"GET %b HTTP/1.1\r\n%b%b\r\n" % (path, host, upgrade), b"ping"
    return b"GET %b HTTP/1.1\r\n%b\r\n" % (path, host), b""


_ANSWERS = {b"ok", b"stray", b"partial", b"close", b"switch"}


async def _run(l7: L7, port: int, asked: list[tuple[bytes, int]]) -> list[tuple[bytes, bool]]:
    """The requests one at a time on one client connection (a new one after the front closed
    it), what follows each sent once the front went quiet: what the client got for each."""
    got: list[tuple[bytes, bool]] = []
    at = 0
    while at < len(asked):
        async with front_client(l7.http, abort=True) as (reader, writer):
            while at < len(asked):
                request, then = _request(port, *asked[at])
                at += 1
                writer.write(request)
                first = await _read_all(reader)
                if then and not first[1]:
                    writer.write(then)
                    later = await _read_all(reader)
                    first = (first[0] + b"|" + later[0], later[1])
                got.append(first)
                if first[1]:
                    break
    return got


def _dateless(got: tuple[bytes, bool]) -> tuple[bytes, bool]:
    """The front's own answers (an error's) carry its Date: taken out."""
    return re.sub(
        rb"(HTTP/1.1 5\d\d [^\r]*\r\n(?:[^\r]*\r\n)*?)Date: [^\r]*\r\n", rb"\1", got[0]
    ), got[1]


WAYS = [
    *(b"ten", b"ten-keep", b"last", b"post", b"ws", b"switch", b"stray", b"close", b"partial"),
    # unfolded with a stray answer behind it in the read
    *(b"ten:stray", b"ten-keep:stray", b"last:stray", b"post:stray", b"ws:stray", b"head:stray"),
]


async def _way(l7: L7, port: int, way: bytes) -> tuple[list[tuple[bytes, bool]], ...]:
    """Four answers of the layout, ``way`` fifth, two more (none after a switch: the
    connection's bytes are raw then): the run and the fresh reference."""
    asked = [(b"ok", n) for n in range(1, 5)] + [(way, 5)]
    asked += [(b"ok", n) for n in (6, 7)] if way != b"switch" else []
    run = await _run(l7, port, asked)
    fresh = [(await _run(l7, port, [one]))[0] for one in asked]
    return run, fresh


def _finals(got: bytes) -> list[int]:
    """The final statuses of the answers in what a client got (a 101 too)."""
    return [int(s) for s in re.findall(rb"HTTP/1\.[01] ([1-5]\d\d) ", got) if s != b"100"]


def _counted(metrics: dict[str, float]) -> Counter[int]:
    prefix = 'ravenproxy_server_front_requests_total{front="http",status="'
    return Counter(
        {int(k[len(prefix) : -2]): int(v) for k, v in metrics.items() if k.startswith(prefix)}
    )


async def test_a_way_after_a_run_of_the_layout_is_what_a_fresh_connection_gets(l7: L7) -> None:
    port = l7.spare_port
    before = _counted(await l7.cluster.metrics())
    async with tcp_server(_target(), EDGE_IP, port):
        got = await asyncio.gather(*(_way(l7, port, way) for way in WAYS))
    differ = {}
    for way, (run, fresh) in zip(WAYS, got, strict=True):
        assert run[0][0].endswith(b"body-00001"), run
        if [_dateless(g) for g in run] != [_dateless(f) for f in fresh]:
            differ[way] = (run, fresh)
    assert not differ, differ
    # Each final answer the clients got counted once, by its status (the front's refusals
    # too: they are answers the client got).
    seen = Counter(s for run, fresh in got for g in [*run, *fresh] for s in _finals(g[0]))
    await asyncio.sleep(0.2)  # (a count after the write: the relay's task ends)
    assert _counted(await l7.cluster.metrics()) - before == seen
    # What the reference says, spelled out for the path's cases: a kept HTTP/1.1 client gets
    # the target's bytes as they came; the stray answer goes to no one.
    by_way = dict(zip(WAYS, got, strict=True))
    assert by_way[b"stray"][0][4] == (_ok(5), False)
    assert by_way[b"stray"][0][5] == (_ok(6), False)
    assert by_way[b"switch"][0][4] == (SWITCHED + b"hi|echo:ping", False)
    # (An upgrade refused: the connection is not kept, as alone.)
    assert by_way[b"ws"][0][4] == (_ok(5), True)


@pytest.mark.parametrize(
    "ways", [[b"ok"] * 3, [b"ok", b"stray", b"ok"], [b"ok", b"ten-keep", b"ok"]]
)
async def test_pipelined_three_a_write_after_a_run(l7: L7, ways: list[bytes]) -> None:
    """Four answers of the layout, then three requests in one write: each its own answer, in
    order (the stray one nobody's), as each gets alone on a fresh connection."""
    port = l7.spare_port
    async with tcp_server(_target(), EDGE_IP, port):
        async with front_client(l7.http, abort=True) as (reader, writer):
            for n in range(1, 5):
                writer.write(_request(port, b"ok", n)[0])
                assert await _read_all(reader) == (_ok(n), False)
            writer.write(b"".join(_request(port, way, 5 + i)[0] for i, way in enumerate(ways)))
            got = await _read_all(reader)
        fresh = [(await _run(l7, port, [(way, 5 + i)]))[0] for i, way in enumerate(ways)]
    assert got == (b"".join(f[0] for f in fresh), False), (got, fresh)
