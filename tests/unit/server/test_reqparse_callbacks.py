"""reqparse (issue 15): the parse's callbacks against e115ebc's, differentially.

llhttp's ``on_message_begin``, ``on_url`` and ``on_status`` are C methods now (a list's ``pop``
and ``append``), not Python ones: what a message leaves behind (its target or reason, its
fields, its trailers) is cleared as it ends, and :attr:`Parsed.in_head` is read after each
parse from the list ``on_message_begin`` empties. e115ebc's :class:`Parsed` is kept below
VERBATIM (only renamed ``_OldParsed``; nothing imported from a baseline checkout), and both are
fed the same generated requests and answers — pipelined, with bodies, trailers, upgrades,
errors, a reason phrase or none, stray bytes after an answer — cut at every byte and a byte at
a time, comparing every event, every head, what ``feed`` and ``again`` return, and the state
the exchange reads after each read (``in_head``, ``in_body``, ``midway``, ``fed``, ``tail``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from httptools import (
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
    HttpResponseParser,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.server.http_heads import (
    FRAMING_KIND,
    Head,
    PlainHead,
    RequestHead,
    keeps_alive,
    routing_of,
)
from ravenproxy.server.http_messages import Parsed

from .bd24_requests import offered
from .flat_events import FlatParsed
from .test_srvhttp_requests import _answers, _conversations, _view

# -- e115ebc's http_messages from REPLAY_MAX on, verbatim (Parsed and _Stop renamed) ------------

REPLAY_MAX = 2 * 1024
"""A request this long at most is kept to be recognised when it comes again: an idle kept-alive
connection holds it (a scrape or a probe is a few hundred bytes; an idle front connection's
whole budget is ~8 KiB)."""

_framing_kind = FRAMING_KIND.get
_new_request_head = object.__new__
"""``_new_request_head(RequestHead)``: a head made by object's C constructor, its slots stored
by the parse (:meth:`Parsed.on_headers_complete`): no Python ``__init__`` call, once a request
that differs."""
_name_value = b": ".join
"""A field as parsed, ``(name, value)``, on its line (without the line's end)."""

_HTTP11_END = b" HTTP/1.1\r\n"
"""The end of an HTTP/1.1 request line."""

_STATUS_LINES: dict[int, bytes] = {}
"""``HTTP/1.1 200 `` by status: a response's :attr:`Head.wire` begins with it."""
_status_line = _STATUS_LINES.get

_METHOD_NAMES: dict[bytes, str] = {}
"""A request's method by llhttp's name for it (llhttp names the methods it knows: a few dozen
at most are kept), decoded once."""
_method_name = _METHOD_NAMES.get

_ShapeKey = tuple[int, bytes, tuple[bytes, ...]]
_SHAPES: dict[_ShapeKey, tuple[bytes, bool]] = {}
"""A response head's template and plainness by its shape — status, reason phrase, field names in
order (:func:`_shaped`): shared by every target connection (the targets are alike: kubelets,
exporters)."""
_shape_of = _SHAPES.get
SHAPES_MAX = 512
"""Shapes kept at most (a target whose names change per answer makes a shape per answer)."""
SHAPE_MAX = 1024
"""A longer template is not kept (``SHAPES_MAX * SHAPE_MAX`` bounds what they hold)."""
_NO_FIELDS: tuple[tuple[bytes, ...], tuple[bytes, ...]] = ((), ())


def _shaped(key: _ShapeKey) -> tuple[bytes, bool]:
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
    if len(_SHAPES) < SHAPES_MAX and len(template) <= SHAPE_MAX:
        _SHAPES[key] = shape
    return shape


# Event kinds of :class:`Parsed`.
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
        "_line",
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
        self._line: bytes | None = None
        """The bytes fed when a request may have begun at their start (the parser between
        messages): where its request line ends with `` HTTP/1.1`` if it is the minimal
        ``method SP target SP version`` (:meth:`on_headers_complete`), the version known
        without asking llhttp for it (``get_http_version``: a new string formatted, per
        request that differs)."""
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
        # (A response is never kept: not asked whether it came whole.)
        fresh = not self._response and not events and not self.in_head and not self.in_body
        if not self.in_body:
            self.fed += len(data)
            if self.in_head:
                pass
            elif self._response:
                self._version = "1.1" if data.startswith(b"HTTP/1.1 ") else None
            else:
                self._line = data
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
        if fresh and len(events) == 2 and len(data) <= REPLAY_MAX:
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
        kind: Any = self._kind()  # the status (int) or the method (bytes)
        version = self._version
        raw = None
        if version is not None:  # only the message whose start it saw
            self._version = None
        else:
            line = self._line
            # A request that began at the start of ``line`` (llhttp skips CRLFs before a
            # request: a shifted start cannot match): its request line's first CRLF is at
            # least len(method SP target SP HTTP/x.y) in, and only there when it ends with
            # `` HTTP/1.1`` (no CR or LF before its end), so a match at that place is
            # llhttp's version. Once: a next request in the same bytes asks llhttp.
            if line is not None:
                self._line = None
                end = len(kind) + len(self._start) + 1
                if line.startswith(_HTTP11_END, end):
                    version = "1.1"
                    raw = line[: end + 11]  # the request line as it came (RequestHead.line)
            if version is None:
                version = self.parser.get_http_version()
        last = self._last
        if (
            last is not None
            and last[0] == self._start
            and last[2] == kind
            and last[3] == version
            and last[1] == self._fields
        ):
            head = last[4]
        elif self._response:
            # A response's head, here and not in a method of its own: once an answer that
            # differs from the last. Its wire is its shape's template with its values
            # (_shaped): a target's answers differ in their values (a Date, a Content-Length),
            # seldom in their status, reason or names.
            fields, reason = self._fields, self._start
            # (name, value) pairs: zip's strict= would only add a keyword call (~1 500 instr.)
            names, values = zip(*fields) if fields else _NO_FIELDS  # noqa: B905
            key = (kind, reason, names)
            shape = _shape_of(key) or _shaped(key)
            wire, plain = shape[0] % values, shape[1]
            # llhttp's status is 3 digits: the head's size on the wire is that of ``wire``.
            if plain:  # what PlainHead is
                head = PlainHead(reason, kind, version, fields, len(wire), wire)
            else:
                start = reason.decode("latin-1")
                head = Head(start, "", kind, version, fields, len(wire), wire)
            self._last = (reason, fields, kind, version, head)
        else:
            # A request's head, here and not in a method of its own (once a request that
            # differs), made without RequestHead.__init__'s call: its stores.
            fields, target = self._fields, self._start
            # Its fields on their lines as parsed, joined in C: request_head sends them on
            # when it drops none, and their length is the fields' part of the head's size
            # ("name: value" and a line end each: the lines' length and the last line's end).
            if last is not None and fields and last[1] == fields:
                # The last request's fields again (a keep-alive client's requests differ in
                # their target, seldom in their fields): its lines and routing fields are these.
                lines, routing = last[4].wire, last[4].routing
            else:
                lines = b"\r\n".join(map(_name_value, fields)) if fields else b""
                routing = routing_of(fields)
            method = _method_name(kind) or _METHOD_NAMES.setdefault(
                kind, kind.decode("ascii", "replace")
            )
            head = _new_request_head(RequestHead)
            head.start, head.target, head.version, head.line = (
                method,
                target.decode("latin-1"),
                version,
                raw,  # the request line as it came, if known
            )
            # The size: the fields' and the request line's (method, target, "HTTP/1.1", two
            # spaces and its end: 14).
            size = len(lines) + 2 if fields else 0
            head.fields, head.size, head.wire = fields, size + len(method) + len(target) + 14, lines
            head.routing = routing
            self._last = (target, fields, kind, version, head)
        self.events.append((HEAD, head))
        if self.bodiless and head.status >= 200:
            # llhttp cannot be told a response answers a HEAD: the parse ends here, and the
            # connection is not used again.
            self.in_body = False
            self.events.append((END, []))
            raise _OldStop

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


# -- the comparison -------------------------------------------------------------------------------


def _state(parsed: Parsed | _OldParsed) -> tuple[object, ...]:
    return (parsed.in_head, parsed.in_body, parsed.midway, parsed.fed, parsed.tail)


def _both_fed(reads: list[bytes], *, response: bool, bodiless: bool = False) -> None:
    """``reads`` fed to a new and an old parser alike (a request whole again through
    ``again`` first, as the exchange does): the same results, events and state after each."""
    new, old = (
        FlatParsed(response=response, max_tail=256),
        _OldParsed(response=response, max_tail=256),
    )
    new.bodiless = old.bodiless = bodiless
    last_new: Head | None = None
    last_old: Head | None = None
    for data in reads:
        if not response and last_new is not None and last_old is not None:
            # (The new again makes a near request's head too: queued as feed queues it.)
            assert offered(new, data, last_new) == old.again(data, last_old)
        if not old.events:  # (again took it: its END queued, nothing fed)
            assert (None if new.events else new.feed(data)) == old.feed(data)
        else:
            assert len(new.events) == 1 and old.events
        views = [_view(e) for e in new.events]
        assert views == [_view(e) for e in old.events]
        assert _state(new) == _state(old)
        for parsed in (new, old):
            heads = [v for k, v in parsed.events if k == HEAD]
            if heads:
                assert isinstance(heads[-1], Head)
                if parsed is new:
                    last_new = heads[-1]
                else:
                    last_old = heads[-1]
            parsed.events.clear()


def _cuts(data: bytes) -> list[list[bytes]]:
    """``data`` whole, in two reads cut at each byte, and a byte at a time."""
    ways = [[data], [data[i : i + 1] for i in range(len(data))]]
    ways += [[data[:i], data[i:]] for i in range(1, len(data))]
    return ways


_ODD_REQUESTS = st.sampled_from(
    [
        b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n",
        b"\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n",  # a leading empty line
        b"GET /c HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
        b"GET /d HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n",  # obs-fold: refused
        b"GET /e HTTP/1.1\nHost: h\n\n",  # bare LF: refused
        b"POST /f HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2;ext=1\r\nab\r\n0\r\nX-Sum: 3\r\nX-Two: 2\r\n\r\n",  # an extension and trailers
        b"POST /g HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
        b"GET /h HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nraw",
        b"CONNECT edge-1:22 HTTP/1.1\r\nHost: edge-1:22\r\n\r\nSSH-2.0",
        b"HEAD /i HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        b"GET /j HTTP/1.1\r\nHost: h\r\n\r\nGE",  # a next request begun in its method
        b"GET /k?n=1 HTTP/1.1\r\nHost: h\r\nUser-Agent: u\r\n\r\n",
        b"GET /k?n=2 HTTP/1.1\r\nHost: h\r\nUser-Agent: u\r\n\r\n",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ODD_REQUESTS, min_size=1, max_size=3))
def test_requests_cut_at_every_byte_are_parsed_as_e115ebc_did(requests: list[bytes]) -> None:
    for reads in _cuts(b"".join(requests)):
        _both_fed(reads, response=False)


@settings(max_examples=300, deadline=None)
@given(_conversations())
def test_conversations_are_parsed_as_e115ebc_did(reads: list[bytes]) -> None:
    _both_fed(reads, response=False)
    for cut in _cuts(b"".join(reads))[2:]:
        _both_fed(cut, response=False)


_ODD_ANSWERS = st.sampled_from(
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 204\r\nDate: D\r\n\r\n",  # no reason phrase: no on_status
        b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n",  # an empty one
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nT: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx",  # refused
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nws",
        b"HTTP/1.1 2",  # stray bytes of a next answer
        b"\r\nHTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ODD_ANSWERS | _answers(), min_size=1, max_size=3), st.booleans())
def test_answers_cut_at_every_byte_are_parsed_as_e115ebc_did(
    answers: list[bytes], bodiless: bool
) -> None:
    for reads in _cuts(b"".join(answers)):
        _both_fed(reads, response=True, bodiless=bodiless)


def test_a_reason_or_target_is_the_messages_own_not_the_last_ones() -> None:
    """Cleared as a head ends (no Python on_message_begin resets it): an answer without a
    reason phrase (llhttp then makes no on_status call) has none after one that had one, and
    a target split across reads is whole."""
    parsed = FlatParsed(response=True)
    parsed.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 204\r\n\r\n")
    heads = [v for k, v in parsed.events if k == HEAD]
    assert [(h.status, h.start) for h in heads] == [(200, "OK"), (204, "")]  # type: ignore[attr-defined]
    request = Parsed(response=False)
    request.feed(b"GET /a")
    assert request.in_head and request.midway
    request.feed(b"bc HTTP/1.1\r\nHost: h\r\n\r\nGE")
    assert request.in_head  # the next request's method begun
    request.feed(b"T /d HTTP/1.1\r\nHost: h\r\n\r\n")
    targets = [v.target for k, v in request.events if k == HEAD]  # type: ignore[attr-defined]
    assert targets == ["/abc", "/d"] and not request.in_head


def test_trailers_are_told_from_fields_inside_the_body() -> None:
    parsed = Parsed(response=False)
    parsed.feed(
        b"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\na\r\n0\r\nX-Sum: 1\r\n\r\nGET /n HTTP/1.1\r\nHost: n\r\n\r\n"
    )
    events = list(parsed.events)
    assert events[2] == (END, [("X-Sum", "1")])
    second = events[3][1]
    assert isinstance(second, Head) and second.fields == [(b"Host", b"n")]
    assert events[4] == (END, [])


def test_messages_without_trailers_share_one_empty_list_that_cannot_change() -> None:
    """Their END events are one object (none made per message): its list refuses a change, so
    no reader can give one message's trailers to the next."""
    parsed = FlatParsed(response=True)
    parsed.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" * 2)
    ends = [e for e in parsed.events if e[0] == END]
    assert len(ends) == 2 and ends[0] is ends[1] and ends[0] == (END, [])
    trailers = ends[0][1]
    for change in (
        lambda: trailers.append(("X", "1")),
        lambda: trailers.extend([("X", "1")]),
        lambda: trailers.insert(0, ("X", "1")),
        lambda: trailers.__iadd__([("X", "1")]),
        lambda: trailers.__setitem__(slice(0, 0), [("X", "1")]),
    ):
        with pytest.raises(TypeError):
            change()
    assert trailers == [] and not trailers
