"""Review of branch routecut (issue 15): routing's objects per request, against f56f100's.

routecut lets a request whose fields are the last request's (the parse then shares their
routing fields) keep the last destination's node when that was named by Host or
X-Tunnel-Proxy-Host and the new target names none itself (:func:`podroutes.same_fields`, since
branch reqside :func:`podroutes.same_node`: the last destination, retargeted):
the Host, keep-alive and Via checks are not run again. Routing is the security edge, so both
are pinned against f56f100's code kept verbatim below (``_old_*``: only renamed; nothing is
imported from a baseline checkout): :func:`find_destination` over generated targets, Host and
X-Tunnel-Proxy-Host values, and whole keep-alive conversations whose requests share their
fields and differ in method-free targets (origin, absolute, asterisk, authority forms,
``nodeName`` plain and %-encoded, pod paths and near misses), request by request against
f56f100's ``Exchange._on_request`` as data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Looped,
    OpenUpstream,
    Refuse,
    RouteRequest,
    Tunnel,
    WriteUpstream,
)
from ravenproxy.server.http1 import BadRequest, split_authority
from ravenproxy.server.http_heads import Head, keeps_alive
from ravenproxy.server.http_messages import HEAD, Parsed
from ravenproxy.server.loops import via_received_by
from ravenproxy.server.podroutes import (
    NODE_NAME_PARAM,
    POD_PATH_PREFIXES,
    TUNNEL_HOST_HEADER,
    find_destination,
    same_node,
)
from tests.helpers import examples

from .test_exchange import VIA, route
from .test_review18_requests import _old_pod_of_path  # db4c494's, unchanged to f56f100

# -- f56f100's rules, verbatim (only renamed) --------------------------------------------------


@dataclass(slots=True)
class _OldDestination:
    via: str
    host: str = ""
    port: int | None = None
    pod: tuple[str, str] | None = None
    target: str = "/"
    authority: str | None = None
    scheme: str | None = None


_OLD_POD_PATH_STARTS = tuple(f"/{prefix}/" for prefix in POD_PATH_PREFIXES)
_OLD_POD_PATH_HEADS = frozenset(start[1:5] for start in _OLD_POD_PATH_STARTS)


_OLD_AUTHORITIES: dict[str, tuple[str, int | None]] = {}
_OLD_AUTHORITIES_MAX = 1024
_old_known_authority = _OLD_AUTHORITIES.get


def _old_authority(text: str) -> tuple[str, int | None]:
    stripped = text.strip()
    try:
        host, port = split_authority(stripped, default_port=0)
    except BadRequest:
        raise BadRequest(400, f"bad node address {stripped[:80]!r}") from None
    parsed = host, (port or None)
    if len(text) <= 300:  # a DNS name is at most 253 characters, a port 6 more
        if len(_OLD_AUTHORITIES) >= _OLD_AUTHORITIES_MAX:
            _OLD_AUTHORITIES.clear()
        _OLD_AUTHORITIES[text] = parsed
    return parsed


def _old_node_name(query: str) -> str | None:
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == NODE_NAME_PARAM and value:
            return value
    return None


def _old_absolute(target: str) -> _OldDestination:
    try:
        url = urlsplit(target)
    except ValueError:  # e.g. an unclosed "[" of an IPv6 literal
        raise BadRequest(400, f"bad absolute URI {target[:80]!r}") from None
    if not url.netloc or "@" in url.netloc:
        raise BadRequest(400, f"bad absolute URI {target[:80]!r}")
    default = 443 if url.scheme == "https" else 80
    uhost, uport = split_authority(url.netloc, default_port=default)
    path = url.path or "/"
    origin = path + (f"?{url.query}" if url.query else "")
    return _OldDestination(
        "absolute-uri", uhost, uport, target=origin, authority=url.netloc, scheme=url.scheme
    )


def _old_find_destination(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    lower: Mapping[str, str] | None = None,
) -> _OldDestination:
    if lower is None:
        lower = {k.lower(): v for k, v in headers}
    if method == "CONNECT":
        chost, cport = split_authority(target)
        return _OldDestination("connect", chost, cport, target=target)
    if target[:1] != "/":
        if target.startswith(("http://", "https://")):
            return _old_absolute(target)
        if target == "*" and method == "OPTIONS":
            raise BadRequest(400, "OPTIONS * names no node")
        raise BadRequest(400, f"bad request target {target[:80]!r}")
    tunnel_host = lower.get(TUNNEL_HOST_HEADER)
    if tunnel_host:
        host, port = _old_known_authority(tunnel_host) or _old_authority(tunnel_host)
        return _OldDestination("tunnel-header", host, port, None, target)
    if NODE_NAME_PARAM in target or "%" in target:
        query = target.partition("?")[2]
        if query and (NODE_NAME_PARAM in query or "%" in query):  # else no key decodes to it
            node_name = _old_node_name(query)
            if node_name is not None:
                host, port = _old_known_authority(node_name) or _old_authority(node_name)
                return _OldDestination("node-name-query", host, port, None, target)
    if target[1:5] in _OLD_POD_PATH_HEADS and target.startswith(_OLD_POD_PATH_STARTS):
        pod = _old_pod_of_path(target)
        if pod is not None:
            return _OldDestination("pod-path", pod=pod, target=target)
    host_header = lower.get("host")
    if not host_header:
        raise BadRequest(400, "the request names no node (no Host, X-Tunnel-Proxy-Host, nodeName)")
    host, port = _old_known_authority(host_header) or _old_authority(host_header)
    return _OldDestination("host", host, port, None, target)


def _old_on_request(request: Head, max_head: int, own_via: str) -> tuple[Any, ...]:
    """f56f100's Exchange._on_request for a request that is not the last one's object, as
    data: ("refuse", status, node, reason, looped) | ("route", dest) | ("tunnel", dest)."""
    if request.size > max_head:
        return ("refuse", 431, "", f"request head larger than {max_head} bytes", False)
    routing = request.routing  # all it reads of the fields (Head.routing: Host, Via, ...)
    host = routing.get("host")
    if (host is None and request.version == "1.1") or (host is not None and "," in host):
        return ("refuse", 400, "", "bad request: an HTTP/1.1 request needs one Host field", False)
    try:
        dest = _old_find_destination(request.start, request.target, (), routing)
    except BadRequest as exc:
        return ("refuse", exc.status, "", exc.reason, False)
    via = routing.get("via")
    if via and own_via in via_received_by([via]):
        node = dest.host or (f"pod {dest.pod[0]}/{dest.pod[1]}" if dest.pod else "")
        why = f"loop detected: the request already passed through this server (Via {own_via})"
        return ("refuse", 508, node, why, True)
    if dest.via == "connect":
        return ("tunnel", astuple(dest))
    return ("route", astuple(dest))


# -- generated requests ------------------------------------------------------------------------

_AUTHORITIES = [
    "edge-1",
    "edge-1:9100",
    "EDGE-1:10250",
    "10.0.0.7",
    "10.0.0.7:80",
    "[::1]:443",
    "[::1]",
    " edge-2 ",
    "edge-1:0",
    "edge-1:99999",
    "edge-1:x",
    "[::1",
    "a b",
    "",
]
_PATHS = [
    "/",
    "/ping",
    "/metrics",
    "/metrics/cadvisor",
    "/exec/ns/pod/c",
    "/exec/ns/pod",
    "/exec/ns/",
    "/exec//pod/c",
    "/execx/ns/pod",
    "/exe",
    "/containerLogs/kube-system/coredns-1/coredns",
    "/attach/ns/p/c",
    "/portForward/ns/p",
    "/run/ns/p/c",
    "/runx/ns/p",
    "/%65xec/ns/pod/c",
    "/a%20b",
    "/stats/summary",
]
_QUERIES = [
    "",
    "?n=1",
    "?n=12345",
    "?follow=true",
    "?nodeName=edge-2",
    "?nodeName=edge-2:9100",
    "?a=1&nodeName=10.0.0.7",
    "?nodeName=",
    "?%6EodeName=edge-2",
    "?node%4Eame=edge-2:80",
    "?nodename=edge-2",
    "?nodeName=bad:port",
    "?q=%",
    "?%ff=1",
    "?x=nodeName",
]


@st.composite
def _target(draw: st.DrawFn) -> str:
    form = draw(st.sampled_from(["origin"] * 12 + ["absolute", "authority", "asterisk", "odd"]))
    if form == "origin":
        return draw(st.sampled_from(_PATHS)) + draw(st.sampled_from(_QUERIES))
    if form == "absolute":
        scheme = draw(st.sampled_from(["http://", "https://"]))
        auth = draw(st.sampled_from(["edge-1:9100", "[::1]:443", "edge-1", "u@edge-1"]))
        return scheme + auth + draw(st.sampled_from(["", "/", "/metrics", "/exec/ns/pod"]))
    if form == "authority":
        return draw(st.sampled_from(["edge-1:443", "[::1]:22", "edge-1"]))
    if form == "asterisk":
        return "*"
    return draw(st.sampled_from(["metrics", "?nodeName=x", "%2Fmetrics"]))


_FIELD = st.one_of(
    st.tuples(st.sampled_from(["Host", "host", "HOST"]), st.sampled_from(_AUTHORITIES)),
    st.tuples(
        st.sampled_from(["X-Tunnel-Proxy-Host", "x-tunnel-proxy-host"]),
        st.sampled_from(_AUTHORITIES),
    ),
    st.tuples(
        st.sampled_from(["Connection", "Proxy-Connection"]),
        st.sampled_from(["close", "keep-alive", "x-foo", "te"]),
    ),
    st.tuples(
        st.just("Via"), st.sampled_from(["1.1 other-proxy", f"1.1 {VIA}", f"1.0 a, 1.1 {VIA}"])
    ),
    st.tuples(st.sampled_from(["Accept", "User-Agent"]), st.sampled_from(["*/*", "curl/8"])),
)


@st.composite
def _fields(draw: st.DrawFn) -> list[tuple[str, str]]:
    flds = draw(st.lists(_FIELD, max_size=4))
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 0, 2]))):  # most requests carry one Host
        flds.append(draw(st.tuples(st.just("Host"), st.sampled_from(_AUTHORITIES[:8]))))
    return list(draw(st.permutations(flds)))


def _head(data: bytes) -> Head | None:
    parsed = Parsed(response=False)
    parsed.feed(data)
    heads = [value for kind, value in parsed.events if kind == HEAD]
    return heads[0] if heads and isinstance(heads[0], Head) else None


def _outcome(fn: Any, *args: Any) -> tuple[Any, ...]:
    try:
        found = fn(*args)
    except BadRequest as exc:
        return ("bad", exc.status, exc.reason)
    return ("dest", astuple(found))


# -- find_destination alone ---------------------------------------------------------------------


@settings(max_examples=examples(1500), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.sampled_from(["GET", "GET", "HEAD", "POST", "OPTIONS", "CONNECT"]),
    _target(),
    _fields(),
)
def test_find_destination_names_what_f56f100s_named(
    method: str, target: str, flds: list[tuple[str, str]]
) -> None:
    lower: dict[str, str] = {}
    for k, v in flds:
        seen = lower.get(k.lower())
        lower[k.lower()] = v if seen is None else f"{seen}, {v}"
    now = _outcome(find_destination, method, target, (), lower)
    assert now == _outcome(_old_find_destination, method, target, (), lower)
    event(now[0] if now[0] == "bad" else now[1][0])
    alone = _outcome(find_destination, method, target, flds)  # the headers alone (no lower)
    assert alone == _outcome(_old_find_destination, method, target, flds)


@settings(max_examples=examples(1000), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.sampled_from(["GET", "OPTIONS"]), _target(), _target(), _fields())
@example("GET", "/ping?n=1", "/exec/ns/pod/c", [("Host", "edge-1")])
@example("GET", "/ping?n=1", "/m?nodeName=edge-2", [("Host", "edge-1")])
@example("GET", "/ping?n=1", "/m?%6EodeName=edge-2", [("Host", "edge-1")])
@example("GET", "/", "http://edge-2/m", [("X-Tunnel-Proxy-Host", "edge-1")])
@example("OPTIONS", "/", "*", [("X-Tunnel-Proxy-Host", "edge-1")])
def test_same_node_keeps_only_what_find_destination_would_find(
    method: str, first: str, then: str, flds: list[tuple[str, str]]
) -> None:
    """same_node(last, target): True only when ``last`` retargeted is
    find_destination's answer for the same method and fields; never another destination."""
    lower = {k.lower(): v for k, v in flds}
    try:
        last = find_destination(method, first, (), lower)
    except BadRequest:
        return
    if not same_node(last, then):
        return
    event(f"kept {last.via}")
    kept = dataclasses.replace(last, target=then)
    assert ("dest", astuple(kept)) == _outcome(_old_find_destination, method, then, (), lower)


