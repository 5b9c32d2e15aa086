"""What :class:`~ravenproxy.server.exchange.Exchange` writes on for a parsed message
(:mod:`ravenproxy.server.http_messages`): the request head for the target, the response head
for the client and how its body goes, the body's chunks — pure functions of what was parsed."""

from __future__ import annotations

from typing import NamedTuple

from ravenproxy.server.http_heads import Head, Headers, keeps_alive
from ravenproxy.server.podroutes import HOP_BY_HOP, Destination, forwardable, wants_upgrade
from ravenproxy.server.router import Route


def header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def fields(headers: Headers) -> bytes:
    return "".join(f"{k}: {v}\r\n" for k, v in headers).encode("latin-1")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def last_chunk(trailers: Headers) -> bytes:
    return b"0\r\n" + fields(trailers) + b"\r\n"


class Outbound(NamedTuple):
    """A request head as it goes to the target (a named tuple: one is made per request that
    differs from the last, by :data:`_outbound`)."""

    head: bytes
    upgrade: bool
    """The client asked for a protocol upgrade (``Connection: Upgrade``)."""
    chunked: bool
    """The body goes to the target chunked."""


_outbound = tuple.__new__
"""``_outbound(Outbound, fields)``: an :class:`Outbound` made by tuple's C constructor, as
:data:`_framing` a :class:`Framing` (no Python call)."""


_VIA_LINES: dict[tuple[str, str], bytes] = {}
"""``Via: 1.1 token`` and the head's end, by (version, token): the same for a process's
requests (a server has one token), made once."""
_via_line = _VIA_LINES.get


def _via_line_made(key: tuple[str, str]) -> bytes:
    line = f"Via: {key[0]} {key[1]}\r\n\r\n".encode("latin-1")
    if len(_VIA_LINES) < 64:  # llhttp's versions by the processes' tokens: a few
        _VIA_LINES[key] = line
    return line


def request_head(request: Head, dest: Destination, route: Route, via: str) -> Outbound:
    """The head to send on: hop-by-hop fields dropped (RFC 9110 §7.6.1), ``Host`` set for the
    destination, the body's chunking kept, ``Via`` added."""
    routing = request.routing  # all it reads of a request that goes on as parsed
    if dest.authority is None and "host" in routing and HOP_BY_HOP.isdisjoint(routing):
        # Nothing dropped, nothing added but Via (no Connection, no Transfer-Encoding: no
        # upgrade, no chunking): the fields as parsed, joined in C — the bytes fields() makes
        # of their decoded form (latin-1 round-trips), without a format per field.
        lines = request.wire  # the fields' lines, as parsed
        key = (request.version, via)
        via_line = _via_line(key) or _via_line_made(key)
        line = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
        return _outbound(Outbound, (b"".join((line, lines, b"\r\n", via_line)), False, False))
    headers, lower = request.headers, request.lower
    upgrade = wants_upgrade(headers) if "connection" in lower else None
    out = forwardable(headers, upgrade=upgrade, names=lower)
    if dest.authority is not None:
        out = [(k, v) for k, v in out if k.lower() != "host"]
        out.insert(0, ("Host", dest.authority))
    elif "host" not in lower:
        out.insert(0, ("Host", f"{dest.host or route.node.name}:{route.target.port}"))
    chunked = "chunked" in lower.get("transfer-encoding", "").lower()
    if chunked:
        out.append(("Transfer-Encoding", "chunked"))
    # RFC 9110 §7.6.3; also how a request that comes back here is recognised.
    out.append(("Via", f"{request.version} {via}"))
    head = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
    return Outbound(head + fields(out) + b"\r\n", upgrade is not None, chunked)


class Framing(NamedTuple):
    """A response head as it goes to the client, and how its body and both connections go on
    (a named tuple: one is made per answer that differs from the last, by :data:`_framing`)."""

    head: bytes
    body_out: str
    """How the body goes to the client: ``length`` (as it comes), ``chunked`` (each piece a
    chunk), ``none``."""
    until_close: bool
    """The body ends when the target closes the connection."""
    up_keep: bool
    """The target connection can carry another request afterwards."""
    client_keep: bool
    """The client connection can carry another request afterwards."""


_framing = tuple.__new__
"""``_framing(Framing, fields)``: a :class:`Framing` made by tuple's C constructor, without the
named tuple's own ``__new__`` (a Python function: a call per answer)."""


def response_framing(
    response: Head, *, bodiless: bool, request_version: str, client_keep: bool, upstream: bool
) -> Framing:
    """The head for the client of a final response and its body's framing. ``bodiless``: it
    answers a HEAD; ``client_keep``: the client asked to keep its connection; ``upstream``:
    the target connection is still held."""
    if response.plain and not bodiless and response.status not in (204, 304):
        # A length-framed answer without a hop-by-hop field (so no Transfer-Encoding, no
        # Connection): nothing is dropped, the head goes on as parsed (a target's usual answer;
        # each scrape's differs, in its Date and length). keeps_alive's rule, no field to read.
        up_keep = response.version == "1.1" and upstream
        wire = response.wire
        head = wire if client_keep else wire[:-2] + b"Connection: close\r\n\r\n"
        return _framing(Framing, (head, "length", False, up_keep, client_keep))
    headers, lower = response.headers, response.lower
    kept = forwardable(headers, names=lower)
    te = lower.get("transfer-encoding", "").lower()
    if te:
        # RFC 9112 §6.3: Transfer-Encoding wins, and a proxy drops the length.
        kept = [(k, v) for k, v in kept if k.lower() != "content-length"]
    up_keep = keeps_alive(response) and upstream and not bodiless
    until_close = False
    if bodiless or response.status in (204, 304):
        body_out = "none"
        if te.endswith("chunked"):
            kept.append(("Transfer-Encoding", "chunked"))
    elif te.endswith("chunked"):
        body_out = "chunked"
        kept.append(("Transfer-Encoding", "chunked"))
    elif te or "content-length" not in lower:
        until_close, up_keep = True, False
        if request_version == "1.1":
            body_out = "chunked"
            kept.append(("Transfer-Encoding", "chunked"))
        else:
            body_out = "length"
            client_keep = False
    else:
        body_out = "length"
    if not client_keep:
        kept.append(("Connection", "close"))
    head = f"HTTP/1.1 {response.status} {response.start}\r\n".encode("latin-1")
    head += fields(kept) + b"\r\n"
    return _framing(Framing, (head, body_out, until_close, up_keep, client_keep))


def switch_head(response: Head) -> bytes:
    """The ``101`` for the client: the target's, hop-by-hop fields dropped but the upgrade's
    (``Upgrade``, and ``Connection: Upgrade`` for it)."""
    headers = response.headers
    kept = forwardable(headers, upgrade=header(headers, "upgrade") or "websocket")
    return f"HTTP/1.1 101 {response.start}\r\n".encode("latin-1") + fields(kept) + b"\r\n"
