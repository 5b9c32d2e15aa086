"""Review of branches srvhttp and srvfront (issue 15): the server's request side against
3466b61's, differentially.

srvhttp reuses the last head's field lines and routing fields when a request's fields are the
last one's (its request line differing), reads an HTTP/1.1 request's version from its request
line, and makes method names and Via lines once. srvfront routes a varied request with fewer
calls (find_destination's pre-checks asked of the whole target, a pod path's start told by its
four characters, route_again comparing the memo's destination field by field, no key tuple).

Pinned here, over generated keep-alive conversations whose requests mostly share the last
one's fields (same, or differing only in a name's case, their order, a repetition, whitespace)
while their request lines differ (every form of target, nodeName queries, pod paths, absolute
URIs, HTTP/1.0 and 1.1, leading CRLFs, reads split or pipelined) and whose head-size limit sits
at one request's exact size: each request is refused, routed, sent on and kept alive as
3466b61's rules say of it alone. The oracles are test_review18_requests' (db4c494's rules,
which 3466b61 kept: that module's tests pass on it), imported, not copied again; 3466b61's
``route_again`` is kept below verbatim. Nothing is imported from a baseline checkout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import astuple
from typing import Any

import pytest
from httptools import HttpParserError, HttpParserUpgrade, HttpRequestParser
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.errors import RoutingError
from ravenproxy.model import Model
from ravenproxy.model.objects import Pod
from ravenproxy.model.store import ModelStore
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import OpenUpstream, Refuse, RouteRequest, Tunnel
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import HEAD, Parsed
from ravenproxy.server.http_rewrite import response_framing
from ravenproxy.server.podroutes import Destination, find_destination
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import Router
from tests.helpers import examples

from .test_exchange import VIA
from .test_review18_requests import (
    _AUTHORITIES,
    _FIELD,
    _HOST,
    _METHODS,
    _OK,
    _OK_HEAD,
    _Collect,
    _old_find_destination,
    _old_keeps_alive,
    _old_on_request,
    _old_request_head,
    _outcome,
    _parse,
    _route_for,
    _sent_on,
    _target,
)
from .test_routing import fake, model, registry, stop
from .test_srvhttp_requests import _OldParsed
from .test_srvhttp_requests import _view as _srvhttp_view

# -- generated conversations: requests sharing the last one's fields -------------------------------

_MORE_PATHS = [
    "/run/",
    "/run/ns/pod",
    "/run/ns/pod/c",
    "/cont",
    "/containerLog/ns/pod",
    "/containerLogsx/ns/pod",
    "/portForward/ns/pod/x",
    "/port/ns/pod",
    "/atta/ns/pod",
    "/attach//pod",
    "/exe/ns/pod",
    "/nodeName=edge-2/x",
    "/a%2Fb/c",
    "/%nodeName",
    "/exec/ns/pod?nodeName=edge-2",
    "/exec/ns/pod?%6EodeName=edge-2:9100",
    "/metrics?x=nodeName",
    "/metrics?nodeName",
    "/metrics#?nodeName=edge-2",
]


@st.composite
def _line(draw: st.DrawFn) -> tuple[str, str, str]:
    """A request line: method, target (every form review18 draws, and paths near the pod and
    nodeName pre-checks), version."""
    method = draw(st.sampled_from(_METHODS))
    if draw(st.integers(0, 3)) == 0:
        target = draw(st.sampled_from(_MORE_PATHS))
    else:
        target = draw(_target(method))
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    return method.decode(), target, version


def _flip_case(name: str) -> str:
    return name.swapcase() if name != name.swapcase() else name


@st.composite
def _changed(draw: st.DrawFn, flds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The last request's fields, most often the same; else changed in one way a memo keyed
    loosely would miss."""
    how = draw(
        st.sampled_from(
            ["same"] * 8 + ["case", "order", "repeat", "space", "value", "drop", "add", "new"]
        )
    )
    out = list(flds)
    if how == "same" or (not out and how in ("case", "order", "repeat", "space", "value", "drop")):
        return out
    if how == "new":
        return draw(_fields())
    if how == "add":
        out.insert(draw(st.integers(0, len(out))), draw(st.one_of(_FIELD, _HOST)))
        return out
    i = draw(st.integers(0, len(out) - 1))
    name, value = out[i]
    if how == "case":
        out[i] = (_flip_case(name), value)
    elif how == "order" and len(out) > 1:
        j = draw(st.integers(0, len(out) - 1))
        out[i], out[j] = out[j], out[i]
    elif how == "repeat":
        out.insert(i, (name, value))
    elif how == "space":  # optional whitespace llhttp strips (or not, inside the value)
        out[i] = (
            name,
            draw(st.sampled_from([f" {value}", f"{value} ", f"\t{value}", f"{value}x"])),
        )
    elif how == "value":
        out[i] = (name, value[:-1] if value else "x")
    elif how == "drop":
        del out[i]
    return out


