"""Branch varreq (issue 15): a request that differs from the last one, its parse and its head.

Three cuts, each held here against ebcf73b's code kept verbatim as the oracle (``_Ebc*``: only
renamed; nothing is imported from a baseline checkout):

- :meth:`Parsed.feed` asks the replay memo only when one is kept, tells the fresh request by the
  branch that sets its line, and keeps a whole request by its END being the shared one of a
  message without trailers (ebcf73b unpacked both events and asked four conditions). The oracle
  is ebcf73b's ``feed`` (and callbacks, below) on the same class, over
  test_review24_parse's grammar of llhttp's corners (methods, targets, versions, fields, framings,
  trailers, pipelined messages, upgrades, byte-level mutations), cut at random and a byte at a
  time: the same returns, events, state, and the same request kept for replay (the same bytes,
  the same head), which ``again`` and the next feed read.
- llhttp's ``on_header`` appends to one list, not asking ``in_body`` per field: the head
  takes its fields, and what is reported after it (trailers) is taken by
  ``on_message_complete``. The oracle's ``on_header`` and ``on_message_complete`` are
  ebcf73b's too (its ``_trailers`` list), on the same grammar.
- :class:`RequestHeads` keeps what its tail was made for in slots, not a tuple: the oracle is
  ebcf73b's class over test_reqside_requests' generated conversations (fields repeated and
  changed, versions, destinations retargeted or found anew, routes that change or stay, pod,
  node-name, absolute-URI and tunnel-header routes).
"""

from __future__ import annotations

from typing import Any

from httptools import HttpParserError, HttpParserUpgrade
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.http1 import BadRequest
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import (
    _ENDED,
    END,
    ERROR,
    HEAD,
    REPLAY_MAX,
    Parsed,
    _Stop,
)
from ravenproxy.server.http_rewrite import request_head
from ravenproxy.server.podroutes import Destination, find_destination, same_node
from ravenproxy.server.router import Route
from tests.helpers import examples

from .bd24_requests import Bd24Parsed, RoutedHeads, offered
from .test_exchange import VIA, route
from .test_reqside_requests import _field_sets, _request_bytes, _steps
from .test_review24_parse import _cut, _state, _stream, _view

# -- ebcf73b's Parsed.feed, on_header and on_message_complete, verbatim (their class renamed) --


class _Pairs:
    """heads: the parse gathers a head's names and values (two lists), where ebcf73b's
    ``on_header`` appends a pair to ``_fields``: its pair goes in as both."""

    __slots__ = ("_parsed",)

    def __init__(self, parsed: Parsed) -> None:
        self._parsed = parsed

    def append(self, pair: tuple[bytes, bytes]) -> None:
        self._parsed._names.append(pair[0])
        self._parsed._values.append(pair[1])


class _EbcParsed(Bd24Parsed):
    """(Its ``again``, which ebcf73b's exchange asked first, bd24f07's: reqside folded ``near``
    into it.)"""

    __slots__ = ("_trailers",)

    @property
    def _fields(self) -> _Pairs:
        return _Pairs(self)

    def __init__(self, *, response: bool, max_tail: int = 64 * 1024) -> None:
        self._trailers: list[tuple[bytes, bytes]] = []  # ebcf73b's __init__ made it
        super().__init__(response=response, max_tail=max_tail)

    def near(self, data: bytes, head: Head) -> Head | None:  # not ebcf73b's: it had none
        """ebcf73b parsed every request that was not the last one's bytes again (an exchange
        with this parser feeds it a near request; its ``_again`` is ebcf73b's pair)."""
        return None

    def feed(self, data: bytes) -> bytes | None:
        """Parse ``data``; returns the bytes past an upgrade's (or CONNECT's) head, if one
        ended the HTTP part of the connection. An error is queued after what came before it."""
        events = self.events
        head = self._repeated(data) if self._again is not None else None
        if head is not None:
            # A keep-alive client sending the same request again (a scrape, a probe): the
            # parser is where that request left it, so it would make the same two events.
            events.append((HEAD, head))
            events.append(_ENDED)
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
                # (A slice compared: startswith parses its arguments by format, ~200 more.)
                self._version = "1.1" if data[:9] == b"HTTP/1.1 " else None
            else:
                self._line = data
        queued = len(events)
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            return data[exc.args[0] :]
        except HttpParserError as exc:
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

    def on_header(self, name: bytes, value: bytes) -> None:
        # Trailers come inside a body (in_head is read from _between after the parse only).
        if self.in_body:
            self._trailers.append((name, value))
        else:
            self._fields.append((name, value))

    def on_message_complete(self) -> None:
        self.in_body = False
        trailers = self._trailers
        # Most messages have none: no decoding comprehension run for them.
        if trailers:
            self._trailers = []  # the next message's (no reset as it begins)
            self.events.append(
                (END, [(k.decode("latin-1"), v.decode("latin-1")) for k, v in trailers])
            )
        else:
            self.events.append(_ENDED)


# -- ebcf73b's RequestHeads, verbatim (only renamed) ---------------------------------------------


