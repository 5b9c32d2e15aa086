"""Review of branch reqside (issue 15): the request side against 812de76's, differentially.

reqside lets a keep-alive request with the last one's fields (the parse's same ``routing``),
method and version, whose target names no node (:func:`podroutes.same_node`), take the last
:class:`Destination` and :class:`RouteRequest` — the destination retargeted in place, the
router's memo then reused by identity — and builds the head it sends on from the last one's
past the request line (:class:`http_rewrite.RequestHeads`, keyed by the wire, destination and
route objects and the version).

review18/20 and reqside's own tests route each request with a fresh :class:`Route`, so the kept
tail (a route object reused) and the in-place retarget never meet a router. Pinned here, over
generated keep-alive conversations driven as the callbacks drive them — one connection, one
:class:`~ravenproxy.server.router.RouteMemo` carried from request to request, the requests
naming real nodes, pods and agents (Host, X-Tunnel-Proxy-Host, nodeName queries, pod paths,
absolute URIs, CONNECT), and between two requests the model changed, an agent come or gone,
the memo's agent closed or draining (GOAWAY received or sent), its load changed — each request
is refused (status, node, reason), routed (node, target, TLS, agent, memo reused), its target
connection kept or not, its head sent on (the bytes) and its client kept alive as 812de76 does:
its on-request rule for the request alone (review18's oracle, which 812de76 kept) and its
``route_again`` (kept verbatim below), in a twin world (routing spreads load by round-robin
state: one router asked twice would see its own first pick). And ``same_node``'s yes against
812de76's ``find_destination`` (review18's oracle) of the next target. Nothing is imported from
a baseline checkout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import astuple
from typing import Any

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.errors import RoutingError
from ravenproxy.model import Model
from ravenproxy.model.store import ModelStore
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    CloseUpstream,
    OpenUpstream,
    Refuse,
    RouteRequest,
    Tunnel,
)
from ravenproxy.server.http1 import BadRequest
from ravenproxy.server.podroutes import Destination, same_node
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.router import RouteMemo, Router, UpstreamKey
from ravenproxy.transport.session import Session
from tests.helpers import examples

from .test_exchange import VIA
from .test_review18_requests import (
    _OK,
    _OK_HEAD,
    _old_find_destination,
    _old_on_request,
    _old_request_head,
    _parse,
    _sent_on,
)
from .test_review20_requests import _flip_case, _pods_model, gendrain_restamp
from .test_routing import fake, stop

# -- 812de76's route_again and AgentRegistry.live, verbatim (only made functions) ----------------


def _old_live(session: Session) -> bool:
    conn = session.conn
    return not session.closed and conn.goaway_received is None and conn.goaway_sent is None


def _old_route_again(
    self: Router, dest: Destination, over_tls: bool, memo: RouteMemo | None
) -> RouteMemo:
    model, agents = self.store.model, self.registry.generation
    if (
        memo is not None
        and memo.model is model
        and memo.agents == agents
        and (memo.route.session is None or _old_live(memo.route.session))
        and memo.over_tls is over_tls
    ):
        last = memo.dest
        # What routing read of a destination, compared field by field with the one the
        # memo was made for (no key tuple made per request that differs).
        if last is dest or (
            last.host == dest.host
            and last.port == dest.port
            and last.pod == dest.pod
            and last.scheme == dest.scheme
        ):
            return memo
    route = self.route_request(dest, over_tls=over_tls)
    return RouteMemo(over_tls, model, agents, route, dest)


# -- generated conversations naming real nodes, pods and agents -----------------------------------

# test_routing.model(): a, b, c, d in gateway gw (b, c proxy endpoints), solo alone, noip; pods
# (test_review20's _pods_model): ns/p on a (on b once moved), ns/q on c, ns/nowhere on none.
_HOSTS = ["a:9100", "a", "b:10250", "c", "10.0.0.3:9100", "d:9100", "solo:80", "ghost", "A:9100"]
_PATHS = [
    "/metrics",
    "/ping",
    "/ping?n=1",
    "/ping?n=2",
    "/stats/summary",
    "/exec/ns/p/c",
    "/run/ns/q/c",
    "/containerLogs/ns/nowhere/c",
    "/attach/ns/gone/c",
    "/exe/ns/p",
    "/execx/ns/p/c",
    "/metrics?nodeName=c",
    "/metrics?nodeName=c:10250",
    "/m?%6EodeName=b",
    "/m?nodeName=",
    "/nodeName",
    "/a%2Fb",
    "/portForward/ns/p",
]
_OTHER_TARGETS = [
    "http://b:9100/metrics",
    "http://b:9100/x",
    "http://b:09100/metrics",
    "http://a/m",
    "http://a:80/m",
    "https://c:10250/x",
    "http://a/exec/ns/q/c",
    "*",
    "metrics",
]
_TAME = [
    ("Accept", "*/*"),
    ("User-Agent", "Prometheus/2.51"),
    ("Authorization", "Bearer t"),
    ("Accept-Encoding", "gzip"),
    ("Connection", "keep-alive"),
    ("Connection", "close"),
    ("Connection", "Upgrade"),
    ("Upgrade", "websocket"),
    ("Keep-Alive", "timeout=5"),
    ("TE", "trailers"),
    ("Proxy-Connection", "keep-alive"),
    ("X-Tunnel-Proxy-Host", "b:9100"),
    ("X-Tunnel-Proxy-Host", "b"),
    ("X-Tunnel-Proxy-Host", "solo:80"),
    ("Via", "1.1 other"),
    ("Via", f"1.1 {VIA}"),
    ("Expect", "100-continue"),
]


@st.composite
def _line(draw: st.DrawFn) -> tuple[str, str, str]:
    method = draw(st.sampled_from(["GET"] * 6 + ["HEAD", "POST", "OPTIONS", "DELETE", "CONNECT"]))
    if method == "CONNECT":
        target = draw(st.sampled_from(["a:22", "[::1]:22", "b"]))
    elif draw(st.integers(0, 7)) == 0:
        target = draw(st.sampled_from(_OTHER_TARGETS))
    else:
        target = draw(st.sampled_from(_PATHS))
    return method, target, draw(st.sampled_from(["1.1", "1.1", "1.1", "1.0"]))


@st.composite
def _fields(draw: st.DrawFn) -> list[tuple[str, str]]:
    flds = draw(st.lists(st.sampled_from(_TAME), max_size=3, unique=True))
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 1, 0, 2]))):
        flds.append(
            (draw(st.sampled_from(["Host", "host", "HOST"])), draw(st.sampled_from(_HOSTS)))
        )
    framing = draw(st.sampled_from(["none"] * 8 + ["cl3", "chunked"]))
    if framing == "cl3":
        flds.append(("Content-Length", "3"))
    elif framing == "chunked":
        flds.append(("Transfer-Encoding", "chunked"))
    return list(draw(st.permutations(flds)))


@st.composite
def _changed(draw: st.DrawFn, flds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The last request's fields, most often the same (the parse then shares their routing
    and wire); else changed in one way a memo keyed loosely would miss."""
    how = draw(st.sampled_from(["same"] * 10 + ["case", "order", "repeat", "space", "new"]))
    out = list(flds)
    if how == "same" or not out:
        return out
    if how == "new":
        return draw(_fields())
    i = draw(st.integers(0, len(out) - 1))
    name, value = out[i]
    if how == "case":
        out[i] = (_flip_case(name), value)
    elif how == "order" and len(out) > 1:
        out.append(out.pop(i))
    elif how == "repeat":
        out.insert(i, (name, value))
    elif how == "space":
        out[i] = (name, f" {value}")
    return out


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


