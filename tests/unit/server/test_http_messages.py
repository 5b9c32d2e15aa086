"""Parsing HTTP/1.1 messages into events (:class:`Parsed`): the same request again on a
keep-alive connection is answered from what the last parse made, and only where llhttp would
make exactly that again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import OpenUpstream, RouteRequest, WriteUpstream
from ravenproxy.server.http_heads import ROUTING_NAMES, Head, RequestHead, _decoded, keeps_alive
from ravenproxy.server.http_messages import DATA, END, ERROR, HEAD, REPLAY_MAX, Parsed

from .flat_events import FlatParsed
from .test_exchange import VIA, route

GET = b"GET /metrics HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: prom\r\n\r\n"


class Counted(FlatParsed):
    """Counts the heads llhttp parsed (to see whether it ran; ``on_message_begin`` is a C
    method, not one to override)."""

    def __init__(self, *, response: bool = False, max_tail: int = 64 * 1024) -> None:
        self.begun = 0
        super().__init__(response=response, max_tail=max_tail)

    def on_headers_complete(self) -> None:
        self.begun += 1
        super().on_headers_complete()


def take(parsed: Parsed) -> list[tuple[int, object]]:
    events = list(parsed.events)
    parsed.events.clear()
    return events


def test_the_same_request_again_makes_the_same_events_without_parsing() -> None:
    parsed = Counted()
    first = take_after(parsed, GET)
    assert [kind for kind, _ in first] == [HEAD, END]
    for _ in range(3):
        again = take_after(parsed, GET)
        assert again == first
        assert again[0][1] is first[0][1]  # the same Head: what was derived from it is reused
    assert parsed.begun == 1
    assert parsed.fed == 0 and not parsed.in_head and not parsed.in_body


def test_other_bytes_are_parsed_and_then_remembered() -> None:
    parsed = Counted()
    take_after(parsed, GET)
    other = GET.replace(b"User-Agent: prom", b"User-Agent: curl")  # another field
    events = take_after(parsed, other)
    head = events[0][1]
    assert isinstance(head, Head) and head.fields[-1] == (b"User-Agent", b"curl")
    assert take_after(parsed, other) == events
    assert [e[0] for e in take_after(parsed, GET)] == [HEAD, END]
    assert parsed.begun == 3
    # The same but for the target (varhead's near replay): made without llhttp, then kept.
    near = GET.replace(b"/metrics", b"/healthz")
    events = take_after(parsed, near)
    head = events[0][1]
    assert isinstance(head, Head) and head.target == "/healthz" and head.fields is not None
    assert take_after(parsed, near) == events
    assert parsed.begun == 3


def test_after_connection_close_the_parser_decides() -> None:
    # llhttp takes nothing after a "Connection: close" request: the same earlier request
    # must not be answered from memory.
    parsed = Counted()
    take_after(parsed, GET)
    closing = GET.replace(b"User-Agent: prom", b"Connection: close")
    assert [e[0] for e in take_after(parsed, closing)] == [HEAD, END]
    assert [e[0] for e in take_after(parsed, GET)] == [ERROR]
    assert [e[0] for e in take_after(parsed, closing)] == [ERROR]


def test_a_request_in_pieces_is_parsed_each_time() -> None:
    parsed = Counted()
    take_after(parsed, GET[:20])
    assert [e[0] for e in take_after(parsed, GET[20:])] == [HEAD, END]
    # Neither piece was a whole request: the whole one is parsed (a message begun), then
    # remembered (none).
    take_after(parsed, GET)
    take_after(parsed, GET)
    assert parsed.begun == 2


def test_a_request_with_a_body_is_always_parsed() -> None:
    parsed = Counted()
    post = b"POST /x HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 2\r\n\r\nhi"
    for _ in range(2):
        assert [e[0] for e in take_after(parsed, post)] == [HEAD, DATA, END]
    assert parsed.begun == 2


def test_pipelined_requests_are_parsed_and_not_remembered() -> None:
    parsed = Counted()
    both = GET + GET
    for _ in range(2):
        assert [e[0] for e in take_after(parsed, both)] == [HEAD, END, HEAD, END]
    assert parsed.begun == 4


def test_an_http_1_0_request_without_keep_alive_is_not_remembered() -> None:
    parsed = Counted()
    old = b"GET / HTTP/1.0\r\nHost: edge-1:9100\r\n\r\n"
    assert [e[0] for e in take_after(parsed, old)] == [HEAD, END]
    assert [e[0] for e in take_after(parsed, old)] == [ERROR]  # llhttp: closed after it


def test_a_long_request_is_not_kept() -> None:
    parsed = Counted()
    long = GET.replace(b"User-Agent: prom", b"User-Agent: " + b"p" * REPLAY_MAX)
    for _ in range(2):
        assert [e[0] for e in take_after(parsed, long)] == [HEAD, END]
    assert parsed.begun == 2


def test_an_answer_is_parsed_until_its_head_came_twice_then_taken_as_it_repeats() -> None:
    # llhttp parses a head until its shape came twice in a row; from then on an answer of that
    # shape, whole in its read, is queued without it (answeragain, answerparse).
    parsed = Counted(response=True)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    for _ in range(4):
        assert [e[0] for e in take_after(parsed, answer)] == [HEAD, DATA, END]
    assert parsed.begun == 2
    # Its shape with other values (answerparse): taken as well.
    other = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nokk"
    assert [e[0] for e in take_after(parsed, other)] == [HEAD, DATA, END]
    assert parsed.begun == 2
    shaped = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nokk"  # a name's case: another shape
    assert [e[0] for e in take_after(parsed, shaped)] == [HEAD, DATA, END]
    assert parsed.begun == 3  # another shape: llhttp's again


def take_after(parsed: Parsed, data: bytes) -> list[tuple[int, object]]:
    assert parsed.feed(data) is None
    return take(parsed)


def test_after_proxy_connection_close_the_parser_decides() -> None:
    # llhttp reads Proxy-Connection as Connection: after "close" in it, it takes no more.
    parsed = Counted()
    closing = GET.replace(b"User-Agent: prom", b"Proxy-Connection: close")
    assert [e[0] for e in take_after(parsed, closing)] == [HEAD, END]
    assert [e[0] for e in take_after(parsed, closing)] == [ERROR]


POST_CHUNKED = b"POST /up HTTP/1.1\r\nHost: edge-1\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_trailers_that_never_end_are_an_error_and_no_more_is_parsed() -> None:
    """Inside a body, bytes that bring no body byte (chunk sizes, extensions, trailers) count
    against ``max_tail``: past it, one ERROR, and nothing more goes into the parser (llhttp
    would hold an unfinished trailer field whole)."""
    for response in (False, True):
        parsed = Counted(response=response, max_tail=1000)
        start = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" if response else POST_CHUNKED
        )
        parsed.feed(start + b"3\r\nabc\r\n0\r\nX-Pad: ")
        assert [kind for kind, _ in take(parsed)] == [HEAD, DATA]
        for _ in range(9):
            parsed.feed(b"a" * 100)
        assert take(parsed) == []  # 900 of 1000 (the read that brought "abc" is a body's)
        parsed.feed(b"a" * 200)
        assert take(parsed) == [(ERROR, "chunk framing or trailers over 1000 bytes")]
        parsed.feed(b"a" * 10_000 + b"\r\n\r\n")
        assert take(parsed) == [] and parsed.tail == 1100  # not fed: not counted


def test_a_body_in_many_small_reads_and_trailers_within_the_limit_are_not() -> None:
    """Body bytes reset the count: a long chunked body fed a byte at a time, and trailers under
    the limit, are a body and trailers (the limit is on what comes between body bytes)."""
    parsed = Counted(max_tail=64)
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in [b"x" * 40] * 50)
    message = POST_CHUNKED + body + b"0\r\nX-Sum: 7\r\n\r\n"
    for i in range(len(message)):
        parsed.feed(message[i : i + 1])
    events = take(parsed)
    assert [kind for kind, _ in events if kind != DATA] == [HEAD, END]
    assert b"".join(v for k, v in events if k == DATA) == b"x" * 2000  # type: ignore[misc]
    assert events[-1] == (END, [("X-Sum", "7")])


class Asking(Parsed):
    """Asks llhttp for every head's version (no hint taken from the bytes a read began with)."""

    def on_headers_complete(self) -> None:
        self._version = None
        super().on_headers_complete()