_TAME = st.lists(
    st.sampled_from(
        [
            ("Accept", "*/*"),
            ("User-Agent", "Prometheus/2.51"),
            ("Authorization", "Bearer t"),
            ("Connection", "keep-alive"),
            ("Accept-Encoding", "gzip"),
            ("X-Tunnel-Proxy-Host", "edge-3:10250"),
        ]
    ),
    max_size=3,
    unique=True,
)


@st.composite
def _fields(draw: st.DrawFn) -> list[tuple[str, str]]:
    """A request's fields: a client's usual ones (one good Host), or review18's odd ones."""
    if draw(st.booleans()):
        host = draw(st.sampled_from(["edge-1:9100", "edge-2", "[::1]:10250", "10.1.0.1:80"]))
        return list(draw(st.permutations([("Host", host), *draw(_TAME)])))
    flds = draw(st.lists(_FIELD, max_size=4))
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 0, 2]))):
        flds.append(draw(_HOST))
    framing = draw(st.sampled_from(["none"] * 6 + ["cl3", "chunked"]))
    if framing == "cl3":
        flds.append(("Content-Length", "3"))
    elif framing == "chunked":
        flds.append(("Transfer-Encoding", "chunked"))
    return list(draw(st.permutations(flds)))


def _request(line: tuple[str, str, str], flds: list[tuple[str, str]]) -> bytes:
    method, target, version = line
    lines = "".join(f"{k}: {v}\r\n" for k, v in flds)
    head = f"{method} {target} HTTP/{version}\r\n{lines}\r\n".encode("latin-1")
    names = {k.lower().strip(): v.strip() for k, v in flds}
    if "transfer-encoding" in names:
        return head + b"3\r\nabc\r\n0\r\n\r\n"
    if names.get("content-length") == "3":
        return head + b"abc"
    return head


@st.composite
def _conversation(draw: st.DrawFn) -> list[bytes]:
    """Requests on one connection, each with the last one's fields (or nearly) and its own
    request line (sometimes the last one's too: the whole request again)."""
    flds = draw(_fields())
    line = draw(_line())
    out = [_request(line, flds)]
    for _ in range(draw(st.integers(1, 5))):
        flds = draw(_changed(flds))
        how = draw(st.integers(0, 7))
        if how == 0:  # the version alone changed: the line as long, llhttp's version differing
            line = (line[0], line[1], "1.0" if line[2] == "1.1" else "1.1")
        elif how > 1:
            line = draw(_line())
        out.append(_request(line, flds))
    return out


_CONVERSATION = st.tuples(
    _conversation(),
    st.lists(st.sampled_from(["whole"] * 5 + ["crlf", "two", "split"]), min_size=6, max_size=6),
    st.integers(0, 11),
    st.integers(-1, 1),
    st.data(),
)