_CHANGES = ["none"] * 10 + [
    "model",
    "port",
    "agent",
    "remove",
    "close",
    "goaway-received",
    "goaway-sent",
    "load",
]


@st.composite
def _conversation(draw: st.DrawFn) -> list[tuple[bytes, str, str]]:
    """(request, how it is read, what changes in the world before it is routed): most share
    the last one's fields with another target (a scrape's or a poller's next URL)."""
    flds, line = draw(_fields()), draw(_line())
    out = []
    for i in range(draw(st.integers(2, 7))):
        if i:
            flds = draw(_changed(flds))
            how = draw(st.integers(0, 9))
            if how == 0:
                line = (line[0], line[1], "1.0" if line[2] == "1.1" else "1.1")
            elif how == 1:
                pass  # the same request line: the whole request again, or its fields changed
            elif how < 7:  # another path, the method and version kept
                line = (line[0], draw(st.sampled_from(_PATHS)), line[2])
            else:
                line = draw(_line())
        mode = draw(st.sampled_from(["whole"] * 5 + ["crlf", "two", "split"]))
        out.append((_request(line, flds), mode, draw(st.sampled_from(_CHANGES))))
    return out


# -- a twin world per rule --------------------------------------------------------------------


class _World:
    def __init__(self) -> None:
        self.registry = AgentRegistry()
        for name in ("a", "a", "b", "c", "d"):
            self.registry.add(name, fake(name))
        self.store = ModelStore(_pods_model(False))
        self.router = Router(self.store, self.registry, None)
        self.memo: RouteMemo | None = None
        self.route: Any = None
        self.key: UpstreamKey | None = None

    def change(self, how: str) -> None:
        session = self.memo.route.session if self.memo is not None else None
        if how == "model":
            self.store.model = _pods_model(self.store.model.pod("ns", "p").node_name == "a")
        elif how == "port":  # b's kubelet port moved: a destination naming no port goes there
            now = self.store.model
            b = now.node("b")
            assert b is not None
            b = dataclasses.replace(b, kubelet_port=10255 if b.kubelet_port == 10250 else 10250)
            nodes = [b if n.name == "b" else n for n in now.nodes.values()]
            self.store.model = Model.build(nodes, now.gateways.values(), now.pods.values())
        elif how == "agent":
            self.registry.add("a", fake("a"))
        elif how == "load":
            for s in self.registry.sessions():
                s.conn.open_streams = (s.conn.open_streams + 1) % 2 if s is session else 0
        elif session is not None:
            if how == "remove":
                self.registry.remove(session.name, session)
            elif how in ("close", "goaway-received", "goaway-sent"):
                stop(session, how)