def versions(parsed: Parsed, chunks: list[bytes]) -> list[tuple[str, int]]:
    seen = []
    for piece in chunks:
        parsed.feed(piece)
        for kind, value in take(parsed):
            if kind == HEAD:
                assert isinstance(value, Head)
                seen.append((value.version, value.status))
            assert kind != ERROR, value
    return seen


def test_a_response_s_version_is_llhttp_s_whether_its_read_began_with_it_or_not() -> None:
    """A response whose read begins with ``HTTP/1.1 `` takes that version without asking
    llhttp; one that begins inside a read (after a body, after another response, in pieces)
    asks: both give what llhttp parsed, the same head (same fields) under another version
    being another Head."""
    one = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    zero = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    cases = [
        [one, one, zero, one],
        [one + zero, zero + one],  # a second response in the read: not the one it began with
        [early + zero],
        [one[:5], one[5:] + one[:20], one[20:] + zero[:3], zero[3:]],  # heads in pieces
        [one[:-1], one[-1:] + zero],  # a read that begins inside a body
    ]
    for chunks in cases:
        expected = versions(Asking(response=True), chunks)
        assert versions(Parsed(response=True), chunks) == expected
        assert {v for v, _ in expected} == {"1.0", "1.1"} or chunks == [early + zero]
    assert versions(Parsed(response=True), [early + zero]) == [("1.1", 103), ("1.0", 200)]