def _run_conversation(
    requests: list[bytes], modes: list[str], limit: int, slack: int, data: Any
) -> None:
    """Feed the requests to one Exchange (each a read, with a CRLF before it, two pipelined in
    one read, or split over two) and hold each outcome against 3466b61's rules for it alone."""
    sized = [_parse(r)[0] for r in requests]
    # The limit at one request's exact size (``slack`` around it), or far (``limit`` past the
    # requests): most conversations then go on to their end.
    at = sized[limit] if limit < len(sized) else None
    max_head = max(64, at.size + slack) if at is not None else 4096
    ex = Exchange(via=VIA, max_head=max_head)
    plan: list[tuple[bytes, str, bytes]] = []
    i = 0
    while i < len(requests):
        mode = modes[i]
        if mode == "two" and i + 1 < len(requests):
            plan += [(requests[i], "two", requests[i + 1]), (requests[i + 1], "second", b"")]
            i += 2
            continue
        plan.append((requests[i], "whole" if mode == "two" else mode, b""))
        i += 1
    shared: object = None
    for req, mode, after in plan:
        if mode == "second":
            actions = ex.poll()
        elif mode == "split":
            # Its first part within the limit (past it, the unfinished head's own 431, whatever
            # the bytes: Exchange's rule, unchanged).
            cut = data.draw(st.integers(1, max(1, min(len(req) - 1, max_head))))
            actions = [*ex.receive_client(req[:cut]), *ex.receive_client(req[cut:])]
        elif mode == "crlf":
            actions = ex.receive_client(b"\r\n" + req)
        else:
            actions = ex.receive_client(req + after)
        old, upgraded, old_error = _parse(req)
        if old is None:
            assert [a.status for a in actions if isinstance(a, Refuse)] == [400], actions
            return
        want, keep = _old_on_request(old, max_head)
        event(f"{mode}: {want[0]} {want[1] if want[0] == 'refuse' else want[1][0]}")
        if want[0] == "refuse":
            refusals = [a for a in actions if isinstance(a, Refuse)]
            assert refusals == [Refuse(want[1], want[2], want[3])], (req, actions)
            assert not any(isinstance(a, RouteRequest) for a in actions)
            return
        if want[0] == "tunnel":
            (tunnel,) = [a for a in actions if isinstance(a, Tunnel)]
            assert astuple(tunnel.dest) == want[1]
            return
        routes = [a for a in actions if isinstance(a, RouteRequest)]
        assert len(routes) == 1, (req, actions)
        request = ex._request
        assert request is not None
        if request.routing is shared:
            event(f"routed: the last head's fields and routing reused ({routes[0].dest.via})")
        shared = request.routing
        assert astuple(routes[0].dest) == want[1], req
        assert ex._client_keep == keep, req
        r = _route_for(routes[0].dest)
        out = ex.routed(r)
        if any(isinstance(a, OpenUpstream) for a in out):
            out = ex.upstream_opened()
        _sent_on(out, old_error, _old_request_head(old, routes[0].dest, r, VIA)[0])
        if upgraded or old_error is not None:
            return
        ex.receive_upstream(_OK_HEAD if old.start == "HEAD" else _OK)
        if after and _parse(req + after)[1]:
            assert ex.phase == "closed"
            return
        assert (ex.phase == "head") == keep, (req, ex.phase, keep)
        if not keep:
            return


