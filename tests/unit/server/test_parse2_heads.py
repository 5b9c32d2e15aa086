"""Branch parse2 (issue 15): a request's head made by the parse without RequestHead's
``__init__`` call (its stores, and :func:`http_heads.routing_of`), and the request line as it
came (:attr:`RequestHead.line`) sent on by :class:`http_rewrite.RequestHeads` when the target
goes on unchanged, instead of a format and an encode. Both are pinned against c0d4bc7's
``RequestHead`` and ``RequestHeads`` kept verbatim below (``_Old*``: only renamed; 812de76's
request_head, unchanged at c0d4bc7, is test_reqside_requests'), over generated connections'
bytes (pipelined requests, CRLFs before one, versions, methods, absolute and odd targets)
fed cut at every byte."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.http1 import BadRequest
from ravenproxy.server.http_heads import (
    Head,
    RequestHead,
    _DecodedWhenAsked,
    _routing_name,
)
from ravenproxy.server.http_messages import END, ERROR, HEAD, Parsed
from ravenproxy.server.podroutes import Destination, find_destination, same_node
from ravenproxy.server.router import Route

from .bd24_requests import RoutedHeads
from .test_exchange import VIA, route
from .test_reqside_requests import _old_request_head

# -- c0d4bc7's RequestHead and RequestHeads, verbatim (only renamed) ---------------------------


class _OldRequestHead(_DecodedWhenAsked):
    """A parsed request's head: routed by :attr:`routing` (decoded as it is parsed: a name
    lookup per field), its other fields decoded only if something asks
    for :attr:`headers` or :attr:`lower` (a request with a hop-by-hop field, rewritten): most go
    on as parsed (:attr:`Head.wire`), and their User-Agent, Accept or Authorization is read by
    no one."""

    __slots__ = ()

    status = 0  # a request's (Head's slot left unset: a store less a request that differs)

    def __init__(  # not Head's: its fields not decoded (once a request that differs)
        self,
        method: str,
        target: str,
        version: str,
        fields: list[tuple[bytes, bytes]],
        size: int,
        wire: bytes,
        routing: dict[str, str] | None = None,
    ) -> None:
        """``routing``: the :attr:`routing` of an earlier head with the same ``fields`` (read
        only, so shared), else made here."""
        self.start, self.target, self.version = method, target, version
        self.fields, self.size, self.wire = fields, size, wire
        if routing is None:
            # _decoded's by-name form of the fields named in ROUTING_NAMES only: no other field
            # decoded (a lower-cased name looked up per field).
            routing = {}
            for k, v in fields:
                key = _routing_name(k.lower())
                if key is not None:
                    value = v.decode("latin-1")
                    seen = routing.get(key)
                    routing[key] = value if seen is None else f"{seen}, {value}"
        self.routing = routing


class _OldRequestHeads:
    __slots__ = ("_last", "_tail", "via")

    def __init__(self, via: str) -> None:
        self.via = via
        self._last: tuple[bytes, Destination, Route, str] | None = None
        self._tail: tuple[bytes, bool, bool] = (b"", False, False)

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
            line = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
            return line + tail, upgrade, chunked
        out = _old_request_head(request, dest, route, self.via)
        head = out.head
        # The request line ends at the head's first CRLF (a target holds none).
        self._tail = (head[head.index(b"\r\n") + 2 :], out.upgrade, out.chunked)
        self._last = (request.wire, dest, route, request.version)
        return head, out.upgrade, out.chunked


# -- generated connections ----------------------------------------------------------------------

_FIELDS = [
    (b"Host", [b"edge-1", b"edge-1:9100", b"EDGE-1:10250"]),
    (b"User-Agent", [b"prometheus/2.5", b"\xe9t\xe9", b""]),
    (b"Accept", [b"*/*"]),
    (b"Connection", [b"keep-alive", b"X-Foo", b"te"]),
    (b"Proxy-Connection", [b"keep-alive"]),
    (b"X-Tunnel-Proxy-Host", [b"edge-2", b"edge-1:9100"]),
    (b"Content-Length", [b"0"]),
    (b"Via", [b"1.1 other-proxy"]),
    (b"X-Foo", [b"bar", b"a: b"]),
]
_field = st.one_of(*(st.tuples(st.just(name), st.sampled_from(values)) for name, values in _FIELDS))
_TARGETS = [
    b"/",
    b"/ping?n=1",
    b"/ping?n=2",
    b"/ping?n=12",
    b"/m?nodeName=edge-2",
    b"/a%20b",
    b"/\xe9t\xe9",
    b"/HTTP/1.1",
    b"/x HTTP/1.1",
    b"http://edge-2:9100/m",
    b"http://edge-1/ping?n=3",
    b"*",
]
_request = st.tuples(
    st.sampled_from([b"", b"", b"\r\n"]),  # CRLFs llhttp skips before a request
    st.sampled_from([b"GET", b"GET", b"HEAD", b"OPTIONS", b"DELETE"]),
    st.sampled_from(_TARGETS),
    st.sampled_from([b"1.1", b"1.1", b"1.0"]),
    st.sampled_from([0, 0, 1]),
)
_field_sets = st.lists(st.lists(_field, max_size=4), min_size=2, max_size=2)


def _bytes(requests: list[tuple[bytes, bytes, bytes, bytes, int]], sets: list) -> list[bytes]:
    return [
        pre
        + b"%b %b HTTP/%b\r\n" % (method, target, version)
        + b"".join(k + b": " + v + b"\r\n" for k, v in sets[which])
        + b"\r\n"
        for pre, method, target, version, which in requests
    ]


def _heads(pieces: list[bytes]) -> list[object]:
    parsed, events = Parsed(response=False), []
    for piece in pieces:
        parsed.feed(piece)
        events.extend(parsed.events)
        parsed.events.clear()
    kept = [e for e in events if e[0] in (HEAD, ERROR)]
    errors = [i for i, e in enumerate(kept) if e[0] == ERROR]
    return kept[: errors[0] + 1] if errors else kept  # (what is fed after an error: refused)


def _same_as_c0d4bc7(head: Head) -> None:
    """``head`` is what c0d4bc7's constructor makes of the parse's arguments, and its line (if
    kept) is the one the format made."""
    assert type(head) is RequestHead
    old = _OldRequestHead(head.start, head.target, head.version, head.fields, head.size, head.wire)
    for name in ("start", "target", "status", "version", "fields", "size", "wire", "routing"):
        assert getattr(head, name) == getattr(old, name), name
    assert (head.headers, head.lower) == (old.headers, old.lower)
    if head.line is not None:
        assert head.version == "1.1"
        assert head.line == f"{head.start} {head.target} HTTP/1.1\r\n".encode("latin-1")


def _sent_on(heads: list[Head], requests: RoutedHeads | _OldRequestHeads) -> list[object]:
    """What each head sends on through one connection's ``requests``, its destination the last
    one's retargeted as Exchange._on_request does it (the same object: RequestHeads' kept tail
    serves it), its route one per node."""
    out: list[object] = []
    routes: dict[tuple[str, int], Route] = {}
    last: tuple[Head, Destination] | None = None
    for request in heads:
        try:
            dest = find_destination(request.start, request.target, (), request.routing)
        except BadRequest:
            out.append("refused")
            continue
        if last is not None and (
            request.routing is last[0].routing
            and request.start == last[0].start
            and request.version == last[0].version
            and same_node(last[1], request.target)
        ):
            dest = last[1]
            dest.target = request.target
        key = (dest.host or "pod-node", dest.port or 10250)
        r = routes.setdefault(key, route(*key))
        out.append(requests.head(request, dest, r))
        last = (request, dest)
    return out


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_request, min_size=1, max_size=4), _field_sets)
@example(
    [(b"", b"GET", b"/ping?n=1", b"1.1", 0), (b"", b"GET", b"/ping?n=2", b"1.1", 0)],
    [[(b"Host", b"edge-1:9100"), (b"User-Agent", b"latency")], []],
)
@example(
    [(b"\r\n", b"GET", b"/x HTTP/1.1", b"1.1", 0), (b"", b"GET", b"/HTTP/1.1", b"1.0", 0)],
    [[(b"Host", b"edge-1")], []],
)
def test_heads_and_what_they_send_on_are_c0d4bc7s_fed_cut_at_every_byte(
    requests: list[tuple[bytes, bytes, bytes, bytes, int]], sets: list
) -> None:
    """A connection's requests, whole per read (as a client sends them), pipelined in one read,
    and cut at each byte: each head is c0d4bc7's, and one RequestHeads sends on for them what
    c0d4bc7's did."""
    messages = _bytes(requests, sets)
    data = b"".join(messages)
    whole = _heads(messages)
    halves = ([data[:i], data[i:]] for i in range(1, len(data)))
    cuts = [[data], *halves, list(map(bytes, zip(data)))]  # ... and a byte per read
    for pieces in [messages, *cuts]:
        events = _heads(pieces)
        heads = [h for kind, h in events if kind == HEAD]
        for head in heads:
            assert isinstance(head, Head)
            _same_as_c0d4bc7(head)
        assert [(k, getattr(h, "target", h)) for k, h in events] == [
            (k, getattr(h, "target", h)) for k, h in whole
        ]
        assert _sent_on(heads, RoutedHeads(VIA)) == _sent_on(heads, _OldRequestHeads(VIA))


