"""Review of branch varreq (issue 15): a request that differs from the connection's last one —
its parse (``Parsed.feed``, llhttp's ``on_header`` and ``on_message_complete``: trailers now
taken from the one field list) and the head sent on (``RequestHeads``: its memo in slots).

varreq's own test (test_varreq_requests) holds each piece alone against ebcf73b's. Here they
are held together, as the server runs them: a whole :class:`Exchange` — its client parser,
the target's parsers it makes per connection and its ``RequestHeads`` swapped for ebcf73b's
(kept verbatim below: ``feed``, ``on_header`` and ``on_message_complete`` over the same class,
its ``_trailers`` list; ``RequestHeads`` renamed; ``upstream_opened``, unchanged since, made to
make the old parser) — against the Exchange as it is, over generated keep-alive conversations:
varied and repeated requests (targets, methods, HTTP/1.0 and 1.1, fields kept or changed,
Host or absolute-form, node-name and tunnel-header routes, pod paths, Via, hop-by-hop and
X-Forwarded fields, loops, upgrades, CONNECT), bodies by length or chunked with and without
trailers, pipelined, cut at random or a byte at a time and sometimes mutated at a byte; routes
kept or made anew; the target's answers (varied lengths and Dates, chunked with trailers, 1xx
before the final one, 204/304, HEAD's, until-close, 101, a close, stray bytes), cut likewise.

Everything the exchange asks its driver to do must be the same, in the same order: the routes
asked for, the bytes sent to the target (heads, chunks, trailers), to the client (with the
status counted), refusals (status, node, reason), closes, tunnels and switches.

Hand-made breaks of varreq's code, each failing ``test_conversations_as_ebcf73b``:
``on_message_complete`` taking no trailers (``self._fields[:0]``: the trailers dropped, then
sent on as the next head's fields); ``on_headers_complete`` not emptying ``_fields`` (the
head's fields sent on as trailers); ``RequestHeads.head`` not comparing the route (the Host
made of the last route's port). Not observable through an Exchange, hence not counted: the
kept request's END compared by kind (a trailed request is chunked: never replayed), the
version left out of ``RequestHeads``' comparison (a request of another version gets another
destination object), ``fresh`` set while events wait (nothing queued before a fresh parse can
leave exactly a HEAD and the shared END).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    OpenUpstream,
    Refuse,
    RouteRequest,
    SwitchProtocols,
    Tunnel,
)
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import (
    Parsed,
)
from ravenproxy.server.podroutes import Destination
from ravenproxy.server.router import Route
from tests.helpers import examples

from .bd24_requests import Bd24Exchange
from .test_exchange import VIA, route
from .test_varreq_requests import _EbcParsed, _EbcRequestHeads

# ebcf73b's Parsed.feed, on_header, on_message_complete and RequestHeads, verbatim, are kept in
# test_varreq_requests.py (_EbcParsed, _EbcRequestHeads).


class _EbcExchange(Bd24Exchange):
    """The Exchange with ebcf73b's parsers and heads (its own code unchanged since ebcf73b; its
    ``receive_client``, ``routed`` and ``_send``, which reqside restructured, bd24f07's:
    ``Bd24Exchange``)."""

    def __init__(self, *, via: str, max_head: int) -> None:
        super().__init__(via=via, max_head=max_head)
        self.client = _EbcParsed(response=False, max_tail=max_head)
        self._request_head = _EbcRequestHeads(via).head

    def upstream_opened(self) -> list[Action]:  # ebcf73b's, the parser made ebcf73b's
        """The target connection :class:`OpenUpstream` asked for is open."""
        assert self.phase == "opening"
        self._up = _EbcParsed(response=True, max_tail=self.max_head)
        self._up_used = False
        return self._send()


# -- conversations ------------------------------------------------------------------------------

_HOSTS = [b"edge-1:9100", b"edge-1:9100", b"edge-1", b"edge-2:9100", b"10.1.0.1:10250", b"Edge-1"]
_TARGETS = [
    "/metrics",
    "/ping?n=1",
    "/ping?n=2",
    "/ping?n=3",
    "/stats/summary",
    "http://edge-2:9100/metrics",
    "https://edge-1:10250/pods",
    "/exec/ns/pod/c?command=ls",
    "/containerLogs/ns/p/c?follow=true",
    "/m?nodeName=edge-2",
    "/ping?n=4",
    "/ping?n=5",
    "/metrics?x=%41",
]
_BENIGN = [
    (b"User-Agent", b"prometheus/2.48"),
    (b"Accept", b"*/*"),
    (b"Connection", b"keep-alive"),
    (b"Via", b"1.1 other-proxy"),
    (b"X-Forwarded-For", b"10.9.9.9"),
    (b"Proxy-Connection", b"keep-alive"),
    (b"Keep-Alive", b"timeout=5"),
    (b"TE", b"trailers"),
    (b"X-Tunnel-Proxy-Host", b"edge-2"),
    (b"Authorization", b"Bearer t"),
]
_ENDING = [  # fields that end the conversation (a close, an upgrade, a loop): seldom
    (b"Connection", b"close"),
    (b"Connection", b"Upgrade"),
    (b"Upgrade", b"websocket"),
    (b"Via", f"1.1 {VIA}".encode()),
]
_fields = st.tuples(
    st.sampled_from([*_HOSTS, *_HOSTS, b""]),  # b"": no Host
    st.lists(st.sampled_from(_BENIGN * 12 + _ENDING), max_size=4),
)
_body = st.one_of(
    st.just(None),
    st.just(None),
    st.tuples(st.just("length"), st.binary(max_size=12)),
    st.tuples(
        st.just("chunked"),
        st.lists(st.binary(min_size=1, max_size=6), max_size=3),
        st.lists(st.sampled_from([(b"X-Sum", b"1"), (b"Grpc-Status", b"0")]), max_size=2),
    ),
)
_request = st.tuples(
    st.sampled_from(["GET"] * 6 + ["HEAD", "POST", "PUT", "OPTIONS", "CONNECT"]),
    st.sampled_from([*_TARGETS, *_TARGETS, *_TARGETS, "*"]),  # OPTIONS * seldom
    st.sampled_from(["1.1"] * 7 + ["1.0"]),
    st.integers(0, 2),  # which of the connection's field sets
    _body,
)


def _request_bytes(req: tuple[Any, ...], field_sets: list[tuple[bytes, list[Any]]]) -> bytes:
    method, target, version, which, body = req
    host, extra = field_sets[which % len(field_sets)]
    if method == "CONNECT":
        target = "edge-1:10250"
    fields = ([(b"Host", host)] if host else []) + list(extra)
    payload = b""
    if body is not None and body[0] == "length":
        fields.append((b"Content-Length", str(len(body[1])).encode()))
        payload = body[1]
    elif body is not None:
        fields.append((b"Transfer-Encoding", b"chunked"))
        payload = b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in body[1])
        payload += b"0\r\n" + b"".join(k + b": " + v + b"\r\n" for k, v in body[2]) + b"\r\n"
    lines = b"".join(k + b": " + v + b"\r\n" for k, v in fields)
    return f"{method} {target} HTTP/{version}\r\n".encode() + lines + b"\r\n" + payload


def _answer(kind: int, n: int) -> bytes:
    body = b"x" * (n % 7)
    date = b"Date: Sat, 05 Dec 2026 15:%02d:%02d GMT\r\n" % (n % 60, n % 59)
    return [
        b"HTTP/1.1 200 OK\r\n%bContent-Length: %d\r\n\r\n%b" % (date, len(body), body),
        b"HTTP/1.1 200 OK\r\n%bContent-Length: %d\r\n\r\n%b" % (date, len(body), body),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: %d\r\n\r\n" % n,
        b"HTTP/1.1 204 No Content\r\n%b\r\n" % date,
        b'HTTP/1.1 304 Not Modified\r\nETag: "%d"\r\n\r\n' % n,
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\n\r\nuntil the close",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nraw",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokstray",
        b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body),
    ][kind]


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True) if data[a:b]]


@st.composite
def _conversation(draw: st.DrawFn) -> tuple[list[bytes], list[list[bytes]], list[bool]]:
    """A client's reads, the target's answers (each cut in reads) and, per route asked for,
    whether a new Route object is made for it."""
    field_sets = draw(st.lists(_fields, min_size=1, max_size=3))
    requests = draw(st.lists(_request, min_size=2, max_size=8))
    if len(requests) > 2 and draw(st.booleans()):
        requests[-1] = requests[0]  # the same request again
    data = bytearray(b"".join(_request_bytes(r, field_sets) for r in requests))
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 1]))):
        i = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["set", "drop", "double"]))
        if how == "set":
            data[i] = draw(st.sampled_from([0, 10, 13, 32, 58, 65, 127, 200]))
        elif how == "drop":
            del data[i]
        else:
            data.insert(i, data[i])
    if draw(st.booleans()) and len(data) <= 300:
        reads = [bytes(data[i : i + 1]) for i in range(len(data))]
    else:
        reads = _cut(bytes(data), draw(st.lists(st.integers(0, 10**6), max_size=6)))
    answers = [
        _cut(_answer(kind, n), cuts)
        for kind, n, cuts in draw(
            st.lists(
                st.tuples(
                    st.sampled_from([*range(9), *range(9), 9, 10, 11]),  # a 101 seldom
                    st.integers(0, 10**4),
                    st.lists(st.integers(0, 200), max_size=2),
                ),
                min_size=1,
                max_size=6,
            )
        )
    ]
    fresh_routes = draw(st.lists(st.booleans(), min_size=1, max_size=4))
    return reads, answers, fresh_routes


def _view(action: Action, made: list[Route]) -> tuple[object, ...]:
    """An action as data: its kind and fields, a route by the order it was made in, a
    destination by its fields as they are now (its target changes later)."""
    kind = type(action).__name__
    values: list[object] = []
    for f in dataclasses.fields(action):  # type: ignore[arg-type]
        value = getattr(action, f.name)
        if isinstance(value, Route):
            value = next(i for i, r in enumerate(made) if r is value)
        elif isinstance(value, Destination):
            value = dataclasses.astuple(value)
        values.append(value)
    return (kind, *values)


def _drive(
    ex: Exchange, reads: list[bytes], answers: list[list[bytes]], fresh_routes: list[bool]
) -> list[tuple[object, ...]]:
    """The exchange driven as the front drives it: routes given at once (one Route object per
    node and port, made anew when ``fresh_routes`` says), the target connection opened at
    once, the client's body fed while it is not through, then the next answer; a read of
    none (b"") once the client or an answer has no more. What it asked for, in order."""
    log: list[tuple[object, ...]] = []
    routes: dict[tuple[object, ...], Route] = {}
    made: list[Route] = []
    reads, asked, next_answer = list(reads), 0, 0
    pieces: list[bytes] | None = None  # the answer being fed
    actions: list[Action] = []
    client_closed = False
    for _ in range(500):
        stop = False
        while actions:
            action = actions.pop(0)
            if isinstance(action, RouteRequest):
                dest = action.dest
                key = (dest.host, dest.port, dest.pod, dest.scheme)
                fresh = fresh_routes[asked % len(fresh_routes)]
                asked += 1
                if key not in routes or fresh:
                    name = dest.host or "pod-node"
                    # Another object for the same node: another port too (a Host made of it).
                    port = (dest.port or 10250) + len(made) % 3
                    routes[key] = route(name, port, f"10.1.0.{len(made) % 200}")
                    made.append(routes[key])
                log.append(_view(action, made))
                actions[:0] = ex.routed(routes[key])
                continue
            log.append(_view(action, made))
            if isinstance(action, OpenUpstream):
                pieces = None
                actions[:0] = ex.upstream_opened()
            elif isinstance(action, SwitchProtocols):
                log.append(("switch", *ex.switch()))
                stop = True
            elif isinstance(action, (Refuse, Tunnel)) or type(action).__name__ == "Close":
                stop = True
        if stop or ex.phase in ("closed", "switching"):
            break
        if ex.phase == "forwarding":
            if ex._up is None:
                # A malformed body closed the target connection: the front's answer loop
                # finds it gone (its pump stops feeding the exchange).
                actions = ex.upstream_lost()
            elif not ex.body_done and reads:
                actions = ex.receive_client(reads.pop(0))
            elif pieces is None:
                pieces = list(answers[next_answer % len(answers)])
                next_answer += 1
            elif pieces:
                actions = ex.receive_upstream(pieces.pop(0))
            else:
                pieces = None
                actions = ex.receive_upstream(b"")  # the target closed (a retry may follow)
        elif ex.phase == "head":
            pieces = None
            actions = ex.poll()
            if not actions:
                if reads:
                    actions = ex.receive_client(reads.pop(0))
                elif not client_closed:
                    client_closed = True
                    actions = ex.receive_client(b"")
                else:
                    break
        else:
            raise AssertionError(ex.phase)
    log.append(("end", ex.phase, ex.body_done, ex.started, ex.client.midway))
    return log


def _both(reads: list[bytes], answers: list[list[bytes]], fresh_routes: list[bool]) -> None:
    new = _drive(Exchange(via=VIA, max_head=4096), reads, answers, fresh_routes)
    old = _drive(_EbcExchange(via=VIA, max_head=4096), reads, answers, fresh_routes)
    assert new == old
    kinds = [v[0] for v in new]
    event(f"requests routed: {min(kinds.count('RouteRequest'), 4)}")
    up = b"".join(v[1] for v in new if v[0] == "WriteUpstream")  # type: ignore[misc]
    if b"\r\n0\r\nX-" in up or b"\r\n0\r\nGrpc" in up:
        event("a request's trailers sent on")
    for kind in ("Refuse", "Tunnel", "switch", "Looped"):
        if kind in kinds:
            event(kind)


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
_TRAILED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n"
_CHUNKED_POST = (
    b"POST /push HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n"
)
_POD = b"GET /exec/ns/pod/c HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
_VARIED = b"GET /ping?n=%d HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: latency\r\n\r\n"


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conversation())
# A chunked request with trailers, the same again (its END is not the shared one: no replay).
@example(([_CHUNKED_POST, _CHUNKED_POST, _VARIED % 1], [[_OK]], [False]))
# Trailers cut from their chunk's end, and the answer's trailers across reads.
@example(
    (
        [_CHUNKED_POST[:-12], _CHUNKED_POST[-12:-3], _CHUNKED_POST[-3:] + _VARIED % 2],
        [[_TRAILED[:-9], _TRAILED[-9:]], [_OK]],
        [False],
    )
)
# Varied requests, repeated ones, another route object for the same node.
@example(([_VARIED % 1, _VARIED % 2, _VARIED % 2, _VARIED % 1], [[_OK]], [False, True]))
# A pod path without Host (HTTP/1.0), again on another route: the Host made of the route.
@example(([_POD, _POD, _POD], [[_OK]], [False, True]))
# The same fields, another version: another Via.
@example(
    (
        [
            b"GET /a HTTP/1.0\r\nHost: edge-1:9100\r\nConnection: keep-alive\r\n\r\n",
            b"GET /b HTTP/1.1\r\nHost: edge-1:9100\r\nConnection: keep-alive\r\n\r\n",
        ],
        [[_OK]],
        [False],
    )
)
def test_conversations_as_ebcf73b(
    conversation: tuple[list[bytes], list[list[bytes]], list[bool]],
) -> None:
    _both(*conversation)


def test_trailers_go_on_and_a_trailed_request_is_not_replayed() -> None:
    """Not only alike, what it is for: a chunked request's trailers go on to the target, the
    same request again is parsed again (its trailers sent again), and a request without any
    after it is kept for replay with no trailers of the last."""
    ex = Exchange(via=VIA, max_head=4096)
    log = _drive(
        ex, [_CHUNKED_POST, _CHUNKED_POST, _VARIED % 1, _VARIED % 1], [[_TRAILED]], [False]
    )
    sent = b"".join(v[1] for v in log if v[0] == "WriteUpstream")  # type: ignore[misc]
    assert sent.count(b"0\r\nX-Sum: 1\r\n\r\n") == 2
    assert sent.count(b"GET /ping?n=1 HTTP/1.1\r\n") == 2
    to_client = b"".join(v[1] for v in log if v[0] == "WriteClient")  # type: ignore[misc]
    assert to_client.count(b"0\r\nX-T: 1\r\n\r\n") == 4
    parsed = Parsed(response=False)
    parsed.feed(_CHUNKED_POST)
    assert parsed._again is None  # its END carries trailers
    parsed.events.clear()
    parsed.feed(_VARIED % 1)
    assert parsed._again is not None and parsed._again[0] == _VARIED % 1
    again = parsed._again[1]
    assert again is parsed.events[0][1] and isinstance(again, Head) and again.target == "/ping?n=1"
