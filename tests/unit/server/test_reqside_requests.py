"""Branch reqside (issue 15): a keep-alive connection's next request with the last one's fields.

Such a request (a scrape's or a poller's next URL: the parse shares the last request's
``wire`` and ``routing`` then) takes the last :class:`Destination` and :class:`RouteRequest`,
retargeted, when its target names no other node (:func:`podroutes.same_node`), and the head it
sends on is the last one's past the request line (:class:`http_rewrite.RequestHeads`). The
bytes sent on are the security edge (hop-by-hop fields dropped, Host set, Via added, chunking
kept, upgrades), so :class:`RequestHeads` is pinned against 812de76's ``request_head`` kept
verbatim below (``_old_*``: only renamed; nothing is imported from a baseline checkout) over
generated conversations on one connection, with the destination each request had at 812de76
(found anew) and routes that change or stay.
"""

from __future__ import annotations

import dis
import sys

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.model import Model, Node, NodeAddress
from ravenproxy.model.store import ModelStore
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import OpenUpstream, RouteRequest, WriteUpstream
from ravenproxy.server.http1 import BadRequest
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import END, HEAD, Parsed
from ravenproxy.server.http_rewrite import Outbound, fields
from ravenproxy.server.podroutes import (
    HOP_BY_HOP,
    Destination,
    find_destination,
    forwardable,
    same_node,
    wants_upgrade,
)
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import Route, Router
from tests.helpers import examples

from .bd24_requests import RoutedHeads
from .test_exchange import VIA, route
from .test_routing import fake

# -- 812de76's request_head, verbatim (only renamed; Outbound, fields, forwardable, wants_upgrade
# and HOP_BY_HOP are unchanged) ---------------------------------------------------------------

_old_outbound = tuple.__new__

_OLD_VIA_LINES: dict[tuple[str, str], bytes] = {}
_old_via_line = _OLD_VIA_LINES.get


def _old_via_line_made(key: tuple[str, str]) -> bytes:
    line = f"Via: {key[0]} {key[1]}\r\n\r\n".encode("latin-1")
    if len(_OLD_VIA_LINES) < 64:  # llhttp's versions by the processes' tokens: a few
        _OLD_VIA_LINES[key] = line
    return line


def _old_request_head(request: Head, dest: Destination, route: Route, via: str) -> Outbound:
    """The head to send on: hop-by-hop fields dropped (RFC 9110 §7.6.1), ``Host`` set for the
    destination, the body's chunking kept, ``Via`` added."""
    routing = request.routing  # all it reads of a request that goes on as parsed
    if dest.authority is None and "host" in routing and HOP_BY_HOP.isdisjoint(routing):
        # Nothing dropped, nothing added but Via (no Connection, no Transfer-Encoding: no
        # upgrade, no chunking): the fields as parsed, joined in C — the bytes fields() makes
        # of their decoded form (latin-1 round-trips), without a format per field.
        lines = request.wire  # the fields' lines, as parsed
        key = (request.version, via)
        via_line = _old_via_line(key) or _old_via_line_made(key)
        line = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
        return _old_outbound(Outbound, (b"".join((line, lines, b"\r\n", via_line)), False, False))
    headers, lower = request.headers, request.lower
    upgrade = wants_upgrade(headers) if "connection" in lower else None
    out = forwardable(headers, upgrade=upgrade, names=lower)
    if dest.authority is not None:
        out = [(k, v) for k, v in out if k.lower() != "host"]
        out.insert(0, ("Host", dest.authority))
    elif "host" not in lower:
        out.insert(0, ("Host", f"{dest.host or route.node.name}:{route.target.port}"))
    chunked = "chunked" in lower.get("transfer-encoding", "").lower()
    if chunked:
        out.append(("Transfer-Encoding", "chunked"))
    # RFC 9110 §7.6.3; also how a request that comes back here is recognised.
    out.append(("Via", f"{request.version} {via}"))
    head = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
    return Outbound(head + fields(out) + b"\r\n", upgrade is not None, chunked)


# -- generated conversations -------------------------------------------------------------------

