"""Branch varhead (issue 15): a keep-alive request that is the last one's bytes but for its
request-target (a scraper's next URL, an API client's) is made from the last one's parse, without
llhttp (:meth:`Parsed._near`).

The oracle is f667209's ``Parsed.feed`` and ``again`` (the two methods the branch changed), kept
verbatim below on the same class (``_F66Parsed``): every read fed to both must give the same
returns, events (heads compared field by field: method, target, version, request line as it
came, fields, size, wire, routing fields, decoded forms), state, request kept for replay, and the
same heads reused. The reads: a request, then others that are it but for a generated target
(every byte value anywhere in it, origin-form or not, absolute-form, ``*``, authority-form), or
with another method, version or request-line shape, or a field changed, a body, a
``Connection: close``, an upgrade, CONNECT, OPTIONS; whole, pipelined two to a read, split over
reads. And whole exchanges (test_review26_exchange's driver): the Exchange as it is against one
whose client parser is f667209's, over conversations of such requests, routed by Host,
X-Tunnel-Proxy-Host, ``?nodeName=``, pod paths and absolute URIs: the same routes asked, bytes
sent, refusals and closes.
"""

from __future__ import annotations

from typing import Any

from httptools import HttpParserError, HttpParserUpgrade
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import Action, WriteUpstream
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import _ENDED, EOF, ERROR, HEAD, REPLAY_MAX, Parsed, _Stop
from tests.helpers import examples

from .bd24_requests import offered
from .test_exchange import VIA
from .test_review24_parse import _state, _view
from .test_review26_exchange import _drive

# -- f667209's Parsed.feed and Parsed.again, verbatim (their class renamed) ----------------------


class _F66Parsed(Parsed):
    __slots__ = ()

    def feed(self, data: bytes) -> bytes | None:
        """Parse ``data``; returns the bytes past an upgrade's (or CONNECT's) head, if one
        ended the HTTP part of the connection. An error is queued after what came before it."""
        events = self.events
        if self._again is not None:
            head = self._repeated(data)
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
        # A request may begin at the start of ``data`` (the parser between messages, no event
        # waiting): a response is never kept, not asked whether it came whole.
        fresh = False
        if not self.in_body:
            self.fed += len(data)
            if self.in_head:
                pass
            elif self._response:
                # (A slice compared: startswith parses its arguments by format, ~200 more.)
                self._version = "1.1" if data[:9] == b"HTTP/1.1 " else None
            else:
                self._line = data
                fresh = not events
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
        self.events.append(_ENDED)
        self.fed = 0
        return True


class _F66Exchange(Exchange):
    """The Exchange with f667209's client parser and ``receive_client`` (verbatim)."""

    def __init__(self, *, via: str, max_head: int) -> None:
        super().__init__(via=via, max_head=max_head)
        self.client = _F66Parsed(response=False, max_tail=max_head)

    def receive_client(self, data: bytes) -> list[Action]:
        """Bytes from the client; ``b""``: it closed its side."""
        if self.phase == "closed":
            return []
        seen = self._seen
        if seen is not None and self.phase == "head" and self.client.again(data, seen[0]):
            # The last request again (no HEAD event queued): it goes on as it went (the head
            # of _on_request, inline: once a request).
            self._client_keep, self._request = seen[1], seen[0]
            self.phase = "routing"
            return [seen[2]]
        if not data:
            self.client.events.append((EOF, None))
        elif self.client_raw is not None:
            self.client_raw += data
        else:
            self.client_raw = self.client.feed(data)
        return self._client_events()


class _Counted(Parsed):
    """Counts the heads llhttp parsed."""

    __slots__ = ("begun",)

    def __init__(self) -> None:
        self.begun = 0
        super().__init__(response=False)

    def on_headers_complete(self) -> None:
        self.begun += 1
        super().on_headers_complete()


def _kept(parsed: Any, heads: list[object]) -> object:
    again = parsed._again
    if again is None:
        return None
    return again[0], next(i for i, h in enumerate(heads) if h is again[1])


def _both(reads: list[bytes], *, ask_again: bool = True) -> int:
    """``reads`` fed to the new and f667209's parsers alike (offered to ``again`` first, as the
    exchange does, when ``ask_again``): the same returns, events, state, request kept, heads
    reused. Returns how many reads the new parser took without llhttp."""
    new, old = _Counted(), _F66Parsed(response=False)
    heads: list[list[object]] = [[], []]
    near = 0
    for i, data in enumerate(reads):
        begun = new.begun
        if ask_again and heads[0] and not new.events and not old.events:
            # (The new again makes a near request's head too: queued as feed queues it.)
            assert offered(new, data, heads[0][-1]) == old.again(data, heads[1][-1])  # type: ignore[arg-type]
        if not old.events:
            assert (None if new.events else new.feed(data)) == old.feed(data), i
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events], i
        assert _state(new) == _state(old), i
        made = [v for k, v in new.events if k == HEAD]
        if made and new.begun == begun and all(h not in heads[0] for h in made):
            near += 1  # a new head that llhttp did not make
        heads[0] += made
        heads[1] += [v for k, v in old.events if k == HEAD]
        assert _kept(new, heads[0]) == _kept(old, heads[1]), i
        new.events.clear()
        old.events.clear()
    reused = [[next(j for j, o in enumerate(seen) if o is h) for h in seen] for seen in heads]
    assert reused[0] == reused[1]
    return near


