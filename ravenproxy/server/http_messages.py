"""HTTP/1.1 messages as :class:`~ravenproxy.server.exchange.Exchange` sees them: parsed by
llhttp (through ``httptools``) into queued events (:class:`Parsed`, :mod:`.http_events`). What
is written back (heads sent on, chunks) is :mod:`.http_rewrite`'s; a response head's wire is made
from its shape's template (:mod:`.answer_shapes`).

The parsers run ahead of the exchange (a pipelined request is parsed while the one before it is
answered): what they parse is queued as events and taken when the exchange is ready for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from httptools import (
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
    HttpResponseParser,
)

from ravenproxy.server.answer_shapes import shape_of as _shape_of
from ravenproxy.server.answer_shapes import shaped as _shaped
from ravenproxy.server.http_events import DATA as DATA  # (the events' kinds, as they were)
from ravenproxy.server.http_events import END as END
from ravenproxy.server.http_events import ENDED as _ENDED
from ravenproxy.server.http_events import EOF as EOF
from ravenproxy.server.http_events import ERROR as ERROR
from ravenproxy.server.http_events import HEAD as HEAD
from ravenproxy.server.http_heads import Head, RequestHead, keeps_alive, routing_of
from ravenproxy.server.near_answers import NearAnswers, Plan, plan_of
from ravenproxy.server.parsed_answers import ParsedPlainHead as ParsedPlainHead
from ravenproxy.server.parsed_answers import paired

REPLAY_MAX = 2 * 1024
"""A request this long at most is kept to be recognised when it comes again: an idle connection
holds it (a scrape or a probe is a few hundred bytes; an idle front connection's ~8 KiB)."""

_new_head = object.__new__
"""``_new_head(RequestHead)``: a head made by object's C constructor, its slots stored by the
parse (:meth:`Parsed.on_headers_complete`): no ``__init__`` call, once a head that differs."""
_name_value = b": ".join
"""A field as parsed, ``(name, value)``, on its line (without the line's end)."""

_HTTP11_END = b" HTTP/1.1\r\n"
"""The end of an HTTP/1.1 request line."""


_METHOD_NAMES: dict[bytes, str] = {}
"""A request's method by llhttp's name for it (llhttp names the methods it knows: a few dozen
at most are kept), decoded once."""
_method_name = _METHOD_NAMES.get


class _Stop(Exception):
    """Raised from a parser callback to end the parse (a response that has no body)."""


class Parsed(NearAnswers):
    """The callbacks of one llhttp parser, turning what it parses into queued events:
    ``(HEAD, Head)``, ``(DATA, bytes)``, ``(END, trailers)``, ``(ERROR, message)``,
    ``(EOF, None)``; a response parser's answer read without llhttp (:mod:`.near_answers`) as
    one ``(ANSWER, Answer)`` (:data:`.near_answers.Answer`)."""

    __slots__ = (
        "_again",
        "_between",
        "_kind",
        "_last",
        "_line",
        "_names",
        "_plan",
        "_recent",
        "_replay_head",
        "_response",
        "_shape",
        "_starts",
        "_values",
        "_version",
        "bodiless",
        "events",
        "fed",
        "in_body",
        "in_head",
        "max_tail",
        "on_message_begin",
        "on_status",
        "on_url",
        "parser",
        "tail",
    )

    def __init__(self, *, response: bool, max_tail: int = 64 * 1024) -> None:
        self.events: deque[tuple[int, object]] = deque()
        self._between: list[None] = [None]
        """Empty from a message's first byte (llhttp's ``on_message_begin``, which empties it)
        to its head's end (:meth:`on_headers_complete`, which refills it): :attr:`in_head` is
        read from it after each parse."""
        self.on_message_begin: Callable[[], None] = self._between.pop
        """llhttp's callback at a message's first byte: a C method, no Python call (once a
        message). What a message leaves behind is cleared as it ends (:meth:`on_headers_complete`,
        :meth:`on_message_complete`), not as the next begins."""
        self._starts: list[bytes] = []
        """The request-target's or reason phrase's pieces (one, unless a read ended in it)."""
        self.on_url: Callable[[bytes], None] = self._starts.append
        self.on_status: Callable[[bytes], None] = self._starts.append
        """llhttp's callbacks for the target (a request) or the reason (a response): C methods,
        no Python call (once a message); taken and emptied by :meth:`on_headers_complete`. Set
        before the parser is made, as ``on_message_begin``: httptools looks them up then."""
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
        self._names: list[bytes] = []
        self._values: list[bytes] = []
        """The names and values of the fields llhttp reported since the last head or message
        ended, in order (two appends a field, no pair made: a response's names are its shape's
        key and its values its template's arguments): the head's (taken by
        :meth:`on_headers_complete`), then its trailers (by :meth:`on_message_complete`)."""
        self._last: tuple[bytes, list[bytes], list[bytes], object, str, Head] | None = None
        """The last head as parsed (start, names, values, method or status, version) and its
        :class:`Head`: the same head again (a keep-alive client polling one URL, a target's
        same answer) is the same object, and what was derived from it can be reused. (An answer
        read by :attr:`_plan` is not parsed: it leaves this as it was, :attr:`_recent`.)"""
        self._shape: tuple[bytes, bool, tuple[bytes, ...]] = (b"", False, ())
        """The last answer's template, plainness and names (:mod:`.answer_shapes`), set with
        :attr:`_last` (a response's), taken when the next has its status, reason and names."""
        self._again: tuple[bytes, Head, bytes | None, bytes] | None = None
        """The last bytes fed, when one whole request that left the parser as it found it, its
        head (the same bytes again are it again, if :meth:`_replayable` says so when asked), and
        the bytes' lead and tail around its target (:meth:`again`'s; None: not yet)."""
        self._plan: Plan | None = None
        """How an answer of the last answer's layout is read (:mod:`.near_answers`), when llhttp
        parsed two heads of its shape and length in a row (or one twice), framed by their
        Content-Length alone (else None): set by a response's head (kept for the later heads of
        its layout and version), cleared by an error."""
        self._recent: tuple[Head, bytes, tuple[bytes, ...], int] | None = None
        """The last answer read by :attr:`_plan` whose values were cut (:mod:`.near_answers`):
        the plan's head, its head's bytes, its values as cut and its body's length (an answer
        whose head is those bytes again takes them; one under another plan does not)."""
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

    def again(self, data: bytes, head: Head) -> Head | None:
        """:meth:`feed`'s head of ``data`` taken at once, END queued, when ``head`` is the kept
        request's (:attr:`_again`) and no event waits: ``head`` itself when ``data`` is its
        bytes again, whole and bodiless (replayable); a head made without llhttp (the last
        one's fields) when ``data`` is them but for an origin-form target; else None, nothing
        fed, and the kept request dropped once the bytes were compared (feed's)."""
        again = self._again
        if again is None or again[1] is not head or self.events:
            return None
        if data == again[0]:  # the last request again (a scrape, a probe): it goes on
            if not (self.in_head or self.in_body) and (
                head is self._replay_head or self._replayable(head)
            ):
                self.events.append(_ENDED)
                self.fed = 0
                return head
            self._again = None
            return None
        self._again = None  # kept anew below, when near
        last, kept, lead, tail = head, self._last, again[2], again[3]
        line = last.line  # the last request line as it came (None: not known whole)
        if line is None or kept is None or kept[5] is not last or type(data) is not bytes:
            return None
        if lead is None:  # the kept bytes lined up with their head's line, once a parse:
            whole = again[0]  # not when kept after CRLFs llhttp skipped (bytes shifted)
            if whole[: len(line)] != line:
                return None
            # The method and space; from the target's end on (the line ends " HTTP/1.1" CRLF).
            lead, tail = line[: len(last.start) + 1], whole[len(line) - 11 :]
        method, end = len(lead), len(data) - len(tail)  # the new target's start and end
        if end <= method or data[end:] != tail or data[:method] != lead:
            return None
        if self.in_head or self.in_body:
            return None
        target = data[method:end]
        # As llhttp reads it: origin-form, visible ASCII (anywhere in a path, query, fragment);
        # any other byte goes to llhttp (three C calls: a regular expression is ~1 900 more).
        try:
            text = target.decode("ascii")
        except UnicodeDecodeError:
            return None
        if (
            target[0] != 47  # "/" (an index, not a slice: ~300 fewer)
            or " " in text
            or not text.isprintable()  # (ASCII: 0x20-0x7E)
            or not (last is self._replay_head or self._replayable(last))  # asked last
        ):
            return None
        made = _new_head(RequestHead)  # its line ends 11 bytes past its target
        made.start, made.target, made.version = last.start, text, last.version
        made.line, made.fields, made.wire = data[: end + 11], last.fields, last.wire
        made.routing, made.size = last.routing, last.size + end + 11 - len(line)
        self._last = (target, kept[1], kept[2], kept[3], kept[4], made)
        self._again = (data, made, lead, tail) if len(data) <= REPLAY_MAX else None
        self._replay_head = made  # _replayable's answer: its method, version, routing are these
        self.events.append(_ENDED)
        return made

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
        again = self._again
        if again is not None:
            # The last request again (a scrape, a probe) or but for its target (a next URL):
            # the parser would make the same two events (the head but for its target).
            if data == again[0]:
                head = self._repeated(data)
                if head is not None:
                    events.append((HEAD, head))
                    events.append(_ENDED)
                    self.fed = 0
                    return None
            elif (head := self.again(data, again[1])) is not None:  # its END queued
                events.appendleft((HEAD, head))  # (no event waited)
                self.fed = 0
                return None
            # The parser leaves that state: what it held is remembered anew (or not at all).
            self._again = None
        if self.tail > self.max_tail:  # refused (below): nothing more goes into the parser
            return None
        # A request may begin at the start of ``data`` (the parser between messages, no event
        # waiting); an answer there may be of the last one's shape (_answered).
        fresh = False
        queued = len(events)
        if not self.in_body:
            self.fed += len(data)
            if self.in_head:
                pass
            elif self._response:
                # (The last shape's plan: one compare, not a match, for answers that differ.)
                if self._plan is not None and (took := self._answered(data)):
                    # As llhttp: the next message's bytes not counted, its version asked.
                    self.fed = self.tail = 0
                    if took == len(data):
                        return None
                    data = data[took:]
                    self._version = None
                else:
                    # (A slice compared: startswith parses its arguments by format, ~200 more.)
                    self._version = "1.1" if data[:9] == b"HTTP/1.1 " else None
            else:
                self._line = data
                fresh = not events
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            return data[exc.args[0] :]
        except HttpParserError as exc:
            # llhttp takes nothing more: no answer taken past it (_answered)
            self._last = self._plan = None
            if not isinstance(exc.__context__, _Stop):
                events.append((ERROR, str(exc) or type(exc).__name__))
            return None
        finally:
            # A head begun and not ended (the callbacks keep _between, not in_head: one C
            # call, no Python one, at a message's start).
            self.in_head = not self._between
        if self.in_body and len(events) == queued:  # inside a body, and nothing of it came
            self.tail += len(data)
            if self.tail > self.max_tail:
                events.append((ERROR, f"chunk framing or trailers over {self.max_tail} bytes"))
        elif fresh and len(events) == 2 and events[1] is _ENDED and not self.in_head:
            # One whole request that left the parser as it found it (no body event, nothing of
            # a next message begun) is kept: the same bytes again are that request again.
            # (Whether it may be replayed is asked then: _replayable.) Its events are its HEAD
            # and the shared END of a message without trailers: what a fresh parse queues
            # first is a HEAD (no body is begun before one; an error returned above), and after
            # that END the parser is in no body (a next message's body follows its HEAD: a
            # third event). Here, not in a method of its own: once a request that differs.
            parsed = events[0][1]
            assert isinstance(parsed, Head)
            if len(data) <= REPLAY_MAX:
                self._again = (bytes(data), parsed, None, b"")
        return None

    # -- llhttp's callbacks ---------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        # A field of the head or, once the head has taken its own, a trailer: which one is told
        # by the list's taker, not asked per field.
        self._names.append(name)
        self._values.append(value)

    def on_headers_complete(self) -> None:
        self.in_body, self.fed, self.tail = True, 0, 0
        self._between.append(None)  # no head begun (in_head, after the parse)
        # The head's start and fields taken, the next message's left empty (no reset as it
        # begins: on_message_begin is a C call).
        starts, names, values = self._starts, self._names, self._values
        start = b"".join(starts)  # the one piece itself, most often
        starts.clear()
        self._names, self._values = [], []
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
                end = len(kind) + len(start) + 1
                # (A slice compared: startswith with a position parses its arguments by format.)
                if line[end : end + 11] == _HTTP11_END:
                    version = "1.1"
                    raw = line[: end + 11]  # the request line as it came (RequestHead.line)
            if version is None:
                version = self.parser.get_http_version()
        last = self._last
        # The last head's start, kind and names again (an answer: its shape), asked once for
        # the whole head's reuse and the template's.
        like = (
            last
            if last is not None and last[0] == start and last[3] == kind and last[1] == names
            else None
        )
        if like is not None and like[4] == version and like[2] == values:
            head = like[5]
            plan = self._plan
            if self._response and (plan is None or plan[5] is not head):
                # Its head twice: feed asks whether the next is of its layout.
                self._plan = plan_of(head, self._shape[0])
        elif self._response:
            # A response's head, here and not in a method of its own: once an answer that
            # differs from the last. Its wire is its shape's template with its values
            # (_shaped): a target's answers differ in their values (a Date, a Content-Length),
            # seldom in their status, reason or names (the last one's: no key made and hashed).
            reason = start
            if like is not None:
                template, plain, shown = self._shape
            else:
                shown = tuple(names)
                key = (kind, reason, shown)
                template, plain = _shape_of(key) or _shaped(key)
                self._shape = (template, plain, shown)
            wire = template % tuple(values)
            # llhttp's status is 3 digits: the head's size on the wire is that of ``wire``.
            if plain:  # what PlainHead is
                # Made by object's C constructor and its stores: no Python __init__ call; its
                # fields are paired when asked (PlainHead.fields).
                made = _new_head(ParsedPlainHead)
                made.reason, made.status, made.version = reason, kind, version
                made.names, made.values, made.size, made.wire = shown, values, len(wire), wire
                head = made
            else:
                text = reason.decode("latin-1")
                head = Head(text, "", kind, version, paired(names, values), len(wire), wire)
            self._last = (reason, names, values, kind, version, head)
            # Its shape twice in a row, as long (its layout, as a rule): feed asks whether the
            # next is of it. (Values whose lengths change answer to answer make no plan; one
            # made for a head of the layout reads the others: not made again per answer that
            # goes to llhttp, a large one's.)
            plan = self._plan
            if like is None or len(like[5].wire) != len(wire):
                self._plan = None
            elif plan is None or len(plan[5].wire) != len(wire) or plan[5].version != version:
                self._plan = plan_of(head, template)  # (a version other than the plan's head's:
                # asked again, length_field's)
        else:
            # A request's head, here and not in a method of its own (once a request that
            # differs), made without RequestHead.__init__'s call: its stores.
            target = start
            # Its fields on their lines as parsed, joined in C: request_head sends them on
            # when it drops none, and their length is the fields' part of the head's size
            # ("name: value" and a line end each: the lines' length and the last line's end).
            if last is not None and names and last[2] == values and last[1] == names:
                # The last request's fields again (a keep-alive client's requests differ in
                # their target, seldom in their fields): its fields, lines and routing fields
                # are these.
                kept = last[5]
                fields, lines, routing = kept.fields, kept.wire, kept.routing
            else:
                fields = paired(names, values)
                lines = b"\r\n".join(map(_name_value, fields)) if fields else b""
                routing = routing_of(fields)
            method = _method_name(kind) or _METHOD_NAMES.setdefault(
                kind, kind.decode("ascii", "replace")
            )
            head = _new_head(RequestHead)
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
            self._last = (target, names, values, kind, version, head)
        self.events.append((HEAD, head))
        if self.bodiless and head.status >= 200:
            # llhttp cannot be told a response answers a HEAD: the parse ends here, and the
            # connection is not used again.
            self.in_body = False
            self.events.append(_ENDED)
            raise _Stop

    def on_body(self, body: bytes) -> None:
        self.events.append((DATA, body))
        self.tail = 0

    def on_message_complete(self) -> None:
        self.in_body = False
        names = self._names  # reported since the head took its own: trailers
        # Most messages have none: no decoding comprehension run for them.
        if names:
            values = self._values
            self._names, self._values = [], []  # the next message's (no reset as it begins)
            self.events.append(
                (
                    END,
                    [
                        (k.decode("latin-1"), v.decode("latin-1"))
                        for k, v in zip(names, values)  # noqa: B905 (as many: on_header's)
                    ],
                )
            )
        else:
            self.events.append(_ENDED)
