"""The HTTP exchange, sans-I/O: bytes and routes in, actions out (no sockets, no event loop)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from ravenproxy.model import Node, NodeAddress
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    CloseUpstream,
    Looped,
    OpenUpstream,
    ReadBody,
    Refuse,
    RouteRequest,
    SwitchProtocols,
    Tunnel,
    WriteClient,
    WriteUpstream,
)
from ravenproxy.server.router import Route, UpstreamKey
from ravenproxy.wire.frames import Target

VIA = "ravenproxy-test-0000"


def route(name: str, port: int = 9100, ip: str = "10.1.0.1", *, tls: bool = False) -> Route:
    node = Node(name=name, addresses=(NodeAddress("InternalIP", ip),))
    return Route(node, Target(name, ip, port), None, tls=tls)


def kinds(actions: Sequence[Action]) -> list[type]:
    return [type(a) for a in actions]


def to_client(actions: Sequence[Action]) -> bytes:
    return b"".join(a.data for a in actions if isinstance(a, WriteClient))


def counted(actions: Sequence[Action]) -> list[int]:
    """The statuses the client writes count (an answer's head: once)."""
    return [a.status for a in actions if isinstance(a, WriteClient) and a.status]


def to_upstream(actions: Sequence[Action]) -> bytes:
    """What went to the target, lower-cased (h11 keeps the client's field-name case)."""
    return b"".join(a.data for a in actions if isinstance(a, WriteUpstream)).lower()


def only(actions: Sequence[Action], kind: type) -> Action:
    found = [a for a in actions if isinstance(a, kind)]
    assert len(found) == 1, actions
    return found[0]


def get(path: str, host: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_keep_alive_to_two_nodes() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    pipelined = get("/a", "edge-1:9100") + get("/b", "edge-1:9100") + get("/c", "edge-2:9100")
    actions = ex.receive_client(pipelined)
    dest = only(actions, RouteRequest).dest  # type: ignore[attr-defined]
    assert (dest.host, dest.port, dest.target) == ("edge-1", 9100, "/a")
    edge1 = route("edge-1")
    assert kinds(ex.routed(edge1)) == [OpenUpstream]
    sent = to_upstream(ex.upstream_opened())
    assert sent.startswith(b"get /a http/1.1\r\nhost: edge-1:9100\r\n")
    assert f"via: 1.1 {VIA}\r\n".encode() in sent
    actions = ex.receive_upstream(OK)
    assert counted(actions) == [200] and to_client(actions).endswith(b"\r\n\r\nok")
    assert ex.phase == "head"

    # The same node again: the kept target connection carries it, nothing is opened.
    assert only(ex.poll(), RouteRequest).dest.target == "/b"  # type: ignore[attr-defined]
    actions = ex.routed(route("edge-1"))
    assert kinds(actions) == [WriteUpstream] and to_upstream(actions).startswith(b"get /b ")
    assert to_client(ex.receive_upstream(OK)).endswith(b"ok")

    # Another node: the kept connection is closed, a new one opened.
    assert only(ex.poll(), RouteRequest).dest.host == "edge-2"  # type: ignore[attr-defined]
    assert kinds(ex.routed(route("edge-2", ip="10.1.0.2"))) == [CloseUpstream, OpenUpstream]
    assert to_upstream(ex.upstream_opened()).startswith(b"get /c http/1.1\r\nhost: edge-2:9100")
    assert to_client(ex.receive_upstream(OK)).endswith(b"ok")
    assert ex.poll() == [] and ex.phase == "head"


def test_upstream_key_is_what_a_kept_connection_must_match() -> None:
    assert UpstreamKey.of(route("edge-1")) == UpstreamKey(0, "10.1.0.1", 9100, False)
    assert UpstreamKey.of(route("edge-1", tls=True)) != UpstreamKey.of(route("edge-1"))


def test_a_kept_connection_closed_while_idle_is_retried_once() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/a", "edge-1:9100") + get("/b", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    ex.receive_upstream(OK)
    ex.poll()
    first = to_upstream(ex.routed(route("edge-1")))
    # The target had closed the kept connection: no answer at all.
    assert kinds(ex.receive_upstream(b"")) == [CloseUpstream, OpenUpstream]
    assert to_upstream(ex.upstream_opened()) == first  # the same request, whole
    # The new connection is not retried again: a 502 names the node (h11 calls a close
    # before any answer a protocol error).
    refusal = only(ex.receive_upstream(b""), Refuse)
    assert isinstance(refusal, Refuse) and (refusal.status, refusal.node) == (502, "edge-1")
    assert refusal.reason.startswith("bad response from the target")


def test_connect_tunnels_with_the_bytes_past_the_head() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    actions = ex.receive_client(b"CONNECT edge-1:10250 HTTP/1.1\r\nHost: x\r\n\r\n\x16\x03\x01")
    tunnel = only(actions, Tunnel)
    assert isinstance(tunnel, Tunnel)
    assert (tunnel.dest.host, tunnel.dest.port, tunnel.rest) == ("edge-1", 10250, b"\x16\x03\x01")
    assert ex.phase == "closed"


def test_upgrade_switches_protocols_on_101() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    head = (
        b"GET /exec/ns/pod/c HTTP/1.1\r\nHost: edge-1:10250\r\n"
        b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"
    )
    ex.receive_client(head + b"client-early")
    ex.routed(route("edge-1", 10250, tls=True))
    sent = to_upstream(ex.upstream_opened())
    assert b"connection: upgrade\r\n" in sent and b"upgrade: spdy/3.1\r\n" in sent
    answer = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n"
    assert kinds(ex.receive_upstream(answer + b"target-early")) == [SwitchProtocols]
    response, client_rest, target_rest = ex.switch()
    assert response.startswith(b"HTTP/1.1 101 ") and b"upgrade: spdy/3.1\r\n" in response.lower()
    assert (client_rest, target_rest) == (b"client-early", b"target-early")


def test_101_without_an_upgrade_request_is_a_bad_response() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    actions = ex.receive_upstream(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n")
    assert kinds(actions) == [CloseUpstream, Refuse]
    assert only(actions, Refuse).status == 502  # type: ignore[attr-defined]


def test_expect_100_continue_is_carried() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(
        b"PUT /x HTTP/1.1\r\nHost: edge-1:9100\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    )
    ex.routed(route("edge-1"))
    actions = ex.upstream_opened()
    assert kinds(actions) == [WriteUpstream, ReadBody]  # the body waits for the 100
    assert b"expect: 100-continue\r\n" in to_upstream(actions)
    assert to_client(ex.receive_upstream(b"HTTP/1.1 100 Continue\r\n\r\n")).startswith(
        b"HTTP/1.1 100 "
    )
    assert to_upstream(ex.receive_client(b"hello")) == b"hello"
    assert ex.body_done
    actions = ex.receive_upstream(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
    assert counted(actions) == [201] and to_client(actions).startswith(b"HTTP/1.1 201 ")
    assert ex.phase == "head"


def test_content_length_with_transfer_encoding_is_refused() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    actions = ex.receive_client(
        b"POST / HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    assert actions == [Refuse(400, "", "bad request: both Content-Length and Transfer-Encoding")]


def test_a_chunked_response_loses_its_content_length() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/logs", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    actions = ex.receive_upstream(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n5\r\nhello\r\n"
    )
    out = to_client(actions).lower()
    assert b"content-length" not in out and b"transfer-encoding: chunked" in out
    assert out.endswith(b"5\r\nhello\r\n")  # flushed before the rest arrives
    assert to_client(ex.receive_upstream(b"0\r\n\r\n")) == b"0\r\n\r\n"


def test_a_malformed_chunk_at_hand_is_a_400_at_once() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(
        b"POST / HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
    )
    ex.routed(route("edge-1"))
    actions = ex.upstream_opened()
    assert kinds(actions) == [CloseUpstream, Refuse]
    refusal = only(actions, Refuse)
    assert isinstance(refusal, Refuse) and refusal.status == 400 and refusal.node == "edge-1"
    assert refusal.reason.startswith("bad request body")


def test_a_malformed_chunk_later_is_a_400_unless_the_response_began() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(b"POST / HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\n")
    ex.routed(route("edge-1"))
    assert ReadBody() in ex.upstream_opened()
    # The body goes bad: the target connection is closed to stop waiting for its answer...
    assert ex.receive_client(b"zz\r\n") == [CloseUpstream()]
    # ...and its failure is answered with the 400, not a 502.
    refusal = only(ex.upstream_lost(), Refuse)
    assert isinstance(refusal, Refuse) and refusal.status == 400


@pytest.mark.parametrize("then", [b"more body\r\n", b""], ids=["bytes", "close"])
def test_client_bytes_after_a_bad_body_wait_for_the_400(then: bytes) -> None:
    """The body went bad after the head went up (its target connection closed): the client's
    next bytes, or its close, are not body to forward (review26: they hit an assertion that
    killed the front's pump); the 400 still comes when the target connection's end is seen."""
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(b"POST / HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\n")
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    assert ex.receive_client(b"zz\r\n") == [CloseUpstream()]
    assert ex.receive_client(then) == []
    refusal = only(ex.upstream_lost(), Refuse)
    assert isinstance(refusal, Refuse) and refusal.status == 400


def test_via_loop_is_a_508() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    actions = ex.receive_client(
        f"GET / HTTP/1.1\r\nHost: edge-1:9100\r\nVia: 1.1 other, 1.1 {VIA}\r\n\r\n".encode()
    )
    assert kinds(actions) == [Looped, Refuse]
    refusal = only(actions, Refuse)
    assert isinstance(refusal, Refuse) and (refusal.status, refusal.node) == (508, "edge-1")


@pytest.mark.parametrize("pieces", [1, 2])
def test_a_head_too_large_is_a_431(pieces: int) -> None:
    ex = Exchange(via=VIA, max_head=256)
    head = b"GET / HTTP/1.1\r\nHost: edge-1:9100\r\nX-Big: " + b"a" * 400 + b"\r\n\r\n"
    actions: list[Action] = []
    if pieces == 2:  # h11 bounds a head that arrives in pieces
        actions += ex.receive_client(head[:300])
    actions += ex.receive_client(head[300:] if pieces == 2 else head)
    refusal = only(actions, Refuse)
    assert isinstance(refusal, Refuse) and refusal.status == 431


def test_a_bad_response_before_any_byte_is_a_502_after_is_a_close() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    refusal = only(ex.receive_upstream(b"NOT HTTP\r\n\r\n"), Refuse)
    assert isinstance(refusal, Refuse) and refusal.status == 502
    assert refusal.reason.startswith("bad response from the target")

    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    ex.receive_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    assert kinds(ex.receive_upstream(b"")) == [CloseUpstream, Close]


def test_idle_before_the_answer_is_a_504() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    refusal = only(ex.upstream_idle(30), Refuse)
    assert refusal == Refuse(504, "edge-1", "no byte either way for 30s (--idle-timeout)")


def test_a_response_to_head_has_no_body_and_its_connection_is_not_kept() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(b"HEAD / HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n" + get("/b", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    # The length names the body a GET would have had: none follows, the answer is complete.
    actions = ex.receive_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    assert counted(actions) == [200] and b"Content-Length: 1000\r\n" in to_client(actions)
    assert CloseUpstream() in actions and ex.phase == "head"
    assert only(ex.poll(), RouteRequest).dest.target == "/b"  # type: ignore[attr-defined]
    assert kinds(ex.routed(route("edge-1"))) == [OpenUpstream]


def test_a_body_ended_by_the_close_goes_chunked_to_an_http11_client() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    out = to_client(ex.receive_upstream(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc"))
    assert b"Transfer-Encoding: chunked\r\n" in out and out.endswith(b"\r\n\r\n3\r\nabc\r\n")
    actions = ex.receive_upstream(b"")
    assert to_client(actions) == b"0\r\n\r\n" and CloseUpstream() in actions
    assert ex.phase == "head"  # the client connection carries on


def test_an_http10_client_gets_the_close_framing_and_the_connection_ends() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(b"GET / HTTP/1.0\r\nHost: edge-1:9100\r\n\r\n")
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    out = to_client(ex.receive_upstream(b"HTTP/1.1 200 OK\r\n\r\nabc"))
    assert b"chunked" not in out and b"Connection: close\r\n" in out and out.endswith(b"abc")
    assert kinds(ex.receive_upstream(b"")) == [CloseUpstream, Close]


def test_a_chunked_request_body_goes_on_chunked_with_its_trailers() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    head = b"POST /up HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\n"
    ex.receive_client(head + b"3\r\nabc\r\n")
    ex.routed(route("edge-1"))
    actions = ex.upstream_opened()
    assert kinds(actions) == [WriteUpstream, ReadBody]
    sent = to_upstream(actions)
    assert b"transfer-encoding: chunked\r\n" in sent and sent.endswith(b"\r\n\r\n3\r\nabc\r\n")
    assert to_upstream(ex.receive_client(b"0\r\nX-Sum: 1\r\n\r\n")) == b"0\r\nx-sum: 1\r\n\r\n"
    assert ex.body_done


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\n\r\n",  # no Host
        b"GET / HTTP/1.1\r\nHost: edge-1\r\nHost: edge-2\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost : edge-1\r\n\r\n",  # whitespace before the colon
        b"GET\x01 / HTTP/1.1\r\nHost: edge-1\r\n\r\n",
    ],
)
def test_a_bad_head_is_a_400(head: bytes) -> None:
    refusal = only(Exchange(via=VIA, max_head=4096).receive_client(head), Refuse)
    assert isinstance(refusal, Refuse) and refusal.status == 400
    assert refusal.reason.startswith("bad request")


def test_pipelined_requests_are_answered_in_order() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    assert kinds(ex.receive_client(get("/a", "edge-1:9100") + get("/b", "edge-1:9100"))) == [
        RouteRequest
    ]
    ex.routed(route("edge-1"))
    assert to_upstream(ex.upstream_opened()).startswith(b"get /a ")
    assert to_client(ex.receive_upstream(OK)).endswith(b"ok")
    assert ex.head_begun
    assert only(ex.poll(), RouteRequest).dest.target == "/b"  # type: ignore[attr-defined]
    assert to_upstream(ex.routed(route("edge-1"))).startswith(b"get /b ")


def test_the_same_head_again_is_answered_the_same_and_a_changed_one_anew() -> None:
    """A keep-alive client polling one URL: the second identical request and the target's
    identical answer reuse what the first ones led to (same bytes out), while a request or an
    answer that differs in one field is worked out again."""
    ex = Exchange(via=VIA, max_head=4096)
    edge1 = route("edge-1")
    ex.receive_client(get("/ping", "edge-1:9100"))
    ex.routed(edge1)
    first_up = to_upstream(ex.upstream_opened())
    first_down = to_client(ex.receive_upstream(OK))

    ex.receive_client(get("/ping", "edge-1:9100"))
    assert to_upstream(ex.routed(edge1)) == first_up
    actions = ex.receive_upstream(OK)
    assert to_client(actions) == first_down and counted(actions) == [200]
    assert ex.phase == "head"

    # One field more on the request: a new head for the target, carrying it.
    ex.receive_client(b"GET /ping HTTP/1.1\r\nHost: edge-1:9100\r\nX-Scrape: 2\r\n\r\n")
    sent = to_upstream(ex.routed(edge1))
    assert sent != first_up and b"x-scrape: 2\r\n" in sent
    # The target answers differently (it closes): the client still gets it whole, and the
    # kept connection is dropped.
    closing = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    actions = ex.receive_upstream(closing)
    assert to_client(actions).endswith(b"\r\n\r\nok") and CloseUpstream() in actions
    # A request the client marks as its last: answered with Connection: close, then closed.
    ex.receive_client(b"GET /ping HTTP/1.1\r\nHost: edge-1:9100\r\nConnection: close\r\n\r\n")
    assert kinds(ex.routed(edge1)) == [OpenUpstream]
    ex.upstream_opened()
    actions = ex.receive_upstream(OK)
    assert b"connection: close" in to_client(actions).lower()
    assert isinstance(actions[-1], Close)


def test_a_proxy_connection_close_ends_the_connection_after_the_answer() -> None:
    """llhttp reads Proxy-Connection as Connection and takes nothing after its "close": the
    exchange must close too, not keep the connection for a next request llhttp refuses (400)."""
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(b"GET / HTTP/1.1\r\nHost: edge-1:9100\r\nProxy-Connection: close\r\n\r\n")
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    actions = ex.receive_upstream(OK)
    assert b"connection: close" in to_client(actions).lower()
    assert isinstance(actions[-1], Close)


def test_a_kept_target_connection_that_ends_between_requests_is_let_go() -> None:
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(get("/", "edge-1:9100"))
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    assert ex.upstream_ended() == []  # while forwarding, the exchange reads the end itself
    ex.receive_upstream(OK)
    assert ex.phase == "head"
    assert ex.upstream_ended() == [CloseUpstream()]
    assert ex.upstream_ended() == []  # once
    ex.receive_client(get("/", "edge-1:9100"))
    assert kinds(ex.routed(route("edge-1"))) == [OpenUpstream]  # a fresh one


@pytest.mark.parametrize(
    ("sent", "midway"),
    [
        (b"GET / HTTP/1.1\r\nHost: edge-9:80\r\n\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: edge", True),  # the head is not through
        (b"POST / HTTP/1.1\r\nHost: edge-9:80\r\nContent-Length: 3\r\n\r\nabc", False),
        (b"POST / HTTP/1.1\r\nHost: edge-9:80\r\nContent-Length: 9\r\n\r\nabc", True),
        (
            b"POST / HTTP/1.1\r\nHost: edge-9:80\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n",
            True,
        ),
        (b"CONNECT edge-9:80 HTTP/1.1\r\nHost: edge-9:80\r\n\r\n", False),
        (b"G\x01T / HTTP/1.1\r\n\r\n", True),  # the parser stopped inside the head
    ],
)
def test_midway_says_whether_more_of_the_request_may_come(sent: bytes, midway: bool) -> None:
    """What the front's lingering close is decided by, in part: a refusal of a request not all
    sent lingers until it is through (the client may still be writing it); one of a whole
    request lingers only when more may come (pipelined requests, a CONNECT's tunnel bytes, any
    refusal on plain TCP: http_proxy._Connection._lingers)."""
    ex = Exchange(via="1.1 s", max_head=16384)
    ex.receive_client(sent)
    assert ex.client.midway is midway


def test_an_answer_before_the_request_body_is_through_says_connection_close() -> None:
    """The target answers (a kubelet's 401) before the client's body is through: the connection
    cannot carry another request (the rest of the body would be read as one), so the front
    closes it after the answer — with a lingering close, whose end over TLS (no half-close)
    comes only when the client stops sending. The answer's head says so (``Connection:
    close``), or a keep-alive client that read it whole would send its next request on the
    lingering connection, where it is dropped unanswered."""
    ex = Exchange(via=VIA, max_head=4096)
    head = b"PUT /upload HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 9\r\n\r\nabc"
    only(ex.receive_client(head), RouteRequest)
    ex.routed(route("edge-1"))
    ex.upstream_opened()
    answer = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\nno"
    actions = ex.receive_upstream(answer)
    assert isinstance(actions[-1], Close) and ex.client.midway
    sent = to_client(actions)
    assert b"\r\nConnection: close\r\n" in sent, sent
    assert sent.endswith(b"\r\n\r\nno")