class _EbcRequestHeads:
    """:func:`request_head` for one client connection's requests (``via``: the server's
    token), the part after the request line kept: a request with the last one's fields (the
    parse's same :attr:`Head.wire` object) and version, its destination and route the same
    objects (a keep-alive client's next URL: the exchange retargets the destination), gets
    the same fields, Via, upgrade and chunking, so only its request line is made.
    :meth:`head` answers (head, upgrade, chunked) as a plain tuple (an :class:`Outbound` is
    made by a subtype's constructor: three objects)."""

    __slots__ = ("_last", "_tail", "via")

    def __init__(self, via: str) -> None:
        self.via = via
        self._last: tuple[bytes, Destination, Route, str] | None = None
        """What the kept tail was made for: the fields' lines, destination, route (by
        identity) and version. The same lines are the same fields (a name holds no colon, a
        value no line end), hence the same routing fields and decoded forms."""
        self._tail: tuple[bytes, bool, bool] = (b"", False, False)
        """The head past its request line, its upgrade and chunking."""

    def head(self, request: Head, dest: Destination, route: Route) -> tuple[bytes, bool, bool]:
        last = self._last
        if (
            last is not None
            and last[0] is request.wire
            and last[1] is dest
            and last[2] is route
            and last[3] == request.version
        ):
            tail, upgrade, chunked = self._tail
            # The request line as it came when the target goes on unchanged (the same object:
            # not rewritten by the destination): no format, no encode.
            line = request.line if dest.target is request.target else None
            if line is None:
                line = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
            return line + tail, upgrade, chunked
        out = request_head(request, dest, route, self.via)
        head = out.head
        # The request line ends at the head's first CRLF (a target holds none).
        self._tail = (head[head.index(b"\r\n") + 2 :], out.upgrade, out.chunked)
        self._last = (request.wire, dest, route, request.version)
        return head, out.upgrade, out.chunked


# -- the differentials -----------------------------------------------------------------------


def _kept(parsed: Any, heads: list[object]) -> object:
    """The request kept for replay: its bytes and the position of its head among those parsed."""
    again = parsed._again
    if again is None:
        return None
    return again[0], next(i for i, h in enumerate(heads) if h is again[1])


def _both(reads: list[bytes], *, response: bool, bodiless: list[bool] | None = None) -> None:
    """``reads`` fed to the new and ebcf73b's feed alike (a request whole again offered to
    ``again`` first, as the exchange does; ``bodiless`` set before each read): the same
    returns, events, state, request kept for replay, and the same heads reused."""
    new, old = Parsed(response=response, max_tail=256), _EbcParsed(response=response, max_tail=256)
    heads: list[list[object]] = [[], []]  # every head either parsed, in order
    for i, data in enumerate(reads):
        if bodiless is not None:
            new.bodiless = old.bodiless = bodiless[i % len(bodiless)]
        if not response and heads[0] and not new.events and not old.events:
            # (The new again makes a near request's head too: queued as feed queues it.)
            assert offered(new, data, heads[0][-1]) == old.again(data, heads[1][-1])  # type: ignore[arg-type]
        if not old.events:
            assert (None if new.events else new.feed(data)) == old.feed(data), i
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events], i
        assert _state(new) == _state(old), i
        for parsed, seen in ((new, heads[0]), (old, heads[1])):
            seen += [v for k, v in parsed.events if k == HEAD]
        assert _kept(new, heads[0]) == _kept(old, heads[1]), i
        for parsed in (new, old):
            parsed.events.clear()
    reused = [[next(j for j, o in enumerate(seen) if o is h) for h in seen] for seen in heads]
    assert reused[0] == reused[1]


