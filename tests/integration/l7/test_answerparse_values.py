"""answerparse (issue 15) on real connections (the real server and agent, a scripted target): an
answer of the last answer's layout — its status line and names, its values as long, only their
bytes other (a Date's second, an ETag, a Content-Length) — is read without llhttp. A target
answering such answers to requests one at a time or pipelined, with values of every kind of
byte a server may send (obs-text, tabs and spaces inside, a colon), a HEAD request among them,
one whose values change length, must reach the client byte for byte as it sent them."""

from __future__ import annotations

from collections.abc import Awaitable

import pytest

from tests.integration.l7.env import L7
from tests.integration.l7.test_answeragain_same_answers import _exchange as exchange

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


def _exchange(l7: L7, requests: list[tuple[bytes, int]], batch: int = 1) -> Awaitable[list[bytes]]:
    """``(method, N)`` requests for /v/N (answered by :func:`answer`) on one client connection,
    ``batch`` of them in a write (test_answeragain_same_answers' harness)."""
    asked = [(method, b"/v/%d" % n) for method, n in requests]
    return exchange(l7, asked, batch, answer)


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
