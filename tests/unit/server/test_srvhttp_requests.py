"""srvhttp (issue 15): a request's and an answer's parse against 3466b61's, differentially.

A request that differs from the last now takes its HTTP version from its own bytes when its
request line is ``method SP target SP HTTP/1.1`` and began a read (llhttp's getter formats a
string per request), its method's name decoded once per method, and its fields' lines and
routing fields from the last head when its fields are the last head's (a keep-alive client's
requests differ in their target). 3466b61's :class:`Parsed` is kept below verbatim (renamed
``_OldParsed``; nothing imported from a baseline checkout) and both are fed the same generated
conversations — versions 1.0/1.1 and others llhttp takes or refuses, leading CRLFs, extra
spaces, repeated and changed fields, bodies, pipelining, every split of the bytes — comparing
every event, every head's fields, size, wire, routing and decoded forms, and what ``feed``
returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser, HttpResponseParser
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.server import http_messages
from ravenproxy.server.http_heads import (
    FRAMING_KIND,
    Head,
    PlainHead,
    RequestHead,
    keeps_alive,
)
from ravenproxy.server.http_messages import Parsed
from tests.helpers import examples

# -- 3466b61's Parsed, verbatim (only renamed) ----------------------------------------------------

REPLAY_MAX = 2 * 1024
_framing_kind = FRAMING_KIND.get
_name_value = b": ".join
_STATUS_LINES: dict[int, bytes] = {}
_status_line = _STATUS_LINES.get
HEAD, DATA, END, ERROR, EOF = range(5)


class _OldStop(Exception):
    """Raised from a parser callback to end the parse (a response that has no body)."""


class _OldParsed:
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
            if not isinstance(exc.__context__, _OldStop):
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
            raise _OldStop

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


# -- the conversations ------------------------------------------------------------------------

_METHODS = st.sampled_from([b"GET", b"HEAD", b"POST", b"DELETE", b"OPTIONS", b"PUT"])
_TARGETS = st.sampled_from([b"/ping", b"/metrics", b"/", b"/a?b=c", b"/x%20y"]) | st.builds(
    lambda n: b"/ping?n=%d" % n, st.integers(0, 10**6)
)
_VERSIONS = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.1", b"HTTP/2.0", b"HTTP/0.9"])
_FIELDS = st.lists(
    st.sampled_from(
        [
            b"Host: edge-1:9100",
            b"host: edge-1:9100",
            b"HOST: edge-2",
            b"User-Agent: latency",
            b"Accept: */*",
            b"Connection: close",
            b"Connection: keep-alive",
            b"Proxy-Connection: keep-alive",
            b"Via: 1.1 other",
            b"X-Tunnel-Proxy-Host: edge-1:10250",
            b"Authorization: Bearer abc",
            b"Content-Length: 3",
            b"Transfer-Encoding: chunked",
            b"Accept:  */*  ",
            b"X-Odd: \xe9t\xe9",
        ]
    ),
    max_size=5,
)


@st.composite
def _requests(draw: st.DrawFn) -> bytes:
    """One request (a body when its fields frame one), sometimes with llhttp's oddities."""
    sep = draw(st.sampled_from([b" ", b" ", b" ", b"  "]))
    line = draw(_METHODS) + sep + draw(_TARGETS) + b" " + draw(_VERSIONS)
    fields = draw(_FIELDS)
    head = b"\r\n".join([line, *fields]) + b"\r\n\r\n"
    body = b""
    if b"Transfer-Encoding: chunked" in fields:
        body = b"3\r\nabc\r\n0\r\n\r\n"
    elif b"Content-Length: 3" in fields:
        body = b"xyz"
    return draw(st.sampled_from([b"", b"", b"", b"\r\n"])) + head + body


@st.composite
def _conversations(draw: st.DrawFn) -> list[bytes]:
    """A keep-alive conversation cut into reads: requests often repeat the last one's fields
    with another target (what the new path reuses), or are repeated whole."""
    requests: list[bytes] = []
    for _ in range(draw(st.integers(1, 5))):
        if requests and draw(st.booleans()):
            last = requests[-1]
            line_end = last.index(b"\r\n", 2) if last.startswith(b"\r\n") else last.index(b"\r\n")
            target = draw(_TARGETS)
            parts = last[:line_end].split(b" ")
            if len(parts) == 3:
                requests.append(b" ".join([parts[0], target, parts[2]]) + last[line_end:])
                continue
        requests.append(draw(_requests()))
    data = b"".join(requests)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    if draw(st.booleans()):  # one request a read, as most clients send
        return requests
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True) if data[a:b]]


def _view(event: tuple[int, object]) -> object:
    kind, value = event
    if kind != HEAD:
        return event
    assert isinstance(value, Head)
    return (
        kind,
        "PlainHead" if value.plain else type(value).__name__,  # heads: ParsedPlainHead too
        value.start,
        value.target,
        value.status,
        value.version,
        value.fields,
        value.size,
        value.wire,
        value.routing,
        value.headers,
        value.lower,
        keeps_alive(value),
    )