# -- whole conversations: one set of fields, targets that differ ---------------------------------

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@settings(max_examples=examples(800), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(st.sampled_from(["GET", "GET", "GET", "HEAD", "OPTIONS"]), min_size=2, max_size=6),
    st.lists(_target(), min_size=2, max_size=6),
    st.sampled_from(["1.1", "1.1", "1.0"]),
    _fields(),
)
@example(["GET"] * 3, ["/a", "/exec/ns/pod/c", "/b?nodeName=edge-2"], "1.1", [("Host", "edge-1")])
@example(["GET"] * 2, ["/a", "/b"], "1.1", [("Host", "edge-1"), ("Via", f"1.1 {VIA}")])
@example(["GET"] * 2, ["/a", "/b"], "1.1", [("Host", "edge-1"), ("Host", "edge-2")])
@example(["GET"] * 2, ["/a", "*"], "1.1", [("X-Tunnel-Proxy-Host", "edge-2")])
@example(["GET", "OPTIONS"], ["/a", "*"], "1.1", [("Host", "edge-1")])
@example(["GET"] * 3, ["/a", "/b", "/c"], "1.0", [("Host", "edge-1")])
@example(["GET"] * 3, ["/a", "/b", "/c"], "1.0", [("Connection", "keep-alive")])
def test_a_conversation_with_the_same_fields_is_routed_as_f56f100_routed_each(
    methods: list[str], targets: list[str], version: str, flds: list[tuple[str, str]]
) -> None:
    """Each request of a keep-alive connection, its fields the last one's (shared routing
    fields), is refused, routed or tunnelled as f56f100 did it alone, and kept alive alike."""
    ex = Exchange(via=VIA, max_head=4096)
    lines = "".join(f"{k}: {v}\r\n" for k, v in flds)
    for method, target in zip(methods, targets, strict=False):
        data = f"{method} {target} HTTP/{version}\r\n{lines}\r\n".encode("latin-1")
        actions = ex.receive_client(data)
        head = _head(data)
        if head is None:  # llhttp refuses it (an odd target): a 400, as before
            assert [a.status for a in actions if isinstance(a, Refuse)] == [400]
            return
        want = _old_on_request(head, 4096, VIA)
        event(f"{want[0]} {want[1] if want[0] == 'refuse' else want[1][0]}")
        if want[0] == "refuse":
            assert [a for a in actions if isinstance(a, Refuse)] == [
                Refuse(want[1], want[2], want[3])
            ], actions
            assert any(isinstance(a, Looped) for a in actions) == want[4]
            return
        if want[0] == "tunnel":
            (tunnel,) = [a for a in actions if isinstance(a, Tunnel)]
            assert astuple(tunnel.dest) == want[1]
            return
        (act,) = [a for a in actions if isinstance(a, RouteRequest)]
        assert astuple(act.dest) == want[1]
        keep = keeps_alive(head)
        assert ex._client_keep == keep
        dest = act.dest
        out = ex.routed(route(dest.host or "pod-node", dest.port or 10250))
        if any(isinstance(a, OpenUpstream) for a in out):
            out = ex.upstream_opened()
        sent = b"".join(a.data for a in out if isinstance(a, WriteUpstream))
        assert sent.startswith(f"{method} {dest.target} HTTP/1.1\r\n".encode("latin-1"))
        ex.receive_upstream(_OK if method != "HEAD" else _OK[:-2])
        assert (ex.phase == "head") == keep, (ex.phase, keep)
        if not keep:
            return