_FIELDS = [
    (b"Host", [b"edge-1", b"edge-1:9100", b"EDGE-1:10250", b"10.0.0.1:80"]),
    (b"host", [b"edge-1:9100"]),
    (b"User-Agent", [b"prometheus/2.5", b"\xe9t\xe9", b""]),
    (b"Accept", [b"*/*", b"text/plain;q=0.9"]),
    (b"Authorization", [b"Bearer x"]),
    (b"Connection", [b"close", b"keep-alive", b"Upgrade", b"upgrade, X-Foo", b"te", b"X-Foo"]),
    (b"Proxy-Connection", [b"keep-alive", b"close"]),
    (b"Keep-Alive", [b"timeout=5"]),
    (b"Upgrade", [b"websocket", b"SPDY/3.1"]),
    (b"TE", [b"trailers"]),
    (b"Transfer-Encoding", [b"chunked", b"gzip, chunked"]),
    (b"X-Tunnel-Proxy-Host", [b"edge-2", b"edge-1:9100"]),
    (b"Content-Length", [b"0"]),
    (b"Via", [b"1.1 other-proxy"]),
    (b"X-Foo", [b"bar"]),
    (b"Expect", [b"100-continue"]),
]
_field = st.one_of(*(st.tuples(st.just(name), st.sampled_from(values)) for name, values in _FIELDS))
_TARGETS = [
    "/",
    "/metrics",
    "/metrics",
    "/ping?n=1",
    "/ping?n=1",
    "/ping?n=2",
    "/ping?n=2",
    "/ping?n=3",
    "/stats/summary",
    "/m?nodeName=edge-2",
    "/m?%6EodeName=edge-2",
    "/a%20b",
    "/exec/ns/pod/c",
    "/containerLogs/ns/p/c",
    "/execx/ns/p",
    "http://edge-2:9100/m",
    "https://edge-1/x?y=1",
    "*",
]
_field_sets = st.lists(st.lists(_field, max_size=5), min_size=1, max_size=2)
_steps = st.lists(
    st.tuples(
        st.sampled_from(["GET", "GET", "HEAD", "POST", "OPTIONS"]),
        st.sampled_from(_TARGETS),
        st.sampled_from(["1.1", "1.1", "1.0"]),
        st.sampled_from([0, 0, 0, 1]),  # which field set
        st.booleans(),  # a new route object for the same node
    ),
    min_size=1,
    max_size=8,
)


def _request_bytes(
    method: str, target: str, version: str, flds: list[tuple[bytes, bytes]]
) -> bytes:
    lines = b"".join(k + b": " + v + b"\r\n" for k, v in flds)
    return f"{method} {target} HTTP/{version}\r\n".encode() + lines + b"\r\n"