@settings(max_examples=examples(1200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_CONVERSATION)
@example(
    (
        [
            b"GET /a HTTP/1.1\r\nHost: edge-1:9100\r\nAccept: */*\r\n\r\n",
            b"GET /a?nodeName=edge-2 HTTP/1.1\r\nHost: edge-1:9100\r\nAccept: */*\r\n\r\n",
            b"GET http://edge-3:80/a HTTP/1.1\r\nHost: edge-1:9100\r\nAccept: */*\r\n\r\n",
            b"GET /exec/ns/pod/c HTTP/1.0\r\nHost: edge-1:9100\r\nAccept: */*\r\n\r\n",
        ],
        ["whole"] * 6,
        0,
        0,
        None,
    )
)
@example(
    (
        [
            b"GET /a HTTP/1.1\r\nHost: edge-1:9100\r\nConnection: x\r\n\r\n",
            b"GET /a HTTP/1.1\r\nhost: edge-1:9100\r\nConnection: x\r\n\r\n",
            b"GET /b HTTP/1.1\r\nConnection: x\r\nHost: edge-1:9100\r\n\r\n",
            b"GET /c HTTP/1.1\r\nHost: edge-1:9100\r\nHost: edge-1:9100\r\nConnection: x\r\n\r\n",
        ],
        ["whole"] * 6,
        0,
        0,
        None,
    )
)
@example(
    (
        [
            b"GET /a HTTP/1.1\r\nHost: edge-1:9100\r\nVia: 1.1 other\r\n\r\n",
            f"GET /b HTTP/1.1\r\nHost: edge-1:9100\r\nVia: 1.1 {VIA}\r\n\r\n".encode(),
        ],
        ["whole"] * 6,
        0,
        0,
        None,
    )
)
@example(
    (
        [
            b"GET /a HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
            b"GET /ab HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",  # one byte over the limit
        ],
        ["whole"] * 6,
        0,
        0,
        None,
    )
)
@example(
    (
        [
            b"GET /a HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
            b"GET /b HTTP/1.0\r\nHost: edge-1:9100\r\n\r\n",  # pipelined: not its read's start
        ],
        ["two"] * 6,
        0,
        1,
        None,
    )
)
def test_a_conversation_sharing_fields_is_answered_as_3466b61_did(conv: Any) -> None:
    """Each request of a keep-alive conversation — its fields the last one's or nearly, its
    request line its own — refused (status, node, reason), routed, sent on (the bytes) and kept
    alive as 3466b61's rules say of it alone, the head-size limit at one request's size."""
    requests, modes, limit, slack, data = conv
    _run_conversation(requests, modes, limit, slack, data)


# -- a head's version, size, wire and routing over reads: its own, not the last one's ------------


@settings(max_examples=examples(800), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    _conversation(),
    st.lists(st.sampled_from(["", "\r\n", "\r\n\r\n", "\n"]), min_size=6, max_size=6),
)
def test_each_head_is_its_own_whatever_the_last_one_was(
    requests: list[bytes], leads: list[str]
) -> None:
    """Each head Parsed queues — its fields the last head's or nearly, bytes before it (CRLFs
    llhttp skips) or none — has the version, size, wire, routing fields and decoded forms of
    its own bytes parsed alone."""
    parsed = Parsed(response=False, max_tail=8192)
    for req, lead in zip(requests, leads, strict=False):
        old, upgraded, error = _parse(req)
        if parsed.feed(lead.encode() + req) is not None or upgraded:
            return
        heads = [v for k, v in parsed.events if k == HEAD]
        parsed.events.clear()
        if old is None:
            return
        assert len(heads) == 1
        (head,) = heads
        assert isinstance(head, Head)
        fresh = Parsed(response=False)
        fresh.feed(req)
        (alone,) = [v for k, v in fresh.events if k == HEAD]
        assert isinstance(alone, Head)
        assert (head.start, head.target, head.version, head.size) == (
            old.start,
            old.target,
            old.version,
            old.size,
        )
        assert head.fields == old.fields
        assert head.wire == alone.wire and head.routing == alone.routing
        assert head.headers == old.headers and head.lower == old.lower
        if error is not None or parsed.in_head or parsed.in_body or not _old_keeps_alive(old):
            return  # llhttp takes no more (after a "close", or an HTTP/1.0 without keep-alive)


# -- find_destination's pre-checks -----------------------------------------------------------------


_PREFIXES = ["/containerLogs/", "/exec/", "/attach/", "/portForward/", "/run/"]


@settings(max_examples=examples(1500), deadline=None)
@given(
    st.one_of(
        st.sampled_from(_MORE_PATHS),
        st.builds(
            lambda p, rest: p + rest,
            st.sampled_from(
                [*_PREFIXES, *(p[:-1] for p in _PREFIXES), *(p[:5] for p in _PREFIXES), "/", "//"]
            ),
            st.text(alphabet="ns/pod%?=&nodeNamex#", max_size=16),
        ),
    ),
    st.sampled_from([None, *_AUTHORITIES[:6]]),
    st.sampled_from([None, "edge-3:9100", "", "[::1"]),
    st.sampled_from(["GET", "OPTIONS", "HEAD"]),
)
@example("/run/ns/pod", "edge-1", None, "GET")
@example("/run/ns", "edge-1", None, "GET")
@example("/x?%6EodeName=edge-2", "edge-1", None, "GET")
@example("/x%3F?nodeName=edge-2", "edge-1", None, "GET")
@example("/nodeName?x", "edge-1", None, "GET")
def test_find_destination_is_3466b61s_for_origin_targets(
    target: str, host: str | None, tunnel: str | None, method: str
) -> None:
    """Targets near every pre-check: a pod prefix whole, cut, or its four characters alone;
    ``nodeName`` or ``%`` in the path, in the query, in both; X-Tunnel-Proxy-Host or Host."""
    lower: dict[str, str] = {}
    if host is not None:
        lower["host"] = host
    if tunnel is not None:
        lower["x-tunnel-proxy-host"] = tunnel
    assert _outcome(find_destination, method, target, (), lower) == _outcome(
        _old_find_destination, method, target, (), lower
    )


# -- route_again: 3466b61's, verbatim (only made a function of the router) -------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _OldMemo:
    key: tuple[str, int | None, tuple[str, str] | None, str | None, bool]
    model: Model
    agents: int
    route: Any
    dest: Destination


def _old_route_again(
    self: Router, dest: Destination, *, over_tls: bool, memo: _OldMemo | None
) -> _OldMemo:
    model, agents = self.store.model, self.registry.generation
    if (
        memo is not None
        and memo.model is model
        and memo.agents == agents
        and (memo.route.session is None or self.registry.live(memo.route.session))
    ):
        key = memo.key
        if memo.dest is dest and key[4] is over_tls:
            return memo
        if key == (dest.host, dest.port, dest.pod, dest.scheme, over_tls):
            return memo
    key = (dest.host, dest.port, dest.pod, dest.scheme, over_tls)
    return _OldMemo(key, model, agents, self.route_request(dest, over_tls=over_tls), dest)


def _pods_model(moved: bool) -> Model:
    base = model()
    pods = [
        Pod("ns", "p", node_name="b" if moved else "a"),
        Pod("ns", "q", node_name="c"),
        Pod("ns", "nowhere"),
    ]
    return Model.build(base.nodes.values(), base.gateways.values(), pods)


_DESTS = st.one_of(
    st.builds(
        Destination,
        st.sampled_from(["host", "tunnel-header", "node-name-query", "absolute-uri"]),
        st.sampled_from(["a", "b", "c", "solo", "ghost", "10.0.0.1", "A"]),
        st.sampled_from([None, 10250, 9100, 443, 80]),
        st.none(),
        st.sampled_from(["/", "/metrics"]),
        st.sampled_from([None, "a:9100"]),
        st.sampled_from([None, "http", "https"]),
    ),
    st.builds(
        Destination,
        st.just("pod-path"),
        st.just(""),
        st.sampled_from([None, 10250]),
        st.sampled_from([("ns", "p"), ("ns", "q"), ("ns", "nowhere"), ("ns", "gone")]),
        st.sampled_from(["/exec/ns/p/c", "/run/ns/q"]),
    ),
)


@settings(max_examples=examples(800), deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(_DESTS, st.just("again")),
            st.booleans(),
            st.sampled_from(["none"] * 6 + ["model", "agent", "close", "goaway"]),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_route_again_decides_as_3466b61s(steps: list[Any]) -> None:
    """A connection's requests routed one after another with its memo (the same destination
    object again, an equal one, one differing in one field routing reads; TLS from the client
    or not; the model changed, an agent came, the memo's session closed or told to go away):
    each time the same route, or the same refusal, and the memo reused exactly when 3466b61
    reused it (a memo whose agent is still a candidate re-stamped: gendrain)."""
    # Two like worlds, one routed by each rule: routing picks among candidates by their state
    # (one router asked twice would see its own first pick).
    worlds = [_world(), _world()]
    memos: list[Any] = [None, None]
    dest: Destination | None = None
    for picked, over_tls, change in steps:
        if picked == "again":
            if dest is None:
                continue
            # An equal destination, not the same object (the exchange's next request to the
            # same node), or the same object (its same request again).
            picked = dataclasses.replace(dest) if change == "none" else dest
        dest = picked
        outcomes: list[Any] = []
        for (store, reg, router), memo, rule in zip(
            worlds, memos, (_new_route_again, _old_route_again_positional), strict=True
        ):
            if change == "model":
                store.model = _pods_model(True)
            elif change == "agent":
                reg.add("b", fake("b"))
            elif change in ("close", "goaway") and memo is not None:
                session = memo.route.session
                if session is not None:
                    stop(session, "close" if change == "close" else "goaway-received")
            try:
                got = rule(router, dest, over_tls, memo)
            except RoutingError as exc:
                outcomes.append(("refused", exc.status, exc.node, exc.reason))
                continue
            r = got.route
            session = None if r.session is None else r.session.name
            outcomes.append(("routed", r.node, r.target, r.tls, session, got is memo))
            memos[len(outcomes) - 1] = got
        assert outcomes[0] == outcomes[1], dest


def _world() -> tuple[ModelStore, AgentRegistry, Router]:
    reg = registry(**{n: [fake(n)] for n in ("a", "b", "c", "d")})
    store = ModelStore(_pods_model(False))
    return store, reg, Router(store, reg, None)


def _new_route_again(router: Router, dest: Destination, over_tls: bool, memo: Any) -> Any:
    return router.route_again(dest, over_tls, memo)


def _old_route_again_positional(
    router: Router, dest: Destination, over_tls: bool, memo: Any
) -> Any:
    return _old_route_again(router, dest, over_tls=over_tls, memo=gendrain_restamp(router, memo))


def gendrain_restamp(router: Router, memo: Any) -> Any:
    """Before an old rule (3466b61's, 812de76's) is asked, gendrain's one change: a memo whose
    registry generation moved while its agent is still one routing would choose (another
    agent came, not a better one; another agent drained or ended) is re-stamped at the new
    generation rather than routed anew: another agent's coming or drain leaves a client, and
    its kept connection, where it is (test_drain_others.py)."""
    if memo is None or memo.agents == router.registry.generation:
        return memo
    session, model = memo.route.session, router.store.model
    if memo.model is not model:
        return memo
    if session is not None:
        candidates = router.registry.candidates(model, memo.route.node.name)
        if not any(s is session for s in candidates):
            return memo
    return dataclasses.replace(memo, agents=router.registry.generation)


def test_route_again_takes_its_arguments_by_position_and_by_name() -> None:
    """The callbacks call it positionally now; a caller by keyword (the task path's tests,
    plugins) gets the same memo."""
    reg = registry(a=[fake("a")])
    router = Router(ModelStore(model()), reg, None)
    dest = Destination("host", "a", 9100, target="/m")
    memo = router.route_again(dest, False, None)
    assert router.route_again(dest, over_tls=False, memo=memo) is memo
    assert router.route_again(dataclasses.replace(dest, target="/x"), False, memo) is memo
    with pytest.raises(RoutingError):
        router.route_again(Destination("host", "ghost", 9100), False, memo)


# -- answers: srvhttp's response head built inline, against 3466b61's Parsed ----------------------

_ANSWER_LINES = [
    b"HTTP/1.1 200 OK",
    b"HTTP/1.1 200 OK",
    b"HTTP/1.0 200 OK",
    b"HTTP/1.1 200 Fine",
    b"HTTP/1.1 201 OK",
    b"HTTP/1.1 204 No Content",
    b"HTTP/1.1 304 Not Modified",
    b"HTTP/1.1 404 ",
    b"HTTP/1.1 500",
    b"HTTP/1.1 200 \xe9t\xe9",
]
_INTERIM = [
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
    b"HTTP/1.1 102 Processing\r\nConnection: keep-alive\r\n\r\n",
]
_ANSWER_FIELD = st.sampled_from(
    [
        b"Date: Sat, 05 Dec 2026 06:00:00 GMT",
        b"Date: Sat, 05 Dec 2026 06:00:01 GMT",
        b"Content-Type: text/plain",
        b"content-type: text/plain",
        b"Connection: close",
        b"Connection: keep-alive",
        b"Connection: x-foo",
        b"X-Foo: 1",
        b"Proxy-Connection: close",
        b"Keep-Alive: timeout=5",
        b"Upgrade: h2c",
        b"TE: trailers",
        b"Trailer: X-T",
        b"Via: 1.1 other",
        b"Server:  x ",
        b"X-\xe9: \xe9",
        b"Set-Cookie: a=1",
        b"Set-Cookie: a=1",
    ]
)


@st.composite
def _answer(draw: st.DrawFn) -> bytes:
    """One answer: interim answers or none, a final head, its body as its framing says (a
    Content-Length in odd forms, chunked with trailers, or none: close-framed)."""
    flds = draw(st.lists(_ANSWER_FIELD, max_size=4))
    framing = draw(
        st.sampled_from(["cl"] * 4 + ["cl-lower", "cl-0", "cl-lead", "chunked", "gzip", "none"])
    )
    body = b""
    if framing == "cl":
        flds.append(b"Content-Length: 2")
        body = b"ok"
    elif framing == "cl-lower":
        flds.append(b"content-length: 2")
        body = b"ok"
    elif framing == "cl-0":
        flds.append(b"Content-Length: 0")
    elif framing == "cl-lead":
        flds.append(b"Content-Length: 002")
        body = b"ok"
    elif framing == "chunked":
        flds.append(b"Transfer-Encoding: chunked")
        body = b"2\r\nok\r\n0\r\n" + draw(st.sampled_from([b"", b"X-T: 1\r\n"])) + b"\r\n"
    elif framing == "gzip":
        flds.append(b"Transfer-Encoding: gzip")
    flds = list(draw(st.permutations(flds)))
    line = draw(st.sampled_from(_ANSWER_LINES))
    interim = b"".join(draw(st.lists(st.sampled_from(_INTERIM), max_size=2)))
    return interim + b"\r\n".join([line, *flds]) + b"\r\n\r\n" + body


@st.composite
def _answers(draw: st.DrawFn) -> list[bytes]:
    """A target connection's answers: often the last one again, or it with its Date changed
    (a scrape's answer), or another."""
    out = [draw(_answer())]
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.sampled_from(["same", "date", "status", "version", "new"]))
        last = out[-1]
        if how == "same":
            out.append(last)
        elif how == "date":
            out.append(last.replace(b"06:00:00", b"06:00:09"))
        elif how == "version":  # the same head but its version (llhttp's, per answer)
            if b"HTTP/1.1 200" in last:
                out.append(last.replace(b"HTTP/1.1 200", b"HTTP/1.0 200"))
            else:
                out.append(last.replace(b"HTTP/1.0 200", b"HTTP/1.1 200"))
        elif how == "status":
            out.append(last.replace(b" 200 OK\r\n", b" 200 Fine\r\n", 1))
        else:
            out.append(draw(_answer()))
    return out


def _answer_view(event: tuple[int, object], bodiless: bool) -> object:
    kind, value = event
    if kind != HEAD:
        return event
    assert isinstance(value, Head)
    framing = None
    if value.status >= 200:
        framing = tuple(
            response_framing(
                value,
                bodiless=bodiless,
                request_version=version,
                client_keep=keep,
                upstream=up,
            )
            for version in ("1.1", "1.0")
            for keep in (True, False)
            for up in (True, False)
        )
    return (_srvhttp_view(event), value.plain, framing)


@settings(max_examples=examples(600), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_answers(), st.booleans(), st.data())
def test_answers_parse_and_go_on_as_3466b61s(
    answers: list[bytes], bodiless: bool, data: Any
) -> None:
    """A target connection's answers (interim ones, HEAD's, 204/304, close-framed, chunked with
    trailers, odd Content-Lengths, hop-by-hop fields; repeated, or with their Date changed), in
    reads cut anywhere: every event, every head (its fields, size, wire, plainness) and the head
    and framing the client gets for it, as 3466b61's Parsed gives them."""
    new, old = Parsed(response=True, max_tail=8192), _OldParsed(response=True, max_tail=8192)
    whole = b"".join(answers)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=3)))
    for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True):
        new.bodiless = old.bodiless = bodiless
        assert new.feed(whole[a:b]) == old.feed(whole[a:b])
        got = [_answer_view(e, bodiless) for e in new.events]
        assert got == [_answer_view(e, bodiless) for e in old.events]
        new.events.clear()
        old.events.clear()