@settings(max_examples=examples(600), deadline=None)
@given(_conversations())
def test_a_request_parse_is_3466b61s(reads: list[bytes]) -> None:
    assert (HEAD, DATA, END, ERROR, EOF) == (
        http_messages.HEAD,
        http_messages.DATA,
        http_messages.END,
        http_messages.ERROR,
        http_messages.EOF,
    )
    new, old = Parsed(response=False, max_tail=8192), _OldParsed(response=False, max_tail=8192)
    for data in reads:
        assert new.feed(data) == old.feed(data)
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events]
        assert (new.in_head, new.in_body, new.fed) == (old.in_head, old.in_body, old.fed)
        new.events.clear()
        old.events.clear()


class _Getter:
    """llhttp's parser, counting ``get_http_version`` calls."""

    def __init__(self, parser: HttpRequestParser) -> None:
        self.parser, self.asked = parser, 0
        self.feed_data = parser.feed_data

    def get_http_version(self) -> str:
        self.asked += 1
        return str(self.parser.get_http_version())


def _counted() -> tuple[Parsed, _Getter]:
    parsed = Parsed(response=False)
    getter = _Getter(parsed.parser)  # type: ignore[arg-type]
    parsed.parser = getter  # type: ignore[assignment]
    return parsed, getter


def test_an_http11_request_line_gives_its_version_without_llhttps_getter() -> None:
    parsed, getter = _counted()
    parsed.feed(b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
    assert parsed.events[0][1].version == "1.1"  # type: ignore[union-attr]
    assert getter.asked == 0
    # Not its start (a second request in the read), another version, a split line: llhttp's.
    parsed.feed(
        b"GET /b HTTP/1.1\r\nHost: h\r\n\r\n"
        b"GET /c HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /d HTTP/1.1\r"
    )
    parsed.feed(b"\nHost: h\r\n\r\n")
    versions = [e[1].version for e in parsed.events if e[0] == HEAD]  # type: ignore[union-attr]
    assert versions == ["1.1", "1.1", "1.0", "1.1"]
    assert getter.asked == 2  # /c (not the read's first) and /d (its line began earlier: fed)


def test_the_last_requests_fields_again_share_its_lines_and_routing() -> None:
    parsed = Parsed(response=False)
    parsed.feed(b"GET /a HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n")
    parsed.feed(b"GET /bb HTTP/1.1\r\nHost: h\r\nAccept: */*\r\n\r\n")
    parsed.feed(b"GET /c HTTP/1.1\r\nHost: h2\r\nAccept: */*\r\n\r\n")
    a, b, c = (e[1] for e in parsed.events if e[0] == HEAD)
    assert isinstance(a, RequestHead) and isinstance(b, RequestHead) and isinstance(c, RequestHead)
    assert b.routing is a.routing and b.wire is a.wire and b.size == a.size + 1
    assert c.routing is not a.routing and c.routing == {"host": "h2"}


# -- answers: the response head is built where llhttp completes it (no method call) ------------

_STATUS_LINES_GEN = st.sampled_from(
    [b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 204 ",
     b"HTTP/1.1 304 Not Modified", b"HTTP/1.1 100 Continue", b"HTTP/1.1 200 \xe9t\xe9",
     b"HTTP/1.1 500"]
)  # fmt: skip
_ANSWER_FIELDS = st.lists(
    st.sampled_from(
        [b"Date: Sat, 05 Dec 2026 06:00:00 GMT", b"Content-Type: text/plain",
         b"content-length: 2", b"Connection: close", b"Transfer-Encoding: chunked",
         b"Keep-Alive: timeout=5", b"Server:  x ", b"X-Tunnel-Proxy-Host: a"]
    ),
    max_size=4,
    unique=True,
)  # fmt: skip


@st.composite
def _answers(draw: st.DrawFn) -> bytes:
    fields = draw(_ANSWER_FIELDS)
    head = b"\r\n".join([draw(_STATUS_LINES_GEN), *fields]) + b"\r\n\r\n"
    if b"Transfer-Encoding: chunked" in fields:
        return head + b"2\r\nok\r\n0\r\n" + draw(st.sampled_from([b"", b"T: 1\r\n"])) + b"\r\n"
    return head + (b"ok" if b"content-length: 2" in fields else b"")


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_answers(), min_size=1, max_size=4), st.booleans(), st.data())
def test_an_answer_parse_is_3466b61s(answers: list[bytes], bodiless: bool, data: Any) -> None:
    new, old = Parsed(response=True, max_tail=8192), _OldParsed(response=True, max_tail=8192)
    new.bodiless = old.bodiless = bodiless
    whole = b"".join(answers)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=3)))
    for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True):
        assert new.feed(whole[a:b]) == old.feed(whole[a:b])
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events]
        new.events.clear()
        old.events.clear()