@settings(max_examples=examples(1500), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_field_sets, _steps)
@example(
    [[(b"Host", b"edge-1:9100"), (b"User-Agent", b"latency")]],
    [("GET", "/ping?n=1", "1.1", 0, False), ("GET", "/ping?n=2", "1.1", 0, False)],
)
@example(
    [[(b"Host", b"edge-1"), (b"Transfer-Encoding", b"chunked")], [(b"Host", b"edge-1")]],
    [
        ("POST", "/a", "1.1", 0, False),
        ("POST", "/b", "1.1", 0, False),
        ("GET", "/c", "1.1", 1, False),
    ],
)
@example(
    [[(b"X-Tunnel-Proxy-Host", b"edge-2"), (b"Connection", b"keep-alive")]],
    [("GET", "/a", "1.1", 0, False), ("GET", "/b", "1.1", 0, True), ("GET", "/c", "1.0", 0, False)],
)
@example(
    [[(b"Host", b"edge-1")]],
    [("GET", "/a", "1.1", 0, False), ("GET", "http://edge-2:9100/m", "1.1", 0, False)],
)
@example(  # another version, the same fields: another Via
    [[(b"Host", b"edge-1"), (b"Connection", b"keep-alive")]],
    [("GET", "/a", "1.0", 0, False), ("GET", "/b", "1.1", 0, False)],
)
@example(  # another route: the Host made of its port
    [[(b"X-Tunnel-Proxy-Host", b"edge-2"), (b"Connection", b"keep-alive")]],
    [("GET", "/a", "1.0", 0, False), ("GET", "/b", "1.0", 0, True)],
)
@example(  # another destination, the same route: the Host of an absolute URI
    [[(b"Host", b"edge-1:80")]],
    [("GET", "http://edge-1/m", "1.1", 0, False), ("GET", "/a", "1.1", 0, False)],
)
@example(
    [[(b"Host", b"edge-1"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")]],
    [("GET", "/ws", "1.1", 0, False)],
)
@example(
    [[(b"Host", b"edge-1"), (b"Connection", b"X-Foo"), (b"X-Foo", b"bar"), (b"TE", b"trailers")]],
    [
        ("GET", "/a", "1.1", 0, False),
        ("GET", "/b", "1.1", 0, False),
        ("HEAD", "/c", "1.1", 0, True),
    ],
)
def test_request_heads_are_812de76s_request_head_over_a_conversation(
    field_sets: list[list[tuple[bytes, bytes]]],
    steps: list[tuple[str, str, str, int, bool]],
) -> None:
    """Each request of one connection, parsed by one :class:`Parsed` (the same fields share
    their wire and routing, as a keep-alive client's do), sends on through one
    :class:`RequestHeads` what 812de76's request_head sent for it with the destination found
    anew — also when the exchange's destination is the last one retargeted."""
    parsed = Parsed(response=False)
    heads = RoutedHeads(VIA)
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
            fresh = find_destination(request.start, request.target, (), request.routing)
        except BadRequest:
            return  # refused by the exchange: nothing is sent on
        if fresh.via == "connect":
            return
        dest = fresh
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
                event("destination retargeted")
        key = (fresh.host or "pod-node", fresh.port or 10250)
        if new_route or key not in routes:  # another route (its node's port moved)
            routes[key] = route(key[0], key[1] + len(routes))
        r = routes[key]
        reused = heads._wire is request.wire
        got = heads.head(request, dest, r)
        want = _old_request_head(request, fresh, r, VIA)
        assert got == tuple(want), (request.start, request.target, flds)
        rule = "as parsed" if request.wire + b"\r\nVia" in want.head else "rewritten"
        event(f"{rule}, upgrade {want.upgrade} chunked {want.chunked}, fields again {reused}")
        if rest is not None:
            return  # an upgrade: the connection is no longer HTTP
        if parsed.events and parsed.events[0][0] != END:
            return
        if not parsed.events:
            parsed.feed(b"0\r\n\r\n" if want.chunked else b"")
        if not parsed.events or parsed.events.popleft()[0] != END or parsed.events:
            return  # a body still expected (a Content-Length): the conversation ends here
        last = (request, dest)


def test_the_kept_tail_serves_only_the_same_fields_version_destination_and_route() -> None:
    """One destination object throughout (the exchange's, retargeted): each request differs
    from the one before in one of what the tail was made for, and is sent on as 812de76 sent
    it (X-Tunnel-Proxy-Host without Host: the Host is made of the route's port)."""
    parsed, heads = Parsed(response=False), RoutedHeads(VIA)
    dest = Destination("tunnel-header", "edge-1", None, None, "/")
    fields_ = b"X-Tunnel-Proxy-Host: edge-1\r\nConnection: keep-alive\r\n"
    first, moved = route("edge-1", 10250), route("edge-1", 10251)
    steps = [
        (b"GET /a HTTP/1.1\r\n" + fields_, first),
        (b"GET /b HTTP/1.1\r\n" + fields_, first),  # the tail again
        (b"GET /c HTTP/1.1\r\n" + fields_, moved),  # another route
        (b"GET /d HTTP/1.0\r\n" + fields_, moved),  # another version
        (b"GET /e HTTP/1.0\r\n" + fields_ + b"Accept: */*\r\n", moved),  # other fields
        (b"GET /f HTTP/1.0\r\n" + fields_ + b"Accept: */*\r\n", moved),
    ]
    sent = []
    for data, r in steps:
        parsed.feed(data + b"\r\n")
        (_, request), (end, _) = parsed.events.popleft(), parsed.events.popleft()
        assert isinstance(request, Head) and end == END
        dest.target = request.target
        got = heads.head(request, dest, r)
        assert got == tuple(_old_request_head(request, dest, r, VIA))
        sent.append(got[0])
    assert b"Host: edge-1:10251\r\n" in sent[2] and b"Via: 1.0 " in sent[3]
    assert b"Accept" in sent[4]
    other = Destination("tunnel-header", "edge-2", None, None, "/f")  # another destination
    assert heads.head(request, other, r) == tuple(_old_request_head(request, other, r, VIA))
    assert b"Host: edge-2:10251\r\n" in heads.head(request, other, r)[0]


# -- through the exchange and the router ---------------------------------------------------------


def _router() -> Router:
    node = Node(name="edge-1", addresses=(NodeAddress("InternalIP", "10.0.0.1"),))
    other = Node(name="edge-2", addresses=(NodeAddress("InternalIP", "10.0.0.2"),))
    registry = AgentRegistry()
    registry.add("edge-1", fake("edge-1"))
    registry.add("edge-2", fake("edge-2"))
    return Router(ModelStore(Model.build([node, other])), registry, None)


def _sent(ex: Exchange, actions: list[object]) -> bytes:
    if any(isinstance(a, OpenUpstream) for a in actions):
        actions = list(ex.upstream_opened())
    return b"".join(a.data for a in actions if isinstance(a, WriteUpstream))


def test_a_next_request_with_the_same_fields_goes_where_the_last_went_with_its_own_target() -> None:
    """The second request's RouteRequest and Destination are the first one's, retargeted; the
    router's memo answers it by identity; the head carries the second target. A target that
    names another node gets a destination of its own (the first one's stays as it was)."""
    router, ex = _router(), Exchange(via=VIA, max_head=4096)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    fields_ = b"Host: edge-1:9100\r\nUser-Agent: t\r\n\r\n"
    (first,) = ex.receive_client(b"GET /a HTTP/1.1\r\n" + fields_)
    assert isinstance(first, RouteRequest)
    memo = router.route_again(first.dest, False, None)
    assert _sent(ex, ex.routed(memo.route)).startswith(b"GET /a HTTP/1.1\r\nHost: edge-1:9100\r\n")
    ex.receive_upstream(answer)
    (second,) = ex.receive_client(b"GET /b?x=1 HTTP/1.1\r\n" + fields_)
    assert second is first and second.dest.target == "/b?x=1"
    assert router.route_again(second.dest, False, memo) is memo
    sent = _sent(ex, ex.routed(memo.route))
    assert (
        sent
        == b"GET /b?x=1 HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: t\r\nVia: 1.1 %s\r\n\r\n"
        % (VIA.encode())
    )
    ex.receive_upstream(answer)
    (third,) = ex.receive_client(b"GET /m?nodeName=edge-2 HTTP/1.1\r\n" + fields_)
    assert isinstance(third, RouteRequest) and third is not first
    assert (third.dest.host, third.dest.target) == ("edge-2", "/m?nodeName=edge-2")
    assert first.dest.target == "/b?x=1"
    again = router.route_again(third.dest, False, memo)
    assert again is not memo and again.route.node.name == "edge-2"
    assert _sent(ex, ex.routed(again.route)).startswith(b"GET /m?nodeName=edge-2 HTTP/1.1\r\n")


def _load_phase(ex: Exchange) -> object:
    return ex.phase


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="Python 3.11's specializations")
def test_an_exchange_keeps_its_attributes_in_shared_key_values() -> None:
    """Python 3.11 keeps an instance's attributes in shared-key values up to 29 of them; an
    Exchange that sets a 30th gets a dict of its own, on which no attribute load specializes
    (seen on this branch: a repeated request and answer cost +1 950 instructions)."""
    router, ex = _router(), Exchange(via=VIA, max_head=4096)
    (action,) = ex.receive_client(b"GET /a HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n")
    assert isinstance(action, RouteRequest)
    _sent(ex, ex.routed(router.route_again(action.dest, False, None).route))
    ex.receive_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    for _ in range(64):  # past the adaptive counter: the load specializes, or gives up
        _load_phase(ex)
    [load] = [i for i in dis.get_instructions(_load_phase, adaptive=True) if "ATTR" in i.opname]
    assert load.opname == "LOAD_ATTR_INSTANCE_VALUE", f"{len(vars(ex))} attributes"