def _routed(world: _World, rule: Any, dest: Destination, over_tls: bool) -> tuple[Any, ...]:
    try:
        memo = rule(world.router, dest, over_tls, world.memo)
    except RoutingError as exc:
        return ("refused", exc.status, exc.node, exc.reason)
    reused = memo is world.memo
    world.memo = memo
    r = memo.route
    session = None if r.session is None else r.session.name
    return ("routed", r.node.name, r.target, r.tls, session, reused)


def _new_rule(router: Router, dest: Destination, over_tls: bool, memo: Any) -> RouteMemo:
    return router.route_again(dest, over_tls, memo)  # as the callbacks call it


def _old_rule(router: Router, dest: Destination, over_tls: bool, memo: Any) -> RouteMemo:
    """812de76's, with gendrain's re-stamp of a memo whose agent is still a candidate."""
    return _old_route_again(router, dest, over_tls, gendrain_restamp(router, memo))


def _run(conv: list[tuple[bytes, str, str]], over_tls: bool, data: Any) -> None:
    new, old = _World(), _World()
    ex = Exchange(via=VIA, max_head=4096)
    plan: list[tuple[bytes, str, bytes, str]] = []
    i = 0
    while i < len(conv):
        req, mode, change = conv[i]
        if mode == "two" and i + 1 < len(conv):
            plan += [(req, "two", conv[i + 1][0], change), (conv[i + 1][0], "second", b"", "none")]
            i += 2
            continue
        plan.append((req, "whole" if mode == "two" else mode, b"", change))
        i += 1
    last_dest: Destination | None = None
    for req, mode, after, change in plan:
        new.change(change)
        old.change(change)
        if mode == "second":
            actions = ex.poll()
        elif mode == "split":
            cut = data.draw(st.integers(1, len(req) - 1))
            actions = [*ex.receive_client(req[:cut]), *ex.receive_client(req[cut:])]
        elif mode == "crlf":
            actions = ex.receive_client(b"\r\n" + req)
        else:
            actions = ex.receive_client(req + after)
        head, upgraded, error = _parse(req)
        if head is None:
            assert [a.status for a in actions if isinstance(a, Refuse)] == [400], actions
            return
        want, keep = _old_on_request(head, 4096)
        if want[0] == "refuse":
            assert [a for a in actions if isinstance(a, Refuse)] == [Refuse(*want[1:4])], req
            return
        if want[0] == "tunnel":
            (tunnel,) = [a for a in actions if isinstance(a, Tunnel)]
            assert astuple(tunnel.dest) == want[1]
            return
        (action,) = [a for a in actions if isinstance(a, RouteRequest)]
        assert astuple(action.dest) == want[1], req
        assert ex._client_keep == keep, req
        old_dest = Destination(*want[1])
        if action.dest is last_dest:
            event("the last destination retargeted")
        last_dest = action.dest
        got = _routed(new, _new_rule, action.dest, over_tls)
        assert got == _routed(old, _old_rule, old_dest, over_tls), (req, change)
        event(f"{got[0]}{' (memo reused)' if got[-1] is True else ''}: {old_dest.via}")
        if got[0] == "refused":
            dropped = [CloseUpstream()] if ex._up is not None else []
            assert ex.refused(*got[1:]) == [*dropped, Refuse(*got[1:])]
            return
        assert new.memo is not None and old.memo is not None
        # The target connection: kept for the same route object (the memo's), else another
        # opened, the kept one closed when it goes elsewhere (812de76's Exchange.routed).
        had_up = ex._up is not None
        same = old.memo.route is old.route and had_up
        key = UpstreamKey.of(old.memo.route)
        closes = had_up and not same and key != old.key
        opens = not same and (not had_up or closes)
        old.route = old.memo.route
        if opens:
            old.key = key
        out = ex.routed(new.memo.route)
        opened = any(isinstance(a, OpenUpstream) for a in out)
        assert opened == opens, (req, change)
        assert any(isinstance(a, CloseUpstream) for a in out) == closes, (req, change)
        if opened:
            out = ex.upstream_opened()
        sent = _old_request_head(head, old_dest, old.memo.route, VIA)[0]
        _sent_on(out, error, sent)
        if ex._built is not None and new.memo.route is new.route:
            event("the same route object again: the kept tail may serve")
        new.route = new.memo.route
        if upgraded or error is not None:
            return
        ex.receive_upstream(_OK_HEAD if head.start == "HEAD" else _OK)
        if after and _parse(req + after)[1]:
            assert ex.phase == "closed"
            return
        assert (ex.phase == "head") == keep, (req, ex.phase, keep)
        if not keep:
            return


