"""review34: answerparse's own read of an answer (an answer of the last one's layout, whole in a
read, parsed without llhttp) through the real server front and agent, a target scripted byte by
byte and a client that reads everything the front sends. A run of answers of one layout primes
the path; then an answer of the layout, its values as long, changed in one way — obs-text or a
``:`` where a letter was (the path's), a control or CR/LF alone inside a value, a value that
carries CRLF and another field (header injection), a Content-Length of other bytes as long
(``09``, ``+9``, `` 9``, ``9 ``, ``-1``), a body one byte longer or an answer nobody asked for in
the same write (stray), another status of the same shape (204, 304, 100 first), an HTTP/1.0
status line — and a run after it. The reference is a fresh connection: each request alone on a
new client connection (a new target connection, whose first answers llhttp parses) gets what
it gets in the run, byte for byte, and the connection ends where it ends alone."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.l7.env import EDGE_IP, L7, content_length, front_client
from tests.integration.targets import Handler, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

_HEAD = (
    b"HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 06:00:%02d GMT\r\nX-Tag: t%02dab\r\n"
    b"Content-Length: %b\r\n\r\n"
)


def _answer(n: int, way: bytes) -> bytes:
    """The target's answer to ``/k/N/way``: ``ok`` is of the layout (a body of 10 bytes), the
    others it changed in one way, each head as long as the layout's."""
    body = b"body-%05d" % n
    ok = _HEAD % (n % 60, n % 100, b"10") + body
    tag = b"X-Tag: t%02dab" % (n % 100)
    changes = {
        b"ok": ok,
        b"obs": ok.replace(tag, tag[:-2] + b"\xe9:"),
        b"ctl": ok.replace(tag, tag[:-2] + b"\x01b"),
        b"cr": ok.replace(tag, tag[:-2] + b"\rb"),
        b"lf": ok.replace(tag, tag[:-2] + b"\nb"),
        b"del": ok.replace(tag, tag[:-2] + b"\x7fb"),
        b"inject": ok.replace(b"Sun, 06 Dec 2026 06", b"S\r\nContent-Length: 0"),
        b"fold": ok.replace(b"Sun, 06 Dec 2026 06", b"Sun\r\n X-Folded: 6 06"),
        b"09": (_HEAD % (n % 60, n % 100, b"09")) + body[:9],
        b"plus": (_HEAD % (n % 60, n % 100, b"+9")) + body[:9],
        b"space": (_HEAD % (n % 60, n % 100, b" 9")) + body[:9],
        b"after": (_HEAD % (n % 60, n % 100, b"9 ")) + body[:9],
        b"minus": (_HEAD % (n % 60, n % 100, b"-1")) + body[:9],
        b"longer": ok + b"!",
        b"stray": ok + _HEAD % (n % 60, 99, b"10") + b"stray-body",
        b"204": (_HEAD % (n % 60, n % 100, b"10")).replace(b"200 OK", b"204 OK"),
        b"304": (_HEAD % (n % 60, n % 100, b"10")).replace(b"200 OK", b"304 OK"),
        b"100": b"HTTP/1.1 100 Continue\r\n\r\n" + ok,
        b"10": ok.replace(b"HTTP/1.1", b"HTTP/1.0"),
        b"case": ok.replace(b"X-Tag", b"x-tag"),
        b"long": _HEAD % (n % 60, n % 100, b"20") + body * 2,
        b"head-stray": ok,  # (to a HEAD: its head, then this whole answer in the same write)
    }
    return changes[way]


_CUTS = {b"cut-body": -3, b"cut-head": 20, b"cut-end": -10, b"cut-long": -3}
"""Ways that send ``ok`` in two writes, cut there (in the body, the head, at the head's end)."""


WAYS = [
    b"obs",
    b"ctl",
    b"cr",
    b"lf",
    b"del",
    b"inject",
    b"fold",
    b"09",
    b"plus",
    b"space",
    b"after",
    b"minus",
    b"longer",
    b"stray",
    b"204",
    b"304",
    b"100",
    b"10",
    b"case",
    b"long",
    b"head-stray",
    *_CUTS,
]


def _target() -> Handler:
    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            method, path = head.split(b" ", 2)[:2]
            _, n, way = path.split(b"/")[1:4]
            whole = _answer(
                int(n), b"long" if way == b"cut-long" else b"ok" if way in _CUTS else way
            )
            if method == b"HEAD":
                whole = whole.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
                if way == b"head-stray":  # an answer nobody asked for after a HEAD's
                    whole += _answer(int(n), b"ok")
            at = _CUTS.get(way, len(whole))
            writer.write(whole[:at])  # (a cut answer: the rest in a write of its own)
            await writer.drain()
            if whole[at:]:
                await asyncio.sleep(0.05)
                writer.write(whole[at:])
                await writer.drain()

    return target


