"""The wire of a response head as it goes on to the client, made from a template per *shape* —
status, reason phrase, field names in order — and the head's values: a target's answers differ
in their values (a Date, a Content-Length), seldom in their shape.
:meth:`~ravenproxy.server.http_messages.Parsed.on_headers_complete` takes the last answer's
template when the status, reason and names are the last one's (a parser keeps it); else it asks
:func:`shape_of` (a dict's C ``get``: no Python call when the shape is known), then
:func:`shaped`.
"""

from __future__ import annotations

from ravenproxy.server.http_heads import FRAMING_KIND

_framing_kind = FRAMING_KIND.get

_STATUS_LINES: dict[int, bytes] = {}
"""``HTTP/1.1 200 `` by status: a response's :attr:`Head.wire` begins with it."""
_status_line = _STATUS_LINES.get

ShapeKey = tuple[int, bytes, tuple[bytes, ...]]
SHAPES: dict[ShapeKey, tuple[bytes, bool]] = {}
"""A response head's template and plainness by its shape — status, reason phrase, field names in
order (:func:`shaped`): shared by every target connection (the targets are alike: kubelets,
exporters)."""
shape_of = SHAPES.get
SHAPES_MAX = 512
"""Shapes kept at most (a target whose names change per answer makes a shape per answer)."""
SHAPE_MAX = 1024
"""A longer template is not kept (``SHAPES_MAX * SHAPE_MAX`` bounds what they hold)."""


def shaped(key: ShapeKey) -> tuple[bytes, bool]:
    """A response head's template — its wire with ``%b`` for each field's value — and whether
    it is plain (one Content-Length and no hop-by-hop field: each name looked up lower-cased,
    not decoded; a regular expression over the head cost more), by ``(status, reason, names)``.
    The wire is the bytes fields(headers) makes after the status line: latin-1 round-trips."""
    status, reason, names = key
    # The status line's start made once per status, as a format parses its template per call:
    # llhttp takes 3 digits, so at most 1 000 are kept.
    line = _status_line(status) or _STATUS_LINES.setdefault(status, b"HTTP/1.1 %d " % status)
    lines = b": %b\r\n".join(names) + b": %b\r\n\r\n" if names else b"\r\n"
    if b"%" in reason or lines.count(b"%") != len(names):  # a % of theirs (in a token): escaped
        reason = reason.replace(b"%", b"%%")
        lines = b"".join(n.replace(b"%", b"%%") + b": %b\r\n" for n in names) + b"\r\n"
    template = b"".join((line, reason, b"\r\n", lines))
    framing = 0
    for name in names:
        part = _framing_kind(name.lower())
        if part is not None:
            framing += part
    shape = (template, framing == 1)
    if len(SHAPES) < SHAPES_MAX and len(template) <= SHAPE_MAX:
        SHAPES[key] = shape
    return shape
