"""Where a request goes (pure): absolute URI, X-Tunnel-Proxy-Host, ?nodeName=, pod paths, Host;
and which headers travel on (RFC 9110 hop-by-hop rules)."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.server import podroutes
from ravenproxy.server.http1 import BadRequest, split_authority
from ravenproxy.server.podroutes import (
    Destination,
    find_destination,
    forwardable,
    pod_of_path,
    wants_upgrade,
)
from tests.helpers import examples


@pytest.mark.parametrize(
    ("path", "pod"),
    [
        ("/containerLogs/kube-system/coredns-1/coredns?follow=true", ("kube-system", "coredns-1")),
        ("/exec/default/web/app?command=sh&stdin=true", ("default", "web")),
        ("/attach/ns/p/c", ("ns", "p")),
        ("/portForward/ns/p", ("ns", "p")),
        ("/portForward/ns/p?port=80", ("ns", "p")),
        ("/run/ns/p/c", ("ns", "p")),
        ("/exec/ns", None),
        ("/exec//p/c", None),
        ("/metrics", None),
        ("/stats/summary", None),
        ("/containerLogsX/ns/p/c", None),
    ],
)
def test_pod_of_path(path: str, pod: tuple[str, str] | None) -> None:
    assert pod_of_path(path) == pod


def test_absolute_uri_is_a_forward_proxy_request() -> None:
    d = find_destination("GET", "http://edge-1:9100/metrics?x=1", [("Host", "edge-1:9100")])
    assert d == Destination(
        "absolute-uri",
        "edge-1",
        9100,
        target="/metrics?x=1",
        authority="edge-1:9100",
        scheme="http",
    )
    d = find_destination("GET", "http://edge-1", [])
    assert (d.host, d.port, d.target) == ("edge-1", 80, "/")
    d = find_destination("GET", "https://[fd00::1]/x", [])
    assert (d.host, d.port, d.scheme) == ("fd00::1", 443, "https")


def test_order_header_then_query_then_pod_then_host() -> None:
    headers = [("Host", "edge-2:1"), ("X-Tunnel-Proxy-Host", "edge-1:10255")]
    target = "/exec/ns/p/c?nodeName=edge-3"
    assert find_destination("GET", target, headers).via == "tunnel-header"
    assert find_destination("GET", target, headers[:1]) == Destination(
        "node-name-query", "edge-3", None, target=target
    )
    d = find_destination("GET", "/exec/ns/p/c", headers[:1])
    assert (d.via, d.pod, d.host) == ("pod-path", ("ns", "p"), "")
    d = find_destination("GET", "/metrics", headers[:1])
    assert (d.via, d.host, d.port) == ("host", "edge-2", 1)


def test_ports_default_to_the_kubelet() -> None:
    assert find_destination("GET", "/", [("Host", "edge-1")]).port is None
    assert find_destination("GET", "/?nodeName=edge-1", []).port is None
    assert find_destination("GET", "/?nodeName=edge-1:9100", []).port == 9100
    assert find_destination("GET", "/", [("X-Tunnel-Proxy-Host", "edge-1")]).port is None


def test_connect() -> None:
    d = find_destination("CONNECT", "edge-1:10250", [])
    assert (d.via, d.host, d.port) == ("connect", "edge-1", 10250)
    with pytest.raises(BadRequest):
        find_destination("CONNECT", "edge-1", [])


@pytest.mark.parametrize(
    ("method", "target", "headers"),
    [
        ("GET", "/", []),  # names nothing
        ("GET", "/", [("Host", "edge-1:x")]),
        ("GET", "/", [("X-Tunnel-Proxy-Host", ":80")]),
        ("GET", "/?nodeName=edge-1:99999", []),
        ("OPTIONS", "*", [("Host", "edge-1")]),
        ("GET", "edge-1/x", [("Host", "edge-1")]),
        ("GET", "", [("Host", "edge-1")]),
        ("GET", "HTTP://edge-1/", [("Host", "edge-1")]),  # not absolute-form as parsed here
        ("GET", "http://user@edge-1/", []),
        ("GET", "http:///x", []),
    ],
)
def test_bad_destinations_are_400(method: str, target: str, headers: list[tuple[str, str]]) -> None:
    with pytest.raises(BadRequest) as info:
        find_destination(method, target, headers)
    assert info.value.status == 400


def test_hop_by_hop_fields_are_dropped() -> None:
    headers = [
        ("Host", "edge-1"),
        ("Connection", "keep-alive, X-Private"),
        ("Connection", "close"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("X-Private", "secret"),
        ("TE", "trailers"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "websocket"),
        ("Proxy-Authorization", "Basic x"),
        ("X-Tunnel-Proxy-Host", "edge-1:1"),
        ("Accept", "*/*"),
        ("Trailer", "X-Checksum"),
    ]
    assert forwardable(headers) == [
        ("Host", "edge-1"),
        ("Accept", "*/*"),
        ("Trailer", "X-Checksum"),
    ]


def test_connection_cannot_strip_framing_or_host() -> None:
    headers = [("Connection", "content-length, host"), ("Content-Length", "3"), ("Host", "a")]
    assert forwardable(headers) == [("Content-Length", "3"), ("Host", "a")]


def test_upgrade_keeps_its_fields() -> None:
    headers = [
        ("Connection", "Upgrade"),
        ("Upgrade", "SPDY/3.1"),
        ("X-Stream-Protocol-Version", "v4"),
    ]
    upgrade = wants_upgrade(headers)
    assert upgrade == "SPDY/3.1"
    assert forwardable(headers, upgrade=upgrade) == [
        ("X-Stream-Protocol-Version", "v4"),
        ("Connection", "Upgrade"),
        ("Upgrade", "SPDY/3.1"),
    ]
    assert wants_upgrade([("Upgrade", "websocket")]) is None  # Connection must list it
    assert wants_upgrade([("Connection", "keep-alive, Upgrade"), ("upgrade", "websocket")]) == (
        "websocket"
    )


def test_an_unparseable_absolute_uri_is_a_400_not_a_crash() -> None:
    # Found by tests/unit/server/test_http_fuzz.py: urlsplit raises ValueError on it.
    with pytest.raises(BadRequest) as info:
        find_destination("GET", "http://[::1/", [("Host", "edge-1")])
    assert info.value.status == 400


def _node_name_by_parse(query: str) -> str | None:
    """The rule ``_node_name`` replaced: every query parsed."""
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "nodeName" and value:
            return value
    return None


_QUERY_PARTS = st.sampled_from(
    [
        "nodeName",
        "node%4Eame",
        "%6eodeName",
        "node",
        "Name",
        "ame",
        "%4E",
        "%4e",
        "%65",
        "%",
        "%2",
        "+",
        "=",
        "&",
        "edge-1",
    ]
)


@settings(max_examples=examples(500), deadline=None)
@given(parts=st.lists(_QUERY_PARTS | st.text(max_size=3), max_size=8))
def test_node_name_is_what_parsing_every_query_finds(parts: list[str]) -> None:
    """A query is parsed only where a key could decode to ``nodeName``: for any query (the
    name spelled out, percent-encoded in part, mangled), the request goes where parse_qsl's
    answer says (else by its Host)."""
    query = "".join(parts)
    name = _node_name_by_parse(query)
    try:
        dest = find_destination("GET", f"/metrics?{query}", [("Host", "edge-1")])
    except BadRequest as exc:  # a name that is no host[:port]
        assert name is not None and exc.status == 400
        return
    if name is None:
        assert (dest.via, dest.host) == ("host", "edge-1")
    else:
        host, port = split_authority(name.strip(), default_port=0)
        assert (dest.via, dest.host, dest.port) == ("node-name-query", host, port or None)


_SEGMENTS = st.sampled_from(
    ["", "/", "?", "exec", "containerLogs", "attach", "portForward", "run", "runX", "ns", "p"]
)


@settings(max_examples=examples(500), deadline=None)
@given(parts=st.lists(_SEGMENTS | st.text(max_size=2), max_size=7))
def test_a_pod_path_is_found_only_where_it_begins_as_one(parts: list[str]) -> None:
    """find_destination asks pod_of_path only of a target that begins ``/<prefix>/``: for any
    target, it routes by the pod exactly when pod_of_path finds one."""
    target = "/" + "/".join(parts)
    pod = pod_of_path(target)
    try:
        dest = find_destination("GET", target, [("Host", "edge-1")])
    except BadRequest:  # a nodeName in the query that is no host[:port]
        return
    if pod is not None:
        assert (dest.via, dest.pod) == ("pod-path", pod)
    else:
        assert dest.via in ("host", "node-name-query")


_AUTHORITY_PARTS = st.sampled_from(["edge-1", "EDGE-2", ":", "[", "]", "fd00::1", "10250", " "])


@settings(max_examples=examples(500), deadline=None)
@given(
    parts=st.lists(_AUTHORITY_PARTS | st.text(max_size=3), min_size=1, max_size=5),
    header=st.sampled_from(["Host", "X-Tunnel-Proxy-Host"]),
)
def test_a_remembered_authority_routes_as_one_parsed_anew(parts: list[str], header: str) -> None:
    """The same Host (or X-Tunnel-Proxy-Host) value again is not parsed again: the answer,
    or the refusal, is the same as the first time's."""

    def routed() -> tuple[object, ...]:
        try:
            dest = find_destination("GET", "/metrics", [(header, value)])
        except BadRequest as exc:
            return ("refused", exc.status, exc.reason)
        return (dest.via, dest.host, dest.port)

    value = "".join(parts)
    podroutes._AUTHORITIES.clear()
    first = routed()
    assert routed() == first
    assert (value in podroutes._AUTHORITIES) == (first[0] != "refused" and bool(value.strip()))


def test_remembered_authorities_are_bounded() -> None:
    podroutes._AUTHORITIES.clear()
    for i in range(podroutes._AUTHORITIES_MAX + 10):
        find_destination("GET", "/", [("Host", f"edge-{i}:10250")])
    assert 0 < len(podroutes._AUTHORITIES) <= podroutes._AUTHORITIES_MAX
    long = "e" * 400
    assert find_destination("GET", "/", [("Host", long)]).host == long
    assert long not in podroutes._AUTHORITIES


def test_a_percent_encoded_node_name_key_still_routes() -> None:
    dest = find_destination("GET", "/metrics?node%4Eame=edge-2:10250", [("Host", "edge-1")])
    assert (dest.via, dest.host, dest.port) == ("node-name-query", "edge-2", 10250)
    dest = find_destination("GET", "/containerLogs/ns/p/c?follow=true", [("Host", "edge-1")])
    assert (dest.via, dest.pod) == ("pod-path", ("ns", "p"))
