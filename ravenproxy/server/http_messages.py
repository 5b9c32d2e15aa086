"""HTTP/1.1 messages as :class:`~ravenproxy.server.exchange.Exchange` sees them: parsed by
llhttp (through ``httptools``) into queued events (:class:`Parsed`, :class:`Head`), and written
back for the other side (the heads sent on, chunks), as pure functions of what was parsed.

The parsers run ahead of the exchange (a pipelined request is parsed while the one before it is
answered): what they parse is queued as events and taken when the exchange is ready for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from httptools import (
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
    HttpResponseParser,
)

from ravenproxy.server.http_heads import (
    FRAMING_KIND,
    Head,
    Headers,
    PlainHead,
    RequestHead,
)
from ravenproxy.server.podroutes import HOP_BY_HOP, Destination, forwardable, wants_upgrade
from ravenproxy.server.router import Route

REPLAY_MAX = 2 * 1024
"""A request this long at most is kept to be recognised when it comes again: an idle kept-alive
connection holds it (a scrape or a probe is a few hundred bytes; an idle front connection's
whole budget is ~8 KiB)."""

_framing_kind = FRAMING_KIND.get
_name_value = b": ".join
"""A field as parsed, ``(name, value)``, on its line (without the line's end)."""

_STATUS_LINES: dict[int, bytes] = {}
"""``HTTP/1.1 200 `` by status: a response's :attr:`Head.wire` begins with it."""
_status_line = _STATUS_LINES.get

# Event kinds of :class:`Parsed`.
HEAD, DATA, END, ERROR, EOF = range(5)


class _Stop(Exception):
    """Raised from a parser callback to end the parse (a response that has no body)."""


class Parsed:
    """The callbacks of one llhttp parser, turning what it parses into queued events:
    ``(HEAD, Head)``, ``(DATA, bytes)``, ``(END, trailers)``, ``(ERROR, message)``,
    ``(EOF, None)``."""

    __slots__ = (
        "_again",
        "_fields",
        "_kind",
        "_last",
        "_replay_head",
        "_response",
        "_start",
        "_trailers",
        "_version",
        "bodiless",
        "events",
        "fed",
        "in_body",
        "in_head",
        "max_tail",
        "parser",
        "tail",
    )

    def __init__(self, *, response: bool, max_tail: int = 64 * 1024) -> None:
        self.events: deque[tuple[int, object]] = deque()
        self.parser: HttpRequestParser | HttpResponseParser
        self._kind: Callable[[], object]
        """The status code's getter (a response) or the method's (a request)."""
        if response:
            self.parser = HttpResponseParser(self)
            self._kind = self.parser.get_status_code
            # RFC 9112 §6.3: a response with both framings is read by its Transfer-Encoding
            # (a request with both is refused).
            self.parser.set_dangerous_leniencies(lenient_chunked_length=True)
        else:
            self.parser = HttpRequestParser(self)
            self._kind = self.parser.get_method
        self._response = response
        self._version: str | None = None
        """The HTTP version of the message being parsed when its first bytes were seen to be
        ``HTTP/1.1 `` (a response that began a read): llhttp's version, known without asking
        for it (``get_http_version`` formats a new string, per response)."""
        self.fed = 0
        """Bytes fed while no head was complete: what an unfinished head may have taken."""
        self.tail = 0
        """Bytes of the reads inside a body that brought no body byte, since the last that did:
        chunk sizes, extensions and trailers, which llhttp parses (a trailer field it holds
        whole) but no event carries. (What a read brings after its last body byte is let
        through: one read's worth, before the next read counts.)"""
        self.max_tail = max_tail
        """More than this in :attr:`tail` is an ERROR (the sender's head limit): a trailer that
        never ends would otherwise grow in the parser until memory runs out."""
        self.in_head = False
        self.in_body = False
        self.bodiless = False
        """The response to come has no body whatever its fields say (it answers a HEAD)."""
        self._start = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._trailers: list[tuple[bytes, bytes]] = []
        self._last: tuple[bytes, list[tuple[bytes, bytes]], object, str, Head] | None = None
        """The last head as parsed (start, fields, method or status, version) and its
        :class:`Head`: the same head again (a keep-alive client polling one URL, a target's
        same answer) is the same object, and what was derived from it can be reused."""
        self._again: tuple[bytes, Head] | None = None
        """The last bytes fed, when they were one whole request that left the parser as it
        found it, and its head: the same bytes again are that request again (:meth:`feed`),
        when its head passes :meth:`_replayable` (asked then, not when remembered: most
        requests that differ from the last are not followed by themselves)."""
        self._replay_head: Head | None = None
        """The last head :meth:`_replayable` said yes to (a connection's repeated request asks
        once)."""

    @property
    def midway(self) -> bool:
        """A message has begun and is not through (or the parser stopped inside it): its
        sender may still be sending it."""
        return self.in_head or self.in_body

    def _repeated(self, data: bytes) -> Head | None:
        """The remembered request's head when ``data`` is its bytes again, the parser is where
        that request left it (no head or body begun) and the head may be replayed; else None."""
        again = self._again
        if again is not None and not self.in_head and not self.in_body and data == again[0]:
            head = again[1]
            if head is self._replay_head or self._replayable(head):
                return head
        return None

    def _replayable(self, head: Head) -> bool:
        """A remembered request may be answered from memory when its bytes come again: kept
        alive (after a "close" llhttp takes no more), no body, no upgrade, no CONNECT."""
        routing = head.routing
        if (
            head.start != "CONNECT"
            and keeps_alive(head)
            and "upgrade" not in routing
            and "content-length" not in routing
            and "transfer-encoding" not in routing
        ):
            self._replay_head = head
            return True
        return False

    def feed(self, data: bytes) -> bytes | None:
        """Parse ``data``; returns the bytes past an upgrade's (or CONNECT's) head, if one
        ended the HTTP part of the connection. An error is queued after what came before it."""
        events = self.events
        head = self._repeated(data) if self._again is not None else None
        if head is not None:
            # A keep-alive client sending the same request again (a scrape, a probe): the
            # parser is where that request left it, so it would make the same two events.
            events.append((HEAD, head))
            events.append((END, []))
            self.fed = 0
            return None
        # The parser leaves that state: what it held is remembered anew (or not at all).
        self._again = None
        if self.tail > self.max_tail:  # refused (below): nothing more goes into the parser
            return None
        fresh = not events and not self.in_head and not self.in_body
        if not self.in_body:
            self.fed += len(data)
            if not self.in_head and self._response:
                self._version = "1.1" if data.startswith(b"HTTP/1.1 ") else None
        queued = len(events)
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            return data[exc.args[0] :]
        except HttpParserError as exc:
            if not isinstance(exc.__context__, _Stop):
                events.append((ERROR, str(exc) or type(exc).__name__))
            return None
        if self.in_body and len(events) == queued:  # inside a body, and nothing of it came
            self.tail += len(data)
            if self.tail > self.max_tail:
                events.append((ERROR, f"chunk framing or trailers over {self.max_tail} bytes"))
        if fresh and len(events) == 2 and len(data) <= REPLAY_MAX and not self._response:
            # One whole request that left the parser as it found it (no body event, nothing of
            # a next message) is kept: the same bytes again are that request again. (Whether
            # it may be replayed is asked then: _replayable.) Here, not in a method of its own:
            # once a request that differs.
            (kind, parsed), (end, trailers) = events
            done = not self.in_head and not self.in_body
            if kind == HEAD and end == END and not trailers and done:
                assert isinstance(parsed, Head)
                self._again = (bytes(data), parsed)
        return None

    def again(self, data: bytes, head: Head) -> bool:
        """:meth:`feed` with ``head`` taken at once: True when ``data`` is the last request
        again (``_again``), whole and bodiless, that request's head is ``head`` and no event
        waits — its END is queued; else False, and nothing was fed."""
        # :meth:`_repeated`'s rule asked without its call (once a request), the head's
        # identity first: no bytes compared for another request's head.
        again = self._again
        if again is None or again[1] is not head or self.events or self.in_head or self.in_body:
            return False
        if data != again[0]:
            # feed would compare the same bytes to miss (a call, once a request that differs)
            self._again = None
            return False
        if head is not self._replay_head and not self._replayable(head):
            return False
        self.events.append((END, []))
        self.fed = 0
        return True

    # -- llhttp's callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.in_head = True
        self._start = b""
        self._fields = []
        if self._trailers:
            self._trailers = []

    def on_url(self, url: bytes) -> None:
        self._start += url

    def on_status(self, reason: bytes) -> None:
        self._start += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:
            self._fields.append((name, value))
        else:
            self._trailers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head, self.in_body, self.fed, self.tail = False, True, 0, 0
        parser = self.parser
        version = self._version
        if version is None:
            version = parser.get_http_version()
        else:  # only the message whose start it saw
            self._version = None
        kind = self._kind()
        last = self._last
        if (
            last is not None
            and last[0] == self._start
            and last[2] == kind
            and last[3] == version
            and last[1] == self._fields
        ):
            head = last[4]
        else:
            head = self._head(version, kind)
            self._last = (self._start, self._fields, kind, version, head)
        self.events.append((HEAD, head))
        if self.bodiless and head.status >= 200:
            # llhttp cannot be told a response answers a HEAD: the parse ends here, and the
            # connection is not used again.
            self.in_body = False
            self.events.append((END, []))
            raise _Stop

    def _head(self, version: str, kind: Any) -> Head:
        """``kind``: the status code (a response) or the method (a request), as llhttp gave it."""
        fields = self._fields
        if self._response:
            status: int = kind
            # The same bytes as fields(headers) after the status line: latin-1 round-trips.
            # (Each field joined in C: no format parsed per field, no comprehension's frame;
            # the status line's start made once per status, as a format parses its template
            # per call: llhttp takes 3 digits, so at most 1 000 are kept.)
            line = _status_line(status) or _STATUS_LINES.setdefault(
                status, b"HTTP/1.1 %d " % status
            )
            if fields:
                lines = b"\r\n".join(map(_name_value, fields))
                wire = b"".join((line, self._start, b"\r\n", lines, b"\r\n\r\n"))
            else:
                wire = b"".join((line, self._start, b"\r\n\r\n"))
            # Which framing fields it has: a lookup per name, not a decode (a regular expression
            # over the head cost more; ``bytes in bytes`` makes and drops a TypeError first).
            framing = 0
            for name, _ in fields:
                part = _framing_kind(name.lower())
                if part is not None:
                    framing += part
            # llhttp's status is 3 digits: the head's size on the wire is that of ``wire``.
            if framing == 1:  # plain: what PlainHead is
                return PlainHead(self._start, status, version, fields, len(wire), wire)
            start = self._start.decode("latin-1")
            return Head(start, "", status, version, fields, len(wire), wire)
        # A request's fields on their lines as parsed, joined in C: request_head sends them on
        # when it drops none, and their length is the fields' part of the head's size ("name:
        # value" and a line end each: the lines' length and the last line's end).
        lines = b"\r\n".join(map(_name_value, fields)) if fields else b""
        size = len(lines) + 2 if fields else 0
        method = kind.decode("ascii", "replace")
        start = self._start.decode("latin-1")
        # The request line: method, target, "HTTP/1.1" and two spaces and its end (14).
        size += len(method) + len(self._start) + 14
        return RequestHead(method, start, version, fields, size, lines)

    def on_body(self, body: bytes) -> None:
        self.events.append((DATA, body))
        self.tail = 0

    def on_message_complete(self) -> None:
        self.in_body = False
        trailers = self._trailers
        # Most messages have none: no decoding comprehension run for them.
        self.events.append(
            (
                END,
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in trailers]
                if trailers
                else [],
            )
        )


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


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