_PIECES = st.sampled_from(
    [GET, GET.replace(b"/metrics", b"/healthz"), GET[:20], b"", GET + GET, b"POST / HTTP/1.1\r\n"]
)


@settings(max_examples=300, deadline=None)
@given(fed=st.lists(_PIECES, max_size=4), data=_PIECES, mine=st.booleans(), queued=st.booleans())
def test_again_is_the_old_rule_repeated_bytes_with_that_head_and_no_event_waiting(
    fed: list[bytes], data: bytes, mine: bool, queued: bool
) -> None:
    """``again`` asks :meth:`Parsed._repeated`'s rule itself (no call): for any parser state
    (what was fed, events left queued or not) and any head asked for, it answers and acts as
    the rule it replaced — ``not events and _repeated(data) is head``: ``head`` returned, END
    queued. (Any other head it returns is a near request's, made of other bytes, END queued.)"""
    parsed = Parsed(response=False)
    for piece in fed:
        parsed.feed(piece)
        if not queued:
            parsed.events.clear()
    remembered = parsed._again
    other = Head("GET", "/", 0, "1.1", [], 20)
    head = remembered[1] if remembered is not None and mine else other
    expected = not parsed.events and parsed._repeated(data) is head
    before = list(parsed.events)
    got = parsed.again(data, head)
    assert (got is head) is expected
    assert got is None or got is head or (remembered is not None and data != remembered[0])
    assert list(parsed.events) == ([*before, (END, [])] if got is not None else before)
    if expected:
        assert parsed.fed == 0


_NAMES = st.sampled_from(["Host", "User-Agent", "Accept", "X-A", "Via", "Cookie"])
_VALUES = st.text(st.sampled_from("abc:/ ,;=1\t\x80\xff"), max_size=8).map(str.strip)


@settings(max_examples=300, deadline=None)
@given(
    method=st.sampled_from(["GET", "HEAD", "DELETE", "OPTIONS"]),
    target=st.sampled_from(["/", "/metrics", "/ping?n=1", "/a/b?c=d&e"]),
    fields=st.lists(st.tuples(_NAMES, _VALUES), max_size=5),
    version=st.sampled_from(["1.0", "1.1"]),
)
def test_a_request_head_s_size_and_lines_are_its_bytes(
    method: str, target: str, fields: list[tuple[str, str]], version: str
) -> None:
    """A request head's size is its bytes on the wire (fields written ``name: value``), and
    its ``wire`` the fields' lines as parsed, joined by CRLF (what request_head sends on)."""
    lines = "\r\n".join(f"{k}: {v}" for k, v in fields).encode("latin-1")
    data = f"{method} {target} HTTP/{version}\r\n".encode() + lines
    data += b"\r\n\r\n" if fields else b"\r\n"
    parsed = Parsed(response=False)
    parsed.feed(data)
    kind, head = parsed.events.popleft()
    assert kind == HEAD and isinstance(head, Head)
    assert head.size == len(data)
    assert head.wire == lines
    assert head.fields == [(k.encode("latin-1"), v.encode("latin-1")) for k, v in fields]