# -- the version read from the request line: every cut of odd lines ------------------------------

_ODD_LINES = [
    b"GET /a HTTP/1.1\r\n",
    b"GET /a HTTP/1.0\r\n",
    b"GET  /a HTTP/1.1\r\n",
    b"GET /a  HTTP/1.1\r\n",
    b"GET /a HTTP/1.1 \r\n",
    b"GET /a HTTP/1.1\n",
    b"GET /a HTTP/1.0\n",
    b"GET /HTTP/1.1 HTTP/1.0\r\n",
    b"GET /a?x=%20HTTP/1.1 HTTP/1.0\r\n",
    b"OPTIONS * HTTP/1.1\r\n",
    b"CONNECT edge-1:443 HTTP/1.0\r\n",
    b"M-SEARCH /a HTTP/1.0\r\n",
    b"get /a HTTP/1.1\r\n",
    b"GET /a HTTP/1.2\r\n",
    b"GET /a HTTP/2.0\r\n",
    b"GET /a HTTP/0.9\r\n",
    b"GET /a http/1.1\r\n",
    b"GET http://edge-1/ HTTP/1.0\r\n",
]


@pytest.mark.parametrize("line", _ODD_LINES)
@pytest.mark.parametrize("lead", [b"", b"\r\n", b"\n", b"\r\n\r\n"])
def test_the_version_is_llhttps_at_every_cut(line: bytes, lead: bytes) -> None:
    """A request line llhttp takes in odd forms (extra spaces, LF alone, CRLFs before it, a
    target holding `` HTTP/1.1``), its version another than 1.1, after a first request on the
    connection or not, cut anywhere: the head's version is llhttp's (or both refuse it)."""
    first = b"GET /first HTTP/1.1\r\nHost: edge-1\r\n\r\n"
    for before in (b"", first):
        # A field whose value ends `` HTTP/1.1``: the same bytes, not at the line's end.
        data = before + lead + line + b"Host: edge-1\r\nX-A: b HTTP/1.1\r\n\r\n"
        collect = _Collect()
        parser = collect.parser = HttpRequestParser(collect)
        try:
            parser.feed_data(data)
        except (HttpParserError, HttpParserUpgrade):
            pass
        want = [e for e in collect.order if isinstance(e[0], str) and e[0] not in ("head", "end")]
        for cut in range(len(data) + 1):
            parsed = Parsed(response=False)
            for part in (data[:cut], data[cut:]):
                if part:
                    parsed.feed(part)
            got = [
                (value.start, value.version)
                for kind, value in parsed.events
                if kind == HEAD and isinstance(value, Head)
            ]
            assert got == want, cut