def keeps_alive(head: Head) -> bool:
    """The sender keeps the connection open after this message (RFC 9112 §9.3). A client's
    ``Proxy-Connection`` (pre-standard, sent to proxies) counts as ``Connection``, as llhttp
    counts it: after a ``close`` in it the parser takes no more on the connection."""
    lower = head.routing
    connection = lower.get("connection")
    proxy = lower.get("proxy-connection")
    if not connection and not proxy:  # most messages: no option listed, the version decides
        return head.version == "1.1"
    tokens = _tokens(connection) if connection else set()
    if proxy:
        tokens |= _tokens(proxy)
    if head.version == "1.1":
        return "close" not in tokens
    return head.version == "1.0" and "keep-alive" in tokens


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


def request_head(request: Head, dest: Destination, route: Route, via: str) -> Outbound:
    """The head to send on: hop-by-hop fields dropped (RFC 9110 §7.6.1), ``Host`` set for the
    destination, the body's chunking kept, ``Via`` added."""
    routing = request.routing  # all it reads of a request that goes on as parsed
    if dest.authority is None and "host" in routing and HOP_BY_HOP.isdisjoint(routing):
        # Nothing dropped, nothing added but Via (no Connection, no Transfer-Encoding: no
        # upgrade, no chunking): the fields as parsed, joined in C — the bytes fields() makes
        # of their decoded form (latin-1 round-trips), without a format per field.
        lines = request.wire  # the fields' lines, as parsed
        via_line = f"Via: {request.version} {via}\r\n\r\n".encode("latin-1")
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