def _get(target: str, *flds: str, version: str = "1.1") -> bytes:
    lines = "".join(f"{f}\r\n" for f in flds)
    return f"GET {target} HTTP/{version}\r\n{lines}\r\n".encode("latin-1")


_A = ("Host: a:9100", "Accept: */*")
_KA = ("Connection: keep-alive",)


@settings(max_examples=examples(1500), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_conversation(), st.booleans(), st.data())
@example(  # a node named by the next target: never the last destination
    [
        (_get("/metrics", *_A), "whole", "none"),
        (_get("/metrics?nodeName=c", *_A), "whole", "none"),
        (_get("/m?%6EodeName=b", *_A), "whole", "none"),
        (_get("/exec/ns/p/c", *_A), "whole", "none"),
        (_get("/ping", *_A), "whole", "none"),
        (_get("http://b:9100/metrics", *_A), "whole", "none"),
    ],
    False,
    None,
)
@example(  # the memo's agent draining or gone between two requests of the same fields
    [
        (_get("/ping?n=1", *_A), "whole", "none"),
        (_get("/ping?n=2", *_A), "whole", "goaway-received"),
        (_get("/ping?n=3", *_A), "whole", "goaway-sent"),
        (_get("/ping?n=4", *_A), "whole", "close"),
        (_get("/ping?n=5", *_A), "whole", "remove"),
        (_get("/ping?n=6", *_A), "whole", "agent"),
    ],
    True,
    None,
)
@example(  # a pod moved: its path routed anew, the Host's route unchanged
    [
        (_get("/exec/ns/p/c", *_A), "whole", "none"),
        (_get("/exec/ns/p/c", *_A), "whole", "model"),
        (_get("/ping", *_A), "two", "none"),
        (_get("/ping?n=1", *_A), "second", "model"),
    ],
    False,
    None,
)
@example(  # X-Tunnel-Proxy-Host: every origin target goes where it names; HTTP/1.0, no Host
    [
        (
            _get("/a", "X-Tunnel-Proxy-Host: b:9100", "Connection: keep-alive", version="1.0"),
            "whole",
            "none",
        ),
        (
            _get(
                "/b?nodeName=c",
                "X-Tunnel-Proxy-Host: b:9100",
                "Connection: keep-alive",
                version="1.0",
            ),
            "whole",
            "none",
        ),
        (
            _get(
                "/exec/ns/q/c",
                "X-Tunnel-Proxy-Host: b:9100",
                "Connection: keep-alive",
                version="1.0",
            ),
            "whole",
            "load",
        ),
    ],
    False,
    None,
)
@example(  # the same route for another absolute URI's authority (the same node and port)
    [
        (_get("http://a/m", *_A), "whole", "none"),
        (_get("http://a:80/m", *_A), "whole", "none"),
        (_get("http://b:9100/metrics", *_A), "whole", "none"),
        (_get("http://b:09100/metrics", *_A), "whole", "none"),
    ],
    False,
    None,
)
@example(  # no Host: the one sent names the route's port, which moved with the model
    [
        (_get("/a", "X-Tunnel-Proxy-Host: b", *_KA, version="1.0"), "whole", "none"),
        (_get("/b", "X-Tunnel-Proxy-Host: b", *_KA, version="1.0"), "whole", "port"),
        (_get("/c", "X-Tunnel-Proxy-Host: b", *_KA, version="1.0"), "whole", "none"),
    ],
    False,
    None,
)
def test_a_conversation_routed_with_its_memo_goes_as_812de76s(
    conv: list[tuple[bytes, str, str]], over_tls: bool, data: Any
) -> None:
    """Requests on one keep-alive connection (most with the last one's fields and another
    target; read whole, after a CRLF, two in a read, or split), the world changing between
    them: each refused, routed, its target connection kept or not, its head sent on and its
    client kept alive as 812de76's rules and route_again decide for it."""
    _run(conv, over_tls, data)


