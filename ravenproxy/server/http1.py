"""HTTP/1.1 request heads: read with a size limit, parse, and answer errors. No routing here."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from http import HTTPStatus

MAX_HEAD = 64 * 1024
"""Largest request head (request line + headers) accepted; kubelet exec URLs can be long."""


class BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass
class RequestHead:
    method: str
    target: str
    version: str
    headers: list[tuple[str, str]] = field(default_factory=list)
    raw: bytes = b""

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for key, value in self.headers:
            if key.lower() == lname:
                return value
        return None


async def read_head(reader: asyncio.StreamReader, limit: int = MAX_HEAD) -> bytes | None:
    """The bytes up to and including the blank line; None on a clean EOF before any byte."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise BadRequest(400, "connection closed inside the request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest(431, f"request head larger than {limit} bytes") from None
    if len(head) > limit:
        raise BadRequest(431, f"request head larger than {limit} bytes")
    return head


def parse_head(raw: bytes) -> RequestHead:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes everything
        raise BadRequest(400, "undecodable request head") from None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, f"malformed request line {lines[0][:80]!r}")
    method, target, version = parts
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t":
            raise BadRequest(400, "obsolete header folding is not accepted")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, f"malformed header line {line[:80]!r}")
        headers.append((name, value.strip()))
    return RequestHead(method, target, version, headers, raw)


def split_authority(authority: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` / ``host`` (with a default port) → (host, port)."""
    host, port_text = authority, ""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise BadRequest(400, f"bad authority {authority!r}")
        host, rest = authority[1:end], authority[end + 1 :]
        if rest.startswith(":"):
            port_text = rest[1:]
        elif rest:
            raise BadRequest(400, f"bad authority {authority!r}")
    elif authority.count(":") == 1:
        host, _, port_text = authority.partition(":")
    if not host:
        raise BadRequest(400, f"bad authority {authority!r}")
    if not port_text:
        if default_port is None:
            raise BadRequest(400, f"{authority!r} has no port")
        return host, default_port
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise BadRequest(400, f"bad port in {authority!r}")
    return host, int(port_text)


def error_response(status: int, body: str, extra_headers: dict[str, str] | None = None) -> bytes:
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    payload = (body.rstrip("\n") + "\n").encode("utf-8")
    head = [
        f"HTTP/1.1 {status} {phrase}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(payload)}",
        "Connection: close",
    ]
    for key, value in (extra_headers or {}).items():
        head.append(f"{key}: {value}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload
