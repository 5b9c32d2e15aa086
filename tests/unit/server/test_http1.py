"""HTTP/1.1 request heads: reading with a limit, parsing, authorities, error responses."""

from __future__ import annotations

import asyncio

import pytest

from ravenproxy.server.http1 import (
    MAX_HEAD,
    BadRequest,
    error_response,
    parse_head,
    read_head,
    split_authority,
)


# -- parse_head --------------------------------------------------------------------------------
def test_parse_connect_head() -> None:
    raw = b"CONNECT edge-1:10250 HTTP/1.1\r\nHost: edge-1:10250\r\nX-Empty:\r\nA:  b c \r\n\r\n"
    head = parse_head(raw)
    assert (head.method, head.target, head.version) == ("CONNECT", "edge-1:10250", "HTTP/1.1")
    assert head.headers == [("Host", "edge-1:10250"), ("X-Empty", ""), ("A", "b c")]
    assert head.header("host") == "edge-1:10250"
    assert head.header("HOST") == "edge-1:10250"
    assert head.header("missing") is None
    assert head.raw == raw


def test_parse_head_keeps_repeated_headers_in_order() -> None:
    head = parse_head(b"GET / HTTP/1.0\r\nA: 1\r\nA: 2\r\n\r\n")
    assert head.version == "HTTP/1.0"
    assert head.headers == [("A", "1"), ("A", "2")]
    assert head.header("a") == "1"


def test_parse_head_latin1_bytes() -> None:
    head = parse_head(b"GET /\xe9 HTTP/1.1\r\nX: \xff\r\n\r\n")
    assert head.target == "/\xe9"
    assert head.headers == [("X", "\xff")]


@pytest.mark.parametrize(
    "raw",
    [
        b"\r\n\r\n",
        b"CONNECT edge-1:10250\r\n\r\n",
        b"CONNECT edge-1:10250 HTTP/2\r\n\r\n",
        b"CONNECT  edge-1:10250 HTTP/1.1\r\n\r\n",
        b"CONNECT edge-1:10250 HTTP/1.1 extra\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\nno colon here\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\n: empty name\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\nHost : a\r\n\r\n",
        b"CONNECT a:1 HTTP/1.1\r\n Host: a\r\n\r\n",
    ],
)
def test_malformed_heads_are_400(raw: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_head(raw)
    assert info.value.status == 400


@pytest.mark.parametrize("fold", [b" continued", b"\tcontinued"])
def test_header_folding_is_refused(fold: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_head(b"CONNECT a:1 HTTP/1.1\r\nX-Long: first\r\n" + fold + b"\r\n\r\n")
    assert info.value.status == 400
    assert "folding" in info.value.reason


# -- split_authority ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("authority", "default", "expected"),
    [
        ("edge-1:10250", None, ("edge-1", 10250)),
        ("10.0.0.1:1", None, ("10.0.0.1", 1)),
        ("[fd00::1]:65535", None, ("fd00::1", 65535)),
        ("[fd00::1]", 443, ("fd00::1", 443)),
        ("edge-1", 80, ("edge-1", 80)),
        ("fd00::1", 443, ("fd00::1", 443)),
    ],
)
def test_split_authority(authority: str, default: int | None, expected: tuple[str, int]) -> None:
    assert split_authority(authority, default) == expected


@pytest.mark.parametrize(
    "authority",
    [
        "edge-1",
        "[fd00::1]",
        ":80",
        "[]:80",
        "[fd00::1:80",
        "edge-1:0",
        "edge-1:65536",
        "edge-1:x",
        "edge-1:-1",
        "[fd00::1]:http",
    ],
)
def test_bad_authority_is_400(authority: str) -> None:
    with pytest.raises(BadRequest) as info:
        split_authority(authority)
    assert info.value.status == 400


def test_superscript_port_is_400() -> None:
    with pytest.raises(BadRequest):
        split_authority(parse_head(b"CONNECT edge-1:\xb2 HTTP/1.1\r\n\r\n").target)


def test_junk_after_bracketed_host_is_400() -> None:
    with pytest.raises(BadRequest):
        split_authority("[fd00::1]junk", 443)


# -- error_response ----------------------------------------------------------------------------
def _split_response(data: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return lines[0], headers, body


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (404, "HTTP/1.1 404 Not Found"),
        (503, "HTTP/1.1 503 Service Unavailable"),
        (431, "HTTP/1.1 431 Request Header Fields Too Large"),
        (599, "HTTP/1.1 599 Error"),
    ],
)
def test_error_response_format(status: int, line: str) -> None:
    status_line, headers, body = _split_response(error_response(status, "edge-9: unknown node"))
    assert status_line == line
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert headers["Connection"] == "close"
    assert int(headers["Content-Length"]) == len(body)
    assert body == b"edge-9: unknown node\n"


def test_error_response_one_line_body_and_utf8_length() -> None:
    _, headers, body = _split_response(error_response(502, "nœud: lost\n\n", {"Retry-After": "1"}))
    assert body == "nœud: lost\n".encode()
    assert body.count(b"\n") == 1
    assert int(headers["Content-Length"]) == len(body)
    assert headers["Retry-After"] == "1"


# -- read_head ---------------------------------------------------------------------------------
def reader_with(data: bytes, eof: bool = True, limit: int = MAX_HEAD) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    return reader


async def test_read_head_returns_bytes_through_the_blank_line() -> None:
    head = b"CONNECT a:1 HTTP/1.1\r\nHost: a\r\n\r\n"
    reader = reader_with(head + b"early body bytes", eof=False)
    assert await read_head(reader) == head
    assert await reader.read(5) == b"early"  # the rest stays for the relay


async def test_read_head_clean_eof_is_none() -> None:
    assert await read_head(reader_with(b"")) is None


async def test_read_head_partial_is_400() -> None:
    with pytest.raises(BadRequest) as info:
        await read_head(reader_with(b"CONNECT a:1 HTTP/1.1\r\nHost"))
    assert info.value.status == 400


async def test_read_head_over_the_limit_is_431() -> None:
    with pytest.raises(BadRequest) as info:
        await read_head(reader_with(b"GET /" + b"a" * (MAX_HEAD + 10), eof=False))
    assert info.value.status == 431


async def test_read_head_honours_its_limit_argument() -> None:
    head = b"GET /" + b"a" * 1000 + b" HTTP/1.1\r\n\r\n"
    with pytest.raises(BadRequest) as info:
        await read_head(reader_with(head), limit=100)
    assert info.value.status == 431
