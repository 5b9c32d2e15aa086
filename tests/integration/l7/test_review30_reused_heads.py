"""Review of branch heads (issue 15) on real connections (the real server and agent, a scripted
target): a head that reuses the last one's (the parse compares names and values, an answer's
head shaped from them) must reach the far end byte for byte as the same head does on a fresh
connection, where nothing is reused — when it differs from the last only by a value, a name's
case, a value's case, an empty value, a repeated Content-Length, an HTTP/1.0 keep-alive; and an
answer after a 1xx, with trailers, or differing from the last only by a name's case or a value."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import EDGE_IP, L7, front_client
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

# Answers by the path asked (/a/N).
ANSWERS = [
    OK,
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nX-V: a\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nDate: 2\r\nX-V: a\r\nContent-Length: 2\r\n\r\nok",  # a value
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nx-v: a\r\nContent-Length: 2\r\n\r\nok",  # a name's case
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nX-V: A\r\nContent-Length: 2\r\n\r\nok",  # a value's case
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nX-V:\r\nContent-Length: 2\r\n\r\nok",  # empty
    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nX-V: a\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-V: a\r\n\r\n2\r\nok\r\n0\r\nT: 1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nX-V: a\r\nContent-Length: 2\r\nConnection: keep-alive\r\n"
    b"\r\nok",
]


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """One answer as the client gets it: 1xx heads, the final head, its body."""
    got = b""
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        got += head
        if not head.startswith(b"HTTP/1.1 1"):
            break
    fields = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:] if line)
    }
    if b"content-length" in fields:
        return got + await reader.readexactly(int(fields[b"content-length"]))
    if head.startswith((b"HTTP/1.1 204", b"HTTP/1.1 304")):
        return got
    while True:  # chunked (the answers here have a trailer or none)
        line = await reader.readuntil(b"\r\n")
        got += line
        if line == b"0\r\n":  # trailers, then the empty line
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                got += line
            return got + line
        got += await reader.readexactly(int(line, 16) + 2)


def _target(seen: list[bytes]) -> Handler:
    """The scripted target: what it got goes into ``seen``; it answers by the path asked."""

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                seen.append(head + await reader.readexactly(length))
                path = head.split(b" ", 2)[1]
                if path.startswith(b"/big/"):  # an answer whose head is N bytes
                    size, pad = int(path[5:]), b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                    pad += b"X-Pad: %b\r\n\r\n" % (b"p" * (size - len(pad) - 11))
                    writer.write(pad + b"ok")
                else:
                    writer.write(ANSWERS[int(path.rsplit(b"/", 1)[1])] if b"/a/" in path else OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    return target


async def _exchange(
    l7: L7, requests: list[bytes], *, pipelined: bool = False
) -> tuple[list[bytes], list[bytes]]:
    """``requests`` on one client connection (``pipelined``: in one write, the parse's reuse of
    the last head then not bypassed by the replay of a whole read): what the target got and
    what the client got."""
    seen: list[bytes] = []
    got: list[bytes] = []
    async with (
        tcp_server(_target(seen), EDGE_IP, l7.spare_port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        writes = [(b"".join(requests), len(requests))] if pipelined else [(r, 1) for r in requests]
        for data, answers in writes:
            writer.write(data.replace(b"PORT", b"%d" % l7.spare_port))
            for _ in range(answers):
                async with asyncio.timeout(20):
                    got.append(await _answer(reader))
    return seen, got


def _request(target: bytes, *lines: bytes, version: bytes = b"1.1") -> bytes:
    head = [b"GET %b HTTP/%b" % (target, version), b"Host: edge-1:PORT", *lines]
    return b"\r\n".join(head) + b"\r\n\r\n"


FIRST = _request(b"/r", b"X-V: a", b"X-E: e")
SECONDS = [
    FIRST,
    _request(b"/r", b"X-V: b", b"X-E: e"),
    _request(b"/r", b"x-v: a", b"X-E: e"),
    _request(b"/r", b"X-V: A", b"X-E: e"),
    _request(b"/r", b"X-V: a", b"X-E:"),
    _request(b"/s", b"X-V: a", b"X-E: e"),
    _request(b"/r", b"X-V: a", b"X-E: e", b"Connection: keep-alive", version=b"1.0"),
    _request(b"/r", b"X-V: a", b"X-E: e", b"Connection: close"),
    b"POST /r HTTP/1.1\r\nHost: edge-1:PORT\r\nX-V: a\r\nX-E: e\r\nContent-Length: 2\r\n\r\nok",
]


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("second", range(len(SECONDS)))
async def test_a_request_after_a_like_one_reaches_the_target_as_on_a_fresh_connection(
    l7: L7, second: int, pipelined: bool
) -> None:
    request = SECONDS[second]
    seen, got = await _exchange(l7, [FIRST, request], pipelined=pipelined)
    fresh_seen, fresh_got = await _exchange(l7, [request])
    assert len(seen) == 2 and seen[1] == fresh_seen[0], (seen, fresh_seen)
    assert got[1] == fresh_got[0], (got, fresh_got)
    # The fields as they came (case, values) reach the target.
    lines = request.split(b"\r\n\r\n")[0].split(b"\r\n")[2:4]
    assert all(line.rstrip() in seen[1] for line in lines), (lines, seen[1])


@pytest.mark.parametrize("answer", range(1, len(ANSWERS)))
async def test_an_answer_after_a_like_one_reaches_the_client_as_on_a_fresh_connection(
    l7: L7, answer: int
) -> None:
    path = b"/a/%d" % answer
    _, got = await _exchange(l7, [_request(b"/a/1"), _request(path), _request(path)])
    _, fresh = await _exchange(l7, [_request(path)])
    assert got[1] == got[2] == fresh[0], (got, fresh)
    if answer < 7:  # plain: as the target wrote it (an empty value on "name: " line)
        assert fresh[0] == ANSWERS[answer].replace(b"X-V:\r\n", b"X-V: \r\n"), fresh


LIMIT = 64 * 1024  # the server's --max-header-size (its default, as the L7 bed runs it)


def _sized(method: bytes, size: int, port: int) -> bytes:
    """A request to ``port`` whose head is ``size`` bytes with the method DELETE (GET: 3 less)."""
    bare = _request(b"/r", b"X-Pad: ").replace(b"PORT", b"%d" % port)
    pad = b"p" * (size - len(bare) - 3)  # DELETE is 3 bytes longer than GET
    return _request(b"/r", b"X-Pad: " + pad).replace(b"PORT", b"%d" % port).replace(b"GET", method)


async def _status_alone(l7: L7, request: bytes) -> bytes:
    """The status line ``request`` alone on a fresh connection is answered with."""
    async with (
        tcp_server(_target([]), EDGE_IP, l7.spare_port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        writer.write(request.replace(b"PORT", b"%d" % l7.spare_port))
        async with asyncio.timeout(20):
            return await reader.readuntil(b"\r\n")


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1])
async def test_a_request_near_the_head_limit_after_one_with_its_fields(l7: L7, size: int) -> None:
    # The second's fields the first's (the parse reuses their lines and size), its method not.
    first, second = _sized(b"GET", size, l7.spare_port), _sized(b"DELETE", size, l7.spare_port)
    assert len(second) == size
    async with (
        tcp_server(_target([]), EDGE_IP, l7.spare_port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        writer.write(first + second)
        async with asyncio.timeout(20):
            got = [await _answer(reader), await reader.readuntil(b"\r\n")]
    fresh_status = await _status_alone(l7, second)
    assert got[0] == OK
    assert got[1] == fresh_status, (got, fresh_status)
    assert got[1].startswith(b"HTTP/1.1 431 " if size > LIMIT else b"HTTP/1.1 200 "), got


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1])
async def test_an_answer_near_the_head_limit_after_one_with_its_names(l7: L7, size: int) -> None:
    # The second answer's names the first's (its shape reused), its value longer.
    async with (
        tcp_server(_target([]), EDGE_IP, l7.spare_port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        port = b"%d" % l7.spare_port
        writer.write(_request(b"/big/1000").replace(b"PORT", port))
        async with asyncio.timeout(20):
            first = await _answer(reader)
        writer.write(_request(b"/big/%d" % size).replace(b"PORT", port))
        async with asyncio.timeout(20):
            status = await reader.readuntil(b"\r\n")
    assert first.startswith(b"HTTP/1.1 200 ") and len(first) == 1002
    assert status == await _status_alone(l7, _request(b"/big/%d" % size))
    assert status.startswith(b"HTTP/1.1 502 " if size > LIMIT else b"HTTP/1.1 200 "), status