class Asked(Parsed):
    """Counts :meth:`Parsed._replayable`'s answers."""

    def __init__(self) -> None:
        self.asked = 0
        super().__init__(response=False)

    def _replayable(self, head: Head) -> bool:
        self.asked += 1
        return super()._replayable(head)


def test_whether_a_request_may_be_replayed_is_asked_when_it_comes_again_once() -> None:
    """Requests that differ from the last in a field are parsed and never asked about (the
    rule runs when the same bytes come again, or the same but for the target: varhead's near
    replay; once for a connection's repeated or near request: its head is replayable too)."""
    parsed = Asked()
    for n in range(5):
        take_after(parsed, GET.replace(b"prom", b"prom/%d" % n))
    assert parsed.asked == 0
    for n in range(5):
        take_after(parsed, GET.replace(b"/metrics", b"/metrics?n=%d" % n))
    assert parsed.asked == 1  # the first near request's (the next near ones' last is replayable)
    first = take_after(parsed, GET)
    head = first[0][1]
    assert isinstance(head, Head)
    for _ in range(3):
        assert take_after(parsed, GET) == first
        assert parsed.again(GET, head) and take(parsed) == [(END, [])]
    assert parsed.asked == 1


def _keeps_alive_by_tokens(head: Head) -> bool:
    """keeps_alive's rule with every message's tokens gathered (before its early answer)."""
    tokens: set[str] = set()
    for name in ("connection", "proxy-connection"):
        value = head.lower.get(name)
        if value:
            tokens |= {t.strip().lower() for t in value.split(",")}
    if head.version == "1.1":
        return "close" not in tokens
    return head.version == "1.0" and "keep-alive" in tokens


_OPTIONS = st.sampled_from(["", "close", "Keep-Alive", "keep-alive, Upgrade", " CLOSE ", "x"])


@settings(max_examples=200, deadline=None)
@given(
    version=st.sampled_from(["1.0", "1.1", "0.9"]),
    fields=st.lists(
        st.tuples(st.sampled_from(["Connection", "Proxy-Connection", "Host"]), _OPTIONS),
        max_size=3,
    ),
)
def test_keeps_alive_is_the_rule_of_the_tokens(version: str, fields: list[tuple[str, str]]) -> None:
    encoded = [(k.encode(), v.encode()) for k, v in fields]
    head = Head("GET", "/", 0, version, encoded, 0)
    assert keeps_alive(head) is _keeps_alive_by_tokens(head)


_ANY_NAMES = st.sampled_from(
    [
        *("Host", "HOST", "Via", "Connection", "X-Tunnel-Proxy-Host", "Content-Length"),
        *("Upgrade", "Transfer-Encoding", "TE", "Accept", "User-Agent", "Keep-Alive"),
    ]
)


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(st.tuples(_ANY_NAMES, _VALUES), max_size=6))
def test_a_request_s_routing_fields_are_its_decoded_fields_that_routing_reads(
    fields: list[tuple[str, str]],
) -> None:
    """A request head decodes only the fields named in ROUTING_NAMES as it is parsed (as the
    whole decode would, repeated ones joined), and the rest, in order, when asked."""
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in fields]
    head = RequestHead("GET", "/", "1.1", raw, 0, b"")
    headers, lower = _decoded(raw)
    assert head.routing == {k: v for k, v in lower.items() if k in ROUTING_NAMES.values()}
    assert (head.headers, head.lower) == (headers, lower)


def test_a_plain_request_goes_on_without_its_other_fields_decoded() -> None:
    """Routed and sent on, a request without a hop-by-hop field has only its routing fields
    decoded; one with a hop-by-hop field is rewritten from all of them (and loses it)."""
    hop = GET.replace(b"User-Agent: prom", b"Keep-Alive: 5\r\nUser-Agent: prom")
    for request, decoded in ((GET, False), (hop, True)):
        ex = Exchange(via=VIA, max_head=4096)
        (action,) = ex.receive_client(request)
        assert isinstance(action, RouteRequest)
        (opened,) = ex.routed(route("edge-1"))
        assert isinstance(opened, OpenUpstream)
        (sent,) = ex.upstream_opened()
        assert isinstance(sent, WriteUpstream)
        assert b"User-Agent: prom\r\n" in sent.data and b"Keep-Alive" not in sent.data
        head = ex._request
        assert isinstance(head, RequestHead)
        assert hasattr(head, "_decoded") is decoded
        assert head.routing["host"] == "edge-1:9100"
