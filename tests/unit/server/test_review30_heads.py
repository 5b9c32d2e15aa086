"""Review of branch heads (issue 15) where HTTP security lives: llhttp's fields kept as two lists
(names, values), an answer's head shaped from them, the last head reused when its names and values
are the same — against 66ac451's parse (:mod:`.heads_old_parse`, kept verbatim). Both are fed
conversations made to smuggle (Content-Length / Transfer-Encoding repeated, differing, in other
case, with odd spacing, obs-folds), to tempt the last head's reuse (a repeat with one field's
value, name case or value case changed, a field added or dropped), 1xx before a final answer,
trailers, 100+ fields, empty values, HTTP/1.0 keep-alive, heads of ~64 KiB; cut anywhere (and a
fixed conversation cut at every byte, and fed byte by byte); requests also offered through
``again`` and ``near`` (the replay paths). Every event, head (read whole) and parser state
compared."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.http_messages import HEAD
from tests.helpers import examples

from . import heads_old_parse as old_parse
from .flat_events import FlatParsed
from .test_heads_parse import _view

# Fields a smuggler tries, and plain ones (empty values among them).
_FRAMING = [
    b"Content-Length: 2",
    b"content-length: 2",
    b"CONTENT-LENGTH: 2",
    b"Content-Length: 3",
    b"Content-Length: 2, 2",
    b"Content-Length: +2",
    b"Content-Length : 2",
    b"Content-Length:2",
    b"Content-Length:   2   ",
    b"Content-Length:",
    b"Transfer-Encoding: chunked",
    b"transfer-encoding: Chunked",
    b"Transfer-Encoding: chunked, identity",
    b"Transfer-Encoding: identity",
    b"Transfer-Encoding: gzip, chunked",
    b"Transfer-Encoding:\tchunked",
    b"Transfer-Encoding: chunked\r\n chunked",  # obs-fold
    b"Transfer-Encoding:\r\n chunked",
]
_OTHER = [
    b"Host: a",
    b"host: A",
    b"Host:",
    b"Connection: keep-alive",
    b"connection: Keep-Alive",
    b"Connection: close",
    b"Connection: Upgrade",
    b"Upgrade: websocket",
    b"Keep-Alive: timeout=5",
    b"X-Empty:",
    b"X-Empty: ",
    b"x-empty: v",
    b"Via: 1.1 a",
    b"TE: trailers",
    b"Trailer: T",
    b"X-Folded: a\r\n\tb",
]
_BODIES = [b"", b"ok", b"2\r\nok\r\n0\r\n\r\n", b"2\r\nok\r\n0\r\nT: 1\r\nt:\r\n\r\n", b"0\r\n\r\n"]


@st.composite
def _head_lines(draw: st.DrawFn) -> list[bytes]:
    lines = draw(st.lists(st.sampled_from(_FRAMING + _OTHER), max_size=8))
    if draw(st.integers(0, 5)) == 0:  # many fields (100+), some of them long
        width = draw(st.sampled_from([1, 40, 500]))
        lines += [b"X-%d: %b" % (i, b"v" * (i % width)) for i in range(draw(st.integers(100, 130)))]
    return draw(st.permutations(lines))


def _changed(draw: st.DrawFn, message: bytes) -> bytes:
    """``message`` again but for its method or status, or for one field: its value, its name's
    case or its value's case changed, or it dropped, or a field added (or whole, when it has
    none)."""
    if draw(st.integers(0, 3)) == 0:  # the start line's method, target or status, nothing else
        start, space, rest = message.partition(b" ")
        if start.startswith(b"HTTP/"):
            status = b"404" if rest[:3] != b"404" else b"200"
            return start + space + status + rest[3:]
        if draw(st.booleans()):  # the target (the replay's "near" case)
            return start + space + rest.replace(b" ", b"x ", 1)
        return (b"POST" if start != b"POST" else b"GET") + space + rest
    head_end = message.find(b"\r\n\r\n")
    first = message.find(b"\r\n") + 2
    if head_end < first:
        return message
    lines = message[first:head_end].split(b"\r\n")
    i = draw(st.integers(0, len(lines) - 1))
    name, colon, value = lines[i].partition(b":")
    way = draw(st.integers(0, 4))
    if way == 0:
        lines[i] = name + colon + value + b"x"
    elif way == 1:
        lines[i] = name.swapcase() + colon + value
    elif way == 2:
        lines[i] = name + colon + value.swapcase()
    elif way == 3:
        del lines[i]
    else:
        lines.insert(i, b"X-Added: 1")
    return message[:first] + b"\r\n".join(lines) + message[head_end:]


@st.composite
def _conversation(draw: st.DrawFn, response: bool) -> list[bytes]:
    messages: list[bytes] = []
    for _ in range(draw(st.integers(1, 6))):
        if messages and draw(st.booleans()):
            last = messages[-1]
            messages.append(last if draw(st.booleans()) else _changed(draw, last))
            continue
        version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
        if response:
            status = draw(st.sampled_from([100, 103, 200, 200, 204, 304, 404]))
            start = b"HTTP/%b %d %b" % (version, status, draw(st.sampled_from([b"OK", b""])))
        else:
            method = draw(st.sampled_from([b"GET", b"POST", b"HEAD"]))
            target = draw(st.sampled_from([b"/", b"/a", b"/b?x=1"]))
            start = b"%b %b HTTP/%b" % (method, target, version)
        lines = draw(_head_lines())
        body = draw(st.sampled_from(_BODIES))
        messages.append(b"\r\n".join([start, *lines]) + b"\r\n\r\n" + body)
    if draw(st.booleans()):  # a read a message
        return messages
    whole = b"".join(messages)  # else cut anywhere, up to 6 times
    inner = st.integers(1, len(whole) - 1) if len(whole) > 1 else st.nothing()
    cuts = draw(st.lists(inner, max_size=6, unique=True))
    return [whole[a:b] for a, b in pairwise([0, *sorted(cuts), len(whole)])]


def _reused(heads: list[Any]) -> list[tuple[bool, bool, bool]]:
    """Per head after the first: whether it is the one before, has its lines, its routing."""
    return [
        (h is p, h.wire is p.wire and h.wire != b"", h.routing is p.routing)
        for p, h in pairwise(heads)
    ]


def _shown(parsed: Any) -> tuple[object, ...]:
    """What a parse shows: its events (heads read whole) and its state."""
    events = [_view(event) for event in parsed.events]
    return (events, parsed.in_head, parsed.in_body, parsed.midway, parsed.fed, parsed.tail)


def _both_fed(reads: list[bytes], *, response: bool, bodiless: bool = False) -> None:
    """Each read fed to both parses (a request's first offered to ``again``, then ``near``,
    as the exchange does), everything they show compared after each."""
    new, old = FlatParsed(response=response), old_parse.Parsed(response=response)
    new.bodiless = old.bodiless = bodiless
    last_new: Any = None
    last_old: Any = None
    seen_new: list[Any] = []  # the heads made, in order (what each reused of the one before)
    seen_old: list[Any] = []
    for data in reads:
        taken = False
        if not response and last_new is not None:
            got = new.again(data, last_new)  # (reqside: near's head made by again too)
            taken = got is last_new
            assert taken == old.again(data, last_old)
            if not taken:
                near_new, near_old = got, old.near(data, last_old)
                assert (near_new is None) == (near_old is None)
                if near_new is not None:
                    assert _view((HEAD, near_new)) == _view((HEAD, near_old))
                    last_new, last_old, taken = near_new, near_old, True
                    seen_new.append(near_new)
                    seen_old.append(near_old)
        if not taken:
            assert new.feed(data) == old.feed(data)
        assert _shown(new) == _shown(old)
        made_new = [head for kind, head in new.events if kind == HEAD]
        made_old = [head for kind, head in old.events if kind == HEAD]
        if made_new:
            last_new, last_old = made_new[-1], made_old[-1]
            seen_new += made_new
            seen_old += made_old
        # The last head's reuse as 66ac451's: the same head, or its field lines and routing.
        assert _reused(seen_new) == _reused(seen_old)
        new.events.clear()
        old.events.clear()


_SETTINGS = settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@given(_conversation(response=False))
def test_smuggling_requests_are_parsed_as_66ac451_did(reads: list[bytes]) -> None:
    _both_fed(reads, response=False)


@_SETTINGS
@given(_conversation(response=True), st.booleans())
def test_smuggling_answers_are_parsed_as_66ac451_did(reads: list[bytes], bodiless: bool) -> None:
    _both_fed(reads, response=True, bodiless=bodiless)


_REQUEST = b"GET /a HTTP/1.1\r\nHost: a\r\nX-V: 1\r\n\r\n"
_REQUESTS = [
    _REQUEST,
    _REQUEST,  # the last again
    _REQUEST.replace(b"/a", b"/b"),  # the target differs (near)
    _REQUEST.replace(b"GET /a", b"DELETE /b"),  # the method differs (its fields the last's)
    _REQUEST.replace(b"X-V: 1", b"X-V: 2"),  # a value differs
    _REQUEST.replace(b"X-V: 2", b"x-v: 2"),  # a name's case differs
    _REQUEST.replace(b"Host: a", b"Host: A"),  # a value's case differs
    b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nok",
    b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nok\r\n0\r\nT: 1\r\n\r\n",
    b"GET /a HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nX-E:\r\n\r\n",
    b"GET /a HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nX-E: \r\n\r\n",
    _REQUEST,
]
_ANSWERS = [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nDate: 1\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nDate: 2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\ndate: 2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nDate: 2\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 404 OK\r\nDate: 2\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",  # status
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nT: 1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nDate: 2\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 204 No Content\r\nX-E:\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nX-E: \r\n\r\n",
]


def test_a_conversation_cut_at_every_byte_is_parsed_as_66ac451_did() -> None:
    for response, messages in ((False, _REQUESTS), (True, _ANSWERS)):
        whole = b"".join(messages)
        for cut in range(len(whole) + 1):
            _both_fed([whole[:cut], whole[cut:]], response=response)
        _both_fed([whole[i : i + 1] for i in range(len(whole))], response=response)
        _both_fed(messages, response=response)


def test_heads_near_64_kib_and_many_fields_are_parsed_as_66ac451_did() -> None:
    for count, width in ((150, 0), (150, 1), (64, 1000), (1, 65000), (2000, 20)):
        lines = b"".join(b"X-%d: %b\r\n" % (i, b"v" * width) for i in range(count))
        request = b"GET / HTTP/1.1\r\nHost: a\r\n" + lines + b"\r\n"
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + lines + b"\r\n"
        changed = lines.replace(b"X-0:", b"x-0:")
        _both_fed([request, request, request.replace(lines, changed)], response=False)
        _both_fed([answer, answer, answer.replace(lines, changed)], response=True)
