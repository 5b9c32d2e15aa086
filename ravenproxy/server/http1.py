"""What the fronts share around HTTP: authority parsing, the 4xx error type, error answers.
(HTTP/1.1 itself is parsed with llhttp in :mod:`ravenproxy.server.exchange`.)"""

from __future__ import annotations

from http import HTTPStatus

from ravenproxy.errors import RavenProxyError


class BadRequest(RavenProxyError):
    """A request the fronts refuse before routing it; ``status`` is the 4xx to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


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
