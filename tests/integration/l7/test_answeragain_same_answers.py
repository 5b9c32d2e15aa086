"""answeragain (issue 15) on real connections (the real server and agent, a scripted target): an
answer whose head is the last one's byte for byte is queued without llhttp. A target answering
the same bytes again and again — to requests one at a time or pipelined, with a body or
Content-Length 0, a body that looks like a head, after a HEAD request, a 204 — must reach
the client byte for byte as it sent them (plain answers go on as their wire), as each reaches it
alone on a fresh connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.integration.l7.env import EDGE_IP, L7, content_length, front_client
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Answers by the path asked (/a/N); HEAD /a/N is answered by N's head alone.
ANSWERS = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/",  # a body that looks like a head
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno",
]


def _target(answer_of: Callable[[int], bytes]) -> Handler:
    """The scripted target: answers /…/N by ``answer_of(N)``, each in a write of its own."""

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ", 2)[:2]
                answer = answer_of(int(path.rsplit(b"/", 1)[1]))
                if method == b"HEAD":
                    answer = answer.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    return target


async def _exchange(
    l7: L7,
    requests: list[tuple[bytes, bytes]],
    batch: int = 1,
    answer_of: Callable[[int], bytes] = ANSWERS.__getitem__,
) -> list[bytes]:
    """``(method, path)`` requests on one client connection, ``batch`` of them in a write
    (pipelined), to a target answering /…/N by ``answer_of(N)``: the answers the client got
    (each read by what it asked)."""
    port = l7.spare_port
    got: list[bytes] = []
    async with (
        tcp_server(_target(answer_of), EDGE_IP, port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        for at in range(0, len(requests), batch):
            part = requests[at : at + batch]
            line = b"%b %b HTTP/1.1\r\nHost: edge-1:%d\r\n\r\n"
            writer.write(b"".join(line % (method, path, port) for method, path in part))
            for method, _ in part:
                async with asyncio.timeout(20):
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = 0 if method == b"HEAD" else content_length(head)
                    got.append(head + await reader.readexactly(length))
    return got


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("answer", range(len(ANSWERS)))
async def test_the_same_answer_again_reaches_the_client_as_the_target_sent_it(
    l7: L7, answer: int, batch: int
) -> None:
    path = b"/a/%d" % answer
    got = await _exchange(l7, [(b"GET", path)] * 6, batch)
    assert got == [ANSWERS[answer]] * 6, got


async def test_answers_again_after_a_head_request_and_others(l7: L7) -> None:
    """The same answer's head to a HEAD request (no body read), then again to GETs; another
    answer between; each as on a fresh connection."""
    asked = [(b"GET", b"/a/0"), (b"GET", b"/a/0"), (b"HEAD", b"/a/0"), (b"GET", b"/a/0")]
    asked += [(b"GET", b"/a/4"), (b"GET", b"/a/0"), (b"GET", b"/a/0"), (b"GET", b"/a/1")]
    got = await _exchange(l7, asked)
    fresh = [(await _exchange(l7, [request]))[0] for request in asked]
    assert got == fresh, (got, fresh)
    assert got[2] == ANSWERS[0].split(b"\r\n\r\n")[0] + b"\r\n\r\n"
