"""Request-target authorities: ``host:port``, ``[v6]:port``, default ports, and 400s."""

from __future__ import annotations

import pytest

from ravenproxy.server.http1 import BadRequest, error_response, split_authority


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
        split_authority(b"edge-1:\xb2".decode("latin-1"))  # "edge-1:²": isdigit(), not ASCII


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