_SETTINGS = settings(
    max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

_VARIED = b"GET /ping?n=%d HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: latency\r\n\r\n"


@_SETTINGS
@given(_stream(response=False), st.lists(st.integers(0, 10**6), max_size=5))
@example(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", [27])
@example(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\n", [])  # a next head begun
@example(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", [])  # a body event
@example(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", [])
@example(  # trailers: an END that is not the shared one
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\r\n\r\n", []
)
@example(b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", [])
@example(b"GET /u HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nraw", [])
@example(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n" + b"x" * REPLAY_MAX, [])
def test_requests_feed_as_ebcf73b(data: bytes, cuts: list[int]) -> None:
    _both(_cut(data, cuts), response=False)
    if len(data) <= 120:
        _both([data[i : i + 1] for i in range(len(data))], response=False)


@_SETTINGS
@given(
    _stream(response=True),
    st.lists(st.integers(0, 10**6), max_size=5),
    st.lists(st.booleans(), min_size=1, max_size=3),
)
def test_answers_feed_as_ebcf73b(data: bytes, cuts: list[int], bodiless: list[bool]) -> None:
    _both(_cut(data, cuts), response=True, bodiless=bodiless)
    if len(data) <= 120:
        _both([data[i : i + 1] for i in range(len(data))], response=True, bodiless=bodiless)


@_SETTINGS
@given(st.binary(max_size=64), st.booleans(), st.lists(st.integers(0, 64), max_size=3))
def test_any_bytes_feed_as_ebcf73b(data: bytes, response: bool, cuts: list[int]) -> None:
    prefix = b"HTTP/1.1 200 OK\r\n" if response else b"GET / HTTP/1.1\r\n"
    _both(_cut(prefix + data, cuts), response=response)
    _both(_cut(data, cuts), response=response)


@given(st.lists(st.integers(0, 3), min_size=1, max_size=12), st.integers(1, 2 * REPLAY_MAX))
def test_varied_and_repeated_requests_are_kept_as_ebcf73b(order: list[int], pad: int) -> None:
    """A keep-alive client's requests, varied and repeated (the benchmark's, and one longer than
    the replay bound): each kept for replay, and served from it when it comes again, alike."""
    requests = [_VARIED % 1, _VARIED % 2, _VARIED % 1, _VARIED.replace(b"latency", b"x" * pad)]
    _both([requests[i] for i in order], response=False)


def test_a_varied_request_is_kept_and_its_repeat_replayed() -> None:
    """Not only alike, but what the memo is for: each varied request is kept, the same bytes
    again are taken by ``again`` without a parse, and a head begun after a whole request keeps
    nothing."""
    parsed = Parsed(response=False)
    assert parsed.feed(_VARIED % 1) is None
    (_, first), end = parsed.events
    # (_again's lead and tail around the target follow the bytes and head: Parsed.again's.)
    assert end is _ENDED and parsed._again is not None
    assert parsed._again[:2] == (_VARIED % 1, first)
    parsed.events.clear()
    parsed.feed(_VARIED % 2)
    (_, second), _ = parsed.events
    parsed.events.clear()
    assert parsed._again is not None and parsed._again[:2] == (_VARIED % 2, second)
    assert isinstance(second, Head) and parsed.again(_VARIED % 2, second)
    assert list(parsed.events) == [_ENDED]
    parsed.events.clear()
    parsed.feed(_VARIED % 3 + b"GET / HTTP/1.1\r\n")  # a next head begun: nothing kept
    assert parsed._again is None and parsed.in_head


@settings(max_examples=examples(1500), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_field_sets, _steps)
@example(
    [[(b"Host", b"edge-1:9100"), (b"User-Agent", b"latency")]],
    [("GET", "/ping?n=1", "1.1", 0, False), ("GET", "/ping?n=2", "1.1", 0, False)],
)
@example(  # another version, the same fields: another Via
    [[(b"Host", b"edge-1"), (b"Connection", b"keep-alive")]],
    [("GET", "/a", "1.0", 0, False), ("GET", "/b", "1.1", 0, False)],
)
@example(  # another route: the Host made of its port
    [[(b"X-Tunnel-Proxy-Host", b"edge-2"), (b"Connection", b"keep-alive")]],
    [("GET", "/a", "1.0", 0, False), ("GET", "/b", "1.0", 0, True)],
)
def test_request_heads_are_ebcf73bs_over_a_conversation(
    field_sets: list[list[tuple[bytes, bytes]]],
    steps: list[tuple[str, str, str, int, bool]],
) -> None:
    """Each request of one connection, parsed by one :class:`Parsed`, its destination the
    exchange's (the last one retargeted when the fields and node stand, else found anew), sent
    on through the new :class:`RequestHeads` and ebcf73b's alike, and as request_head makes it."""
    parsed = Parsed(response=False)
    new, old = RoutedHeads(VIA), _EbcRequestHeads(VIA)
    routes: dict[tuple[str, int], Route] = {}
    last: tuple[Head, Destination] | None = None
    for method, target, version, which, new_route in steps:
        flds = field_sets[which % len(field_sets)]
        rest = parsed.feed(_request_bytes(method, target, version, flds))
        if not parsed.events:
            return
        kind, request = parsed.events.popleft()
        if kind != HEAD:
            return  # llhttp refused it: nothing is sent on
        assert isinstance(request, Head)
        try:
            dest = find_destination(request.start, request.target, (), request.routing)
        except BadRequest:
            return
        if dest.via == "connect":
            return
        if last is not None:  # Exchange._on_request's reuse, as it does it
            head, kept = last
            if (
                request.routing is head.routing
                and request.start == head.start
                and request.version == head.version
                and same_node(kept, request.target)
            ):
                kept.target = request.target
                dest = kept
        key = (dest.host or "pod-node", dest.port or 10250)
        if new_route or key not in routes:
            routes[key] = route(key[0], key[1] + len(routes))
        r = routes[key]
        got = new.head(request, dest, r)
        assert got == old.head(request, dest, r), (request.start, request.target, flds)
        assert got == tuple(request_head(request, dest, r, VIA))
        if rest is not None:
            return
        if parsed.events and parsed.events[0][0] != END:
            return
        if not parsed.events:
            parsed.feed(b"0\r\n\r\n" if got[2] else b"")
        if not parsed.events or parsed.events.popleft()[0] != END or parsed.events:
            return
        last = (request, dest)