def test_an_http11_request_whole_in_a_read_keeps_its_line_and_sends_it_on() -> None:
    """The line is kept when the parse saw it whole at a read's start, and a keep-alive
    client's next request with the last one's fields sends it on (its target unchanged); an
    HTTP/1.0 request, a line cut by the read and an absolute target (rewritten to origin form)
    get the format's."""
    parsed = Parsed(response=False)
    rest = b"Host: edge-1:9100\r\nUser-Agent: t\r\n\r\n"
    parsed.feed(b"GET /ping?n=1 HTTP/1.1\r\n" + rest)
    parsed.feed(b"GET /ping?n=%E9 HTTP/1.1\r\n" + rest)
    parsed.feed(b"GET /ping?n=4 HTTP/1.")
    parsed.feed(b"1\r\n" + rest)
    parsed.feed(b"GET /ping?n=3 HTTP/1.0\r\n" + rest)
    heads = [h for kind, h in parsed.events if kind == HEAD]
    assert all(isinstance(h, RequestHead) for h in heads)
    lines = [h.line for h in heads if isinstance(h, Head)]
    assert lines == [b"GET /ping?n=1 HTTP/1.1\r\n", b"GET /ping?n=%E9 HTTP/1.1\r\n", None, None]
    first, second = heads[0], heads[1]
    assert isinstance(first, Head) and isinstance(second, Head)
    requests, r = RoutedHeads(VIA), route("edge-1")
    dest = find_destination(first.start, first.target, (), first.routing)
    requests.head(first, dest, r)
    dest.target = second.target
    sent, _, _ = requests.head(second, dest, r)
    assert sent.startswith(b"GET /ping?n=%E9 HTTP/1.1\r\nHost: edge-1:9100\r\n")
    # A target rewritten by the destination: its own line, not the one that came.
    dest.target = "/other"
    sent, _, _ = requests.head(second, dest, r)
    assert sent.startswith(b"GET /other HTTP/1.1\r\nHost: edge-1:9100\r\n")
    absolute = Parsed(response=False)
    absolute.feed(b"GET http://edge-1:9100/m HTTP/1.1\r\n" + rest)
    (_, head), _ = absolute.events
    assert isinstance(head, Head) and head.line is not None
    dest = find_destination(head.start, head.target, (), head.routing)
    assert _sent_on([head], RoutedHeads(VIA)) == _sent_on([head], _OldRequestHeads(VIA))
    assert dest.target == "/m"


def test_a_response_is_not_kept_to_be_recognised_again() -> None:
    """Parsed.feed asks no response whether it came whole (``_again`` is a request's)."""
    parsed = Parsed(response=True)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    parsed.feed(answer)
    parsed.feed(answer)
    assert [kind for kind, _ in parsed.events] == [HEAD, END, HEAD, END]
    assert parsed._again is None