# -- same_node's yes: 812de76's find_destination of the next target is the last, retargeted ------

_NEAR = st.text(alphabet="/?=&%#+nodeNamxcutip2F6E", max_size=14)


@settings(max_examples=examples(3000), deadline=None)
@given(
    st.sampled_from(["GET", "HEAD", "POST", "OPTIONS"]),
    st.one_of(st.sampled_from(_PATHS), st.builds(lambda t: "/" + t, _NEAR)),
    st.one_of(
        st.sampled_from([*_PATHS, *_OTHER_TARGETS]),
        st.builds(lambda t: "/" + t, _NEAR),
        st.builds(
            lambda p, t: p + t,
            st.sampled_from(["/exec/", "/run/", "/attach/", "/portForward/", "/containerLogs/"]),
            st.sampled_from(["ns/p", "ns/p/c", "ns/", "/p/c", "ns/p?nodeName=c"]),
        ),
    ),
    st.sampled_from([None, "a:9100", "b", " c ", "[::1]:80", "", "bad:port"]),
    st.sampled_from([None, "b:9100", "", "solo"]),
)
@example("GET", "/m", "/m?%6EodeName=c", "a", None)
@example("GET", "/m", "/m?nodeName=c", "a", None)
@example("GET", "/m", "/run/ns/p", "a", None)
@example("GET", "/m", "/m?x=1&nodeName=c", "a", None)
@example("GET", "/m", "/exec/ns/p/c", "a", "")
def test_same_node_says_yes_only_when_812de76_finds_the_last_destination_retargeted(
    method: str, first: str, target: str, host: str | None, tunnel: str | None
) -> None:
    """For the fields and method of a request whose destination ``last`` was, ``same_node(last,
    target)`` may say yes only when 812de76's find_destination of ``target`` is ``last`` with
    ``target`` as its target (every other field the same: node, port, pod, scheme, how)."""
    lower: dict[str, str] = {}
    if host is not None:
        lower["host"] = host
    if tunnel is not None:
        lower["x-tunnel-proxy-host"] = tunnel
    try:
        last = _old_find_destination(method, first, (), lower)
    except BadRequest:
        return
    if not same_node(last, target):
        event("no")
        return
    event(f"yes: {last.via}")
    want = _old_find_destination(method, target, (), lower)
    assert astuple(want) == astuple(dataclasses.replace(last, target=target))
