"""Review of branch reqparse (issue 15): the parse against e115ebc's, differentially, where the
branch's own differential (test_reqparse_callbacks) does not go.

reqparse makes llhttp's ``on_message_begin``, ``on_url`` and ``on_status`` C methods (a list's
``pop`` and ``append``): what a message leaves behind is cleared as it ends, trailers are told
from fields by ``in_body`` (``in_head`` is read after each parse from the list the begin
empties). Held here against e115ebc's :class:`Parsed` (test_reqparse_callbacks' ``_OldParsed``,
a verbatim copy: not written a second time) over messages built from a grammar of llhttp's
corners and mutated at the byte level — methods it knows or not, odd targets and versions,
fields repeated, empty, folded, with bare LFs or bad bytes, framings that conflict, chunk sizes
and extensions good and bad, trailers (past the tail bound too), pipelined messages after a
``close``, an upgrade or CONNECT and what comes after it (llhttp resumes there when fed again),
a HEAD's answer whose ``bodiless`` flips between reads — cut at random and a byte at a time:
each read returns the same, queues the same events (every head's every field, its request line
as it came), leaves the same state, and the heads reused (the same object for the same head
again, which the exchange's memos key on) are reused alike.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.http_heads import Head, keeps_alive
from ravenproxy.server.http_messages import HEAD
from tests.helpers import examples

from .bd24_requests import offered
from .flat_events import FlatParsed
from .test_reqparse_callbacks import _OldParsed

_METHODS = [b"GET", b"GET", b"HEAD", b"POST", b"PUT", b"CONNECT", b"OPTIONS", b"FOO", b"get",
            b"M-SEARCH", b"PRI", b"DELETE"]  # fmt: skip
_TARGETS = [b"/", b"/ping", b"/ping?n=1", b"/a%25b", b"*", b"http://a:1/x", b"edge-1:22",
            b"/" + b"t" * 300, b"/\xe9", b"/a b", b""]  # fmt: skip
_VERSIONS = [b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/0.9", b"HTTP/1.1 ",
             b"http/1.1", b"HTTP/1.10"]  # fmt: skip
_FIELDS = [
    b"Host: edge-1:9100", b"host: edge-1:9100", b"Host:", b"Host:  spaced  ", b"X: a\tb",
    b"Connection: close", b"Connection: keep-alive", b"Connection: Upgrade",
    b"Upgrade: websocket", b"Content-Length: 3", b"Content-Length: 3", b"Content-Length: +3",
    b"Content-Length: 03", b"Content-Length: 0", b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip, chunked", b"Transfer-Encoding: chunked, gzip",
    b"Expect: 100-continue",
    b" folded", b"Bad Name: v", b"X-\x01: v", b"X: \x7f", b"X: \xe9", b"Via: 1.1 other",
    b"TE: trailers", b"Trailer: X-Sum", b"Keep-Alive: timeout=5", b"Proxy-Connection: close",
]  # fmt: skip
_BODIES = [b"", b"abc", b"3\r\nabc\r\n0\r\n\r\n", b"3;ext=1\r\nabc\r\n0\r\nX-Sum: 3\r\n\r\n",
           b"0\r\nX-A: 1\r\nX-B: 2\r\n\r\n", b"zz\r\n", b"3\r\nabcd\r\n", b"1\r\na\r\n",
           b"0\r\n" + b"X-Long: " + b"v" * 400 + b"\r\n\r\n", b"ab"]  # fmt: skip
_STATUS = [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 ", b"HTTP/1.1 200", b"HTTP/1.0 200 OK",
           b"HTTP/1.1 204 No Content", b"HTTP/1.1 304 Not Modified", b"HTTP/1.1 100 Continue",
           b"HTTP/1.1 103 Early Hints", b"HTTP/1.1 101 Switching Protocols", b"HTTP/1.1 999 x",
           b"HTTP/1.1 20 short", b"HTTP/1.1 200 100% \xe9", b"HTTP/2 200 OK",
           b"HTTP/1.1 404 Not Found"]  # fmt: skip
_ENDS = [b"\r\n", b"\r\n", b"\r\n", b"\n"]


@st.composite
def _message(draw: st.DrawFn, *, response: bool) -> bytes:
    if response:
        line = draw(st.sampled_from(_STATUS))
    else:
        line = b" ".join(
            [draw(st.sampled_from(_METHODS)), draw(st.sampled_from(_TARGETS)),
             draw(st.sampled_from(_VERSIONS))]
        )  # fmt: skip
    fields = draw(st.lists(st.sampled_from(_FIELDS), max_size=5))
    end = draw(st.sampled_from(_ENDS))
    head = end.join([line, *fields]) + end + end
    lead = draw(st.sampled_from([b"", b"", b"", b"\r\n", b"\r\n\r\n"]))
    return lead + head + draw(st.sampled_from(_BODIES))


@st.composite
def _stream(draw: st.DrawFn, *, response: bool) -> bytes:
    """Messages one after the other, sometimes the same one again, mutated at a byte or two
    (a byte changed, dropped or doubled), sometimes with raw bytes after them."""
    messages = draw(st.lists(_message(response=response), min_size=1, max_size=4))
    if len(messages) > 1 and draw(st.booleans()):
        messages[-1] = messages[0]  # the same message again
    data = bytearray(b"".join(messages))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        i = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["set", "drop", "double"]))
        if how == "set":
            data[i] = draw(st.integers(0, 255))
        elif how == "drop":
            del data[i]
        else:
            data.insert(i, data[i])
        if not data:
            data = bytearray(b"\r\n")
    if draw(st.integers(0, 4)) == 0:
        data += draw(st.binary(max_size=12))
    return bytes(data)


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
        list(value.fields),
        value.size,
        value.wire,
        value.routing,
        value.headers,
        value.lower,
        keeps_alive(value),
        getattr(value, "line", None),  # a request's line as it came
    )


def _state(parsed: Any) -> tuple[object, ...]:
    return (parsed.in_head, parsed.in_body, parsed.midway, parsed.fed, parsed.tail)


def _both(reads: list[bytes], *, response: bool, bodiless: list[bool] | None = None) -> None:
    """``reads`` fed to a new and an old parser alike (a request whole again offered to
    ``again`` first, as the exchange does; ``bodiless`` set before each read): the same
    returns, events, state, and the same heads reused."""
    new = FlatParsed(response=response, max_tail=256)
    old = _OldParsed(response=response, max_tail=256)
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
            parsed.events.clear()
    # A head again is the same object in both, or in neither (the memos keyed on it).
    for seen in heads:
        assert all(isinstance(h, Head) for h in seen)
    reused = [[next(j for j, o in enumerate(seen) if o is h) for h in seen] for seen in heads]
    assert reused[0] == reused[1]


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if data[a:b]]


_SETTINGS = settings(
    max_examples=examples(1500), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@given(_stream(response=False), st.lists(st.integers(0, 10**6), max_size=5))
@example(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n\r\n", [])
@example(b"CONNECT a:22 HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n", [26, 30])
@example(
    b"GET /u HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nGET / HTTP/1.1\r\n\r\n", [60]
)
# A body ended in the read an upgrade came in (in_body read after the upgrade's stop).
@example(
    b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
    b"GET /u HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nraw",
    [40],
)
def test_requests_parse_as_e115ebcs(data: bytes, cuts: list[int]) -> None:
    _both(_cut(data, cuts), response=False)
    if len(data) <= 120:
        _both([data[i : i + 1] for i in range(len(data))], response=False)


@_SETTINGS
@given(
    _stream(response=True),
    st.lists(st.integers(0, 10**6), max_size=5),
    st.lists(st.booleans(), min_size=1, max_size=3),
)
@example(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", [], [True])
@example(
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", [50], [False]
)
def test_answers_parse_as_e115ebcs(data: bytes, cuts: list[int], bodiless: list[bool]) -> None:
    _both(_cut(data, cuts), response=True, bodiless=bodiless)
    if len(data) <= 120:
        _both([data[i : i + 1] for i in range(len(data))], response=True, bodiless=bodiless)


@_SETTINGS
@given(st.binary(max_size=64), st.booleans(), st.lists(st.integers(0, 64), max_size=3))
def test_any_bytes_parse_as_e115ebcs(data: bytes, response: bool, cuts: list[int]) -> None:
    prefix = b"HTTP/1.1 200 OK\r\n" if response else b"GET / HTTP/1.1\r\n"
    _both(_cut(prefix + data, cuts), response=response)
    _both(_cut(data, cuts), response=response)


_TRAILED = [
    b"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nab\r\n0\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\n\r\n"
    b"GET /n HTTP/1.1\r\nHost: n\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nab\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n"
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-Z: 9\r\n\r\n",
]


def test_trailers_across_reads_whose_events_were_taken_meanwhile_are_e115ebcs() -> None:
    """Trailers flushed in one read (a next field began) whose END comes in a later one, the
    events queued before them taken meanwhile, as the exchange takes them: cut in two at every
    byte, and in three around every trailer's line."""
    for i, data in enumerate(_TRAILED):
        response = i == 1
        for cut in range(1, len(data)):
            _both([data[:cut], data[cut:]], response=response)
        for cut in range(data.index(b"0\r\nX-A"), len(data) - 1):
            _both([data[:cut], data[cut : cut + 3], data[cut + 3 :]], response=response)