_METHODS = [b"GET"] * 5 + [b"HEAD", b"POST", b"DELETE", b"OPTIONS", b"CONNECT", b"PRI", b"get"]
_FIELDS = [
    b"Host: edge-1:9100\r\nUser-Agent: latency\r\n",
    b"Host: edge-1:9100\r\nUser-Agent: prom\r\n",  # a changed field
    b"Host: edge-1:9100\r\nX-Tunnel-Proxy-Host: edge-2\r\n",
    b"Host: edge-1:9100\r\nConnection: close\r\n",
    b"Host: edge-1:9100\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n",
    b"Host: edge-1:9100\r\nContent-Length: 3\r\n",  # a body
    b"Host: edge-1:9100\r\nContent-Length: 0\r\n",
    b"Host: edge-1:9100\r\nTransfer-Encoding: chunked\r\n",
    b"",  # no Host
]
_BODIES = {5: b"abc", 7: b"3\r\nabc\r\n0\r\n\r\n"}
_VERSIONS = [b" HTTP/1.1"] * 8 + [
    b" HTTP/1.0",
    b" HTTP/1.2",
    b"  HTTP/1.1",
    b" HTTP/1.1 ",
    b" http/1.1",
]

_visible = st.integers(0x21, 0x7E)
_byte = st.one_of(_visible, _visible, _visible, st.integers(0, 255))  # any value a quarter
_ORIGIN = [b"/ping?n=", b"/metrics", b"/", b"/a#b?c", b"/exec/ns/pod/c?x=", b"/m?nodeName=edge-"]
_origin = st.tuples(
    st.sampled_from(_ORIGIN),
    st.lists(_byte, max_size=3),
    st.sampled_from([b"", b"7", b"/x?y=%41", b"&nodeName=edge-2", b"2"]),
).map(lambda t: t[0] + bytes(t[1]) + t[2])
"""Origin-form, a byte of any value somewhere in it (the near path's edge)."""
_target = st.one_of(
    _origin,
    _origin,
    _origin,
    st.binary(max_size=12),  # anything at all
    st.sampled_from(
        [
            b"http://edge-2:9100/metrics",
            b"https://edge-1:10250/pods",
            b"*",
            b"edge-1:10250",
            b"/containerLogs/ns/p/c?follow=true",
            b"//x",
            b"/%",
            b"/\x7f",
            b"/\x80",
            b"/a b",
            b"/a\tb",
        ]
    ),
)


@st.composite
def _request(draw: st.DrawFn, base: tuple[bytes, int, bytes], n: int) -> bytes:
    """A request, mostly ``base``'s (method, field set, version) but for its target (an
    origin-form one numbered ``n``: it differs from the last)."""
    if draw(st.integers(0, 4)):
        method, which, version = base
    else:
        method = draw(st.sampled_from(_METHODS))
        which = draw(st.integers(0, len(_FIELDS) - 1))
        version = draw(st.sampled_from(_VERSIONS))
    target = draw(_target)
    if target[:1] == b"/" and draw(st.integers(0, 3)):
        target += b"&%d" % n
    body = _BODIES.get(which, b"")
    return method + b" " + target + version + b"\r\n" + _FIELDS[which] + b"\r\n" + body


@st.composite
def _reads(draw: st.DrawFn) -> list[bytes]:
    """A first request, then others mostly like it but for the target: whole reads, sometimes
    two to a read, a request split over reads, or CRLFs before one."""
    which = draw(st.integers(0, 2))
    version = b" HTTP/1.1" if draw(st.integers(0, 5)) else draw(st.sampled_from(_VERSIONS))
    method = b"GET" if draw(st.integers(0, 3)) else draw(st.sampled_from(_METHODS))
    base = (method, which, version)
    first = (
        base[0]
        + b" "
        + draw(st.one_of(_origin, _origin, _target))
        + version
        + b"\r\n"
        + _FIELDS[which]
        + b"\r\n"
    )
    reads = [first]
    for n in range(draw(st.integers(1, 6))):
        data = draw(_request(base, n))
        how = draw(st.sampled_from(["whole"] * 8 + ["two", "split", "crlf"]))
        if how == "two":
            data += draw(_request(base, n + 10))
        elif how == "crlf":
            data = b"\r\n" + data
        if how == "split":
            cut = draw(st.integers(1, max(1, len(data) - 1)))
            reads += [data[:cut], data[cut:]]
        else:
            reads.append(data)
    return reads


