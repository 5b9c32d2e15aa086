"""review33: answeragain's answers queued without llhttp (an answer whose head is the last one's
byte for byte, once llhttp parsed it twice) through the real server front and agent, at the
edges: ``Expect: 100-continue`` uploads (an interim answer before each repeated final one), a
target that sends a repeated answer nobody asked for (in the answer's write or a moment later:
a response desync if it became the next request's answer), a ``Connection: close`` answer after
a run of repeated ones, and HEAD requests pipelined among GETs. Each answer's body carries the
number of the request it answers, so an answer framed wrongly (or a stray one handed on) shows
as a wrong body; where a fresh connection is the reference, each exchange alone must get what it
gets in the run."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import EDGE_IP, L7, content_length, front_client
from tests.integration.l7.test_answeragain_same_answers import _exchange
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n"
"""Every answer's head (the same bytes: the path without llhttp from the third on)."""
CLOSE = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\n"


def _numbered(*, stray: dict[int, str], close: int = 0, interim: bool = False) -> Handler:
    """A target answering request ``/n/N`` with :data:`HEAD` and body ``N`` (5 digits); after
    the answers in ``stray`` (by N) an answer nobody asked for, body ``stray``, in the same
    write (``"same"``) or 0.2 s later (``"later"``); answer ``close`` with ``Connection:
    close`` and then closing; ``interim``: ``100 Continue`` first, then reading the body."""

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                number = int(head.split(b" ", 2)[1].rsplit(b"/", 1)[1])
                if interim:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                    await reader.readexactly(5)
                body = b"%05d" % number
                if number == close:
                    writer.write(CLOSE + body)
                    await writer.drain()
                    return
                way = stray.get(number)
                writer.write(HEAD + body + (HEAD + b"stray" if way == "same" else b""))
                await writer.drain()
                if way == "later":
                    await asyncio.sleep(0.2)
                    writer.write(HEAD + b"stray")
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    return target


async def _final(reader: asyncio.StreamReader) -> tuple[list[bytes], bytes]:
    """The interim heads before the next final answer, and that answer (head and body)."""
    interims: list[bytes] = []
    async with asyncio.timeout(20):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"HTTP/1.1 1"):
                interims.append(head)
                continue
            return interims, head + await reader.readexactly(content_length(head))


async def _numbers(
    l7: L7, target: Handler, numbers: range, *, upload: bool = False, pause: float = 0
) -> list[tuple[list[bytes], bytes]]:
    """Requests ``/n/N`` one at a time on one client connection (``upload``: a POST of 5 bytes
    with ``Expect: 100-continue``, the body sent after the interim answer), ``pause`` seconds
    after each answer: the answers the client got."""
    port = l7.spare_port
    got: list[tuple[list[bytes], bytes]] = []
    async with (
        tcp_server(target, EDGE_IP, port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        for number in numbers:
            if upload:
                writer.write(
                    b"POST /n/%d HTTP/1.1\r\nHost: edge-1:%d\r\nContent-Length: 5\r\n"
                    b"Expect: 100-continue\r\n\r\n" % (number, port)
                )
                async with asyncio.timeout(20):
                    interim = await reader.readuntil(b"\r\n\r\n")
                writer.write(b"12345")
                interims, answer = await _final(reader)
                got.append(([interim, *interims], answer))
            else:
                writer.write(b"GET /n/%d HTTP/1.1\r\nHost: edge-1:%d\r\n\r\n" % (number, port))
                got.append(await _final(reader))
            await asyncio.sleep(pause)
    return got


async def test_uploads_answered_after_100_continue_again_and_again(l7: L7) -> None:
    got = await _numbers(l7, _numbered(stray={}, interim=True), range(1, 7), upload=True)
    continued = [b"HTTP/1.1 100 Continue\r\n\r\n"]
    assert got == [(continued, HEAD + b"%05d" % n) for n in range(1, 7)], got


@pytest.mark.parametrize("way", ["same", "later"])
@pytest.mark.parametrize("after", [3, 5])
async def test_a_repeated_answer_nobody_asked_for_is_no_ones_answer(
    l7: L7, way: str, after: int
) -> None:
    """The stray copy (the same head: the third and later are taken without llhttp) must not
    become the next request's answer: each request gets its own number."""
    got = await _numbers(l7, _numbered(stray={after: way}), range(1, 9), pause=0.3)
    assert [answer for _, answer in got] == [HEAD + b"%05d" % n for n in range(1, 9)], got


async def test_a_closing_answer_after_a_run_of_repeated_ones(l7: L7) -> None:
    """Answer 4 closes the target connection (``Connection: close``, then its end): it reaches
    the client as a final answer, and the requests after it get their own on a fresh one."""
    got = await _numbers(l7, _numbered(stray={}, close=4), range(1, 9), pause=0.1)
    answers = [answer for _, answer in got]
    assert answers[3].endswith(b"\r\n\r\n00004") and answers[3].startswith(b"HTTP/1.1 200 OK")
    del answers[3]
    assert answers == [HEAD + b"%05d" % n for n in (1, 2, 3, 5, 6, 7, 8)], got


@pytest.mark.parametrize("batch", [2, 4])
async def test_head_requests_pipelined_among_gets(l7: L7, batch: int) -> None:
    """GETs and HEADs of one answer (test_answeragain_same_answers' target), pipelined
    ``batch`` at a time: each as on a fresh connection."""
    get, head = (b"GET", b"/a/0"), (b"HEAD", b"/a/0")
    asked = [get, get, get, head, get, get, head, head, get, get, get, head]
    got = await _exchange(l7, asked, batch)
    fresh = {request: (await _exchange(l7, [request]))[0] for request in (get, head)}
    assert got == [fresh[request] for request in asked], (got, fresh)