async def _read_all(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """What the front sends until it is quiet for 0.3 s, and whether it closed."""
    got = b""
    while True:
        try:
            async with asyncio.timeout(0.3):
                data = await reader.read(65536)
        except TimeoutError:
            return got, False
        if not data:
            return got, True
        got += data


async def _run(l7: L7, port: int, paths: list[bytes]) -> list[tuple[bytes, bool]]:
    """``GET path`` (``HEAD`` for a ``head-`` way) one at a time on one client connection (a
    new one after the front closed it): what the client got for each."""
    got: list[tuple[bytes, bool]] = []
    at = 0
    while at < len(paths):
        async with front_client(l7.http, abort=True) as (reader, writer):
            while at < len(paths):
                method = b"HEAD" if b"/head" in paths[at] else b"GET"
                writer.write(
                    b"%b %b HTTP/1.1\r\nHost: edge-1:%d\r\n\r\n" % (method, paths[at], port)
                )
                at += 1
                got.append(await _read_all(reader))
                if got[-1][1]:
                    break
    return got


def _dateless(got: tuple[bytes, bool]) -> tuple[bytes, bool]:
    """The front's own answers (an error's) carry its Date: taken out."""
    lines = got[0].split(b"\r\n")
    own = lines[0].startswith(b"HTTP/1.1 5")
    return b"\r\n".join(x for x in lines if not (own and x.startswith(b"Date: "))), got[1]


async def _way(l7: L7, port: int, way: bytes) -> list[tuple[bytes, bool]] | None:
    """A run of ``ok`` answers, ``way`` fourth, then the same requests each on a fresh
    connection: None when every answer of the run is the fresh one's, else both lists."""
    paths = [b"/k/%d/ok" % n for n in range(1, 4)] + [b"/k/4/" + way]
    paths += [b"/k/%d/ok" % n for n in range(5, 7)]
    run = await _run(l7, port, paths)
    fresh = [(await _run(l7, port, [path]))[0] for path in paths]
    assert run[0][0].endswith(b"body-00001"), run  # (the target answers)
    if [_dateless(g) for g in run] == [_dateless(f) for f in fresh]:
        return None
    return [*run, (b"-- fresh --", False), *fresh]


async def test_an_answer_changed_after_a_run_of_its_layout_is_what_a_fresh_connection_gets(
    l7: L7,
) -> None:
    """Every way at once, each on connections of its own (the target answers by path): each
    way's run is read by quiet periods, so side by side they take one way's time."""
    port = l7.spare_port
    async with tcp_server(_target(), EDGE_IP, port):
        got = await asyncio.gather(*(_way(l7, port, way) for way in WAYS))
    differ = {way: g for way, g in zip(WAYS, got, strict=True) if g is not None}
    assert not differ, differ


@pytest.mark.parametrize("batch", [2, 3])
async def test_pipelined_gets_and_heads_of_one_layout_are_what_a_fresh_connection_gets(
    l7: L7, batch: int
) -> None:
    """GETs and HEADs of answers of one layout, ``batch`` in a write: each answer as a fresh
    connection gets it alone."""
    port = l7.spare_port
    asked = [(b"GET" if n % 4 else b"HEAD", b"/k/%d/ok" % n) for n in range(1, 13)]
    asked[6] = (b"GET", b"/k/7/obs")
    got: list[bytes] = []
    async with tcp_server(_target(), EDGE_IP, port):
        async with front_client(l7.http, abort=True) as (reader, writer):
            for at in range(0, len(asked), batch):
                part = asked[at : at + batch]
                line = b"%b %b HTTP/1.1\r\nHost: edge-1:%d\r\n\r\n"
                writer.write(b"".join(line % (method, path, port) for method, path in part))
                for method, _ in part:
                    got.append(await _one(reader, method))
        fresh = []
        for method, path in asked:
            async with front_client(l7.http, abort=True) as (reader, writer):
                writer.write(b"%b %b HTTP/1.1\r\nHost: edge-1:%d\r\n\r\n" % (method, path, port))
                fresh.append(await _one(reader, method))
    assert got == fresh, (got, fresh)
    assert got[1].endswith(b"body-00002")


async def _one(reader: asyncio.StreamReader, method: bytes) -> bytes:
    """One answer, read by its Content-Length (none for a HEAD's)."""
    async with asyncio.timeout(20):
        head = await reader.readuntil(b"\r\n\r\n")
        return head + await reader.readexactly(0 if method == b"HEAD" else content_length(head))