_SETTINGS = settings(
    max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
_NEAR = b"GET /ping?n=%d HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: latency\r\n\r\n"


@_SETTINGS
@given(_reads(), st.booleans())
@example([_NEAR % 1, _NEAR % 2, _NEAR % 2, _NEAR % 30, _NEAR % 1], True)
@example([_NEAR % 1, (_NEAR % 2).replace(b"/ping", b"/p\x80")], True)  # refused by llhttp
@example([_NEAR % 1, (_NEAR % 2).replace(b"/ping", b"http://edge-2/")], True)
@example([_NEAR % 1, (_NEAR % 2).replace(b"/ping", b"/p#x")], True)
@example([_NEAR % 1, (_NEAR % 2) + _NEAR % 3], True)  # pipelined
@example([_NEAR % 1, (_NEAR % 2)[:9], (_NEAR % 2)[9:]], True)  # split
@example([_NEAR % 1, b"\r\n" + _NEAR % 2], True)
@example([_NEAR % 1, (_NEAR % 2).replace(b"/ping", b"/" + b"x" * REPLAY_MAX), _NEAR % 3], True)
def test_requests_parse_as_f667209s(reads: list[bytes], ask_again: bool) -> None:
    near = _both(reads, ask_again=ask_again)
    event(f"taken without llhttp: {min(near, 3)}")


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 255), st.integers(0, 8), st.sampled_from([b"GET", b"OPTIONS", b"DELETE"]))
def test_every_byte_value_in_a_target_parses_as_f667209s(byte: int, at: int, method: bytes) -> None:
    """Every byte value, at any place of an origin-form target (after its first character):
    what llhttp refuses or reads otherwise goes to llhttp."""
    target = b"/metrics?n=1"
    target = target[: 1 + at] + bytes([byte]) + target[1 + at :]
    first = method + b" /metrics HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"
    near = _both([first, first.replace(b" /metrics ", b" " + target + b" ")])
    assert near == (0x21 <= byte <= 0x7E)  # visible ASCII: llhttp reads it as a target byte


def test_a_near_request_is_made_without_llhttp() -> None:
    parsed = _Counted()
    for n in range(5):
        parsed.feed(_NEAR % n)
        head = parsed.events[0][1]
        assert isinstance(head, Head) and head.target == f"/ping?n={n}"
        assert head.line == (_NEAR % n)[: (_NEAR % n).index(b"\r\n") + 2]
        assert parsed.events[1] is _ENDED
        parsed.events.clear()
    assert parsed.begun == 1


# -- whole exchanges -----------------------------------------------------------------------------

_ANSWER = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
_CHUNKED = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"]


def _exchanges(reads: list[bytes], fresh: list[bool]) -> list[tuple[object, ...]]:
    answers = [_ANSWER, _CHUNKED]
    new = _drive(Exchange(via=VIA, max_head=4096), reads, answers, fresh)
    old = _drive(_F66Exchange(via=VIA, max_head=4096), reads, answers, fresh)
    assert new == old
    return new


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_reads(), st.lists(st.booleans(), min_size=1, max_size=3))
@example(
    [
        _NEAR % 1,
        (_NEAR % 2).replace(b"/ping", b"/m?nodeName=edge-2&x"),  # names another node
        _NEAR % 3,
        (_NEAR % 4).replace(b"/ping", b"/exec/ns/pod/c"),  # a pod path
        (_NEAR % 5).replace(b"/ping", b"http://edge-2:9100/p"),  # absolute-form
        _NEAR % 6,
    ],
    [False],
)
def test_exchanges_as_f667209s(reads: list[bytes], fresh: list[bool]) -> None:
    log = _exchanges(reads, fresh)
    event(f"requests sent: {min(sum(1 for v in log if v[0] == 'WriteUpstream'), 4)}")


def test_near_requests_go_to_their_targets() -> None:
    """Not only alike: each near request's own target goes on, and one naming another node
    (nodeName) is routed there."""
    reads = [_NEAR % 1, _NEAR % 2, (_NEAR % 3).replace(b"/ping", b"/m?nodeName=edge-2&x")]
    log = _exchanges(reads, [False])
    sent = [v[1] for v in log if v[0] == WriteUpstream.__name__]
    assert [s.split(b" ")[1] for s in sent] == [
        b"/ping?n=1",
        b"/ping?n=2",
        b"/m?nodeName=edge-2&x?n=3",
    ]
    routed = [v[1] for v in log if v[0] == "RouteRequest"]
    assert routed[-1][1] == "edge-2"  # type: ignore[index]
