"""answerparse (issue 15) on real connections (the real server and agent, a scripted target): an
answer of the last answer's layout — its status line and names, its values as long, only their
bytes other (a Date's second, an ETag, a Content-Length) — is read without llhttp. A target
answering such answers to requests one at a time or pipelined, with values of every kind of
byte a server may send (obs-text, tabs and spaces inside, a colon), a HEAD request among them,
one whose values change length, must reach the client byte for byte as it sent them."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

_HEAD = (
    b'HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 06:%02d:%02d GMT\r\nETag: "%b"\r\n'
    b"X-Note: %b\r\nContent-Length: %d\r\n\r\n"
)
_NOTE = b"caf\xe9\tn%02d: %%b \xff\x80 z\t"
"""A value with obs-text, tabs and spaces inside and after, a colon, a ``%``: its bytes of the
same kinds at each place from answer to answer (the path reads it), but for its number."""


def answer(n: int) -> bytes:
    """The target's answer to /v/N: its values differ from N to N, as long for N < 100 (a body
    of 5 to 9 bytes), longer from 100 on."""
    body = b"b%d" % n + b"." * (n % 5 + 3 - len(b"%d" % n) + 1)
    note = _NOTE % (n % 100) + (b"longer" * (n % 3 + 1) if n >= 100 else b"")
    etag = b"%08x" % (n * 2654435761 % 2**32)
    return _HEAD % (n // 60, n % 60, etag, note, len(body)) + body


def _target() -> Handler:
    """The scripted target: answers by the path asked, each in a write of its own."""

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ", 2)[:2]
                whole = answer(int(path.rsplit(b"/", 1)[1]))
                if method == b"HEAD":
                    whole = whole.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
                writer.write(whole)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    return target


async def _exchange(l7: L7, requests: list[tuple[bytes, int]], batch: int = 1) -> list[bytes]:
    """``(method, N)`` requests on one client connection, ``batch`` of them in a write
    (pipelined): the answers the client got (each read by what it asked)."""
    port = l7.spare_port
    got: list[bytes] = []
    async with (
        tcp_server(_target(), EDGE_IP, port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        for at in range(0, len(requests), batch):
            part = requests[at : at + batch]
            line = b"%b /v/%d HTTP/1.1\r\nHost: edge-1:%d\r\n\r\n"
            writer.write(b"".join(line % (method, n, port) for method, n in part))
            for method, _ in part:
                async with asyncio.timeout(20):
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = 0
                    for field in head.split(b"\r\n"):
                        name, _, value = field.partition(b":")
                        if name.lower() == b"content-length":
                            length = int(value)
                    got.append(head + await reader.readexactly(0 if method == b"HEAD" else length))
    return got


@pytest.mark.parametrize("batch", [1, 4])
async def test_answers_of_one_layout_reach_the_client_as_the_target_sent_them(
    l7: L7, batch: int
) -> None:
    numbers = list(range(1, 13))
    got = await _exchange(l7, [(b"GET", n) for n in numbers], batch)
    assert got == [answer(n) for n in numbers]


async def test_a_head_request_and_values_that_change_length_among_them(l7: L7) -> None:
    asked = [(b"GET", n) for n in (1, 2, 3, 4)] + [(b"HEAD", 5), (b"GET", 6)]
    asked += [(b"GET", n) for n in (101, 102, 7, 8, 9, 103, 104, 105)]
    got = await _exchange(l7, asked)
    assert got == [
        answer(n) if method == b"GET" else answer(n).split(b"\r\n\r\n")[0] + b"\r\n\r\n"
        for method, n in asked
    ]
