"""Bytes a target sends past its answer's end, in the read that ended it, answer nothing: kept,
they would begin the next request's answer (a response desync: until 812de76 they did — the
parser ran ahead into them, the next answer's parse started where they left it). The target
connection is let go (``CloseUpstream(stray=True)``: logged and counted by the driver) and the
next request goes on a fresh one, as Envoy and HAProxy do."""

from __future__ import annotations

import pytest

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import CloseUpstream, OpenUpstream, RouteRequest

from .test_exchange import OK, VIA, get, kinds, only, route, to_client, to_upstream


def _forwarding(client: bytes) -> Exchange:
    ex = Exchange(via=VIA, max_head=4096)
    assert kinds(ex.receive_client(client)) == [RouteRequest]
    assert kinds(ex.routed(route("edge-1"))) == [OpenUpstream]
    ex.upstream_opened()
    assert ex.phase == "forwarding"
    return ex


def _second_goes_on_a_fresh_connection(ex: Exchange, client: bytes = b"") -> None:
    """The next request (``client``; b"": parsed already) opens a new target connection, and
    its answer is its own."""
    actions = ex.receive_client(client) if client else ex.poll()
    assert kinds(actions) == [RouteRequest]
    assert kinds(ex.routed(route("edge-1"))) == [OpenUpstream]
    assert to_upstream(ex.upstream_opened()).startswith(b"get /b ")
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond"
    actions = ex.receive_upstream(second)
    assert to_client(actions).endswith(b"\r\n\r\nsecond") and ex.phase == "head"
    assert CloseUpstream() not in actions and CloseUpstream(stray=True) not in actions


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokxyz",  # a body longer than its length
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\nxyz",
        OK + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz",  # an answer nobody asked for
        OK + b"HTTP/1.1 204 No Content\r\n\r\n",
        OK + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nx",  # one begun
        OK + b"H",
        OK + b" ",
    ],
)
def test_bytes_past_the_answers_end_in_its_read_let_the_connection_go(answer: bytes) -> None:
    ex = _forwarding(get("/a", "edge-1:9100"))
    actions = ex.receive_upstream(answer)
    assert to_client(actions).endswith(b"\r\n\r\nok") or to_client(actions).endswith(b"0\r\n\r\n")
    assert b"xyz" not in to_client(actions) and b"204" not in to_client(actions)
    assert actions[-1] == CloseUpstream(stray=True) and ex.phase == "head"
    assert ex.upstream_ended() == []  # gone already
    _second_goes_on_a_fresh_connection(ex, get("/b", "edge-1:9100"))


def test_a_pipelined_request_parsed_already_goes_on_a_fresh_connection() -> None:
    ex = _forwarding(get("/a", "edge-1:9100") + get("/b", "edge-1:9100"))
    actions = ex.receive_upstream(OK + b"xyz")
    assert actions[-1] == CloseUpstream(stray=True) and ex.phase == "head"
    _second_goes_on_a_fresh_connection(ex)


def test_line_ends_past_the_answer_keep_the_connection() -> None:
    """llhttp skips empty lines before a message (RFC 9112 §2.2's robustness rule), here and
    before the next answer alike: nothing of them could reach a client."""
    ex = _forwarding(get("/a", "edge-1:9100"))
    actions = ex.receive_upstream(OK + b"\r\n")
    assert ex.phase == "head" and CloseUpstream() not in actions
    assert not any(isinstance(a, CloseUpstream) for a in actions)
    ex.receive_client(get("/b", "edge-1:9100"))
    sent = ex.routed(route("edge-1"))
    assert to_upstream(sent).startswith(b"get /b ")  # on the kept connection


def test_bytes_past_an_answer_that_closes_the_connection_are_not_stray() -> None:
    """The connection is not kept anyway: closed as any answer's with ``close``, not
    counted as stray."""
    ex = _forwarding(get("/a", "edge-1:9100"))
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nokxyz"
    actions = ex.receive_upstream(answer)
    assert only(actions, CloseUpstream) == CloseUpstream() and ex.phase == "head"


def test_bytes_between_requests_let_go_as_stray() -> None:
    """The driver's news between requests (:mod:`ravenproxy.server.kept_upstream`)."""
    ex = _forwarding(get("/a", "edge-1:9100"))
    ex.receive_upstream(OK)
    assert ex.upstream_ended(stray=True) == [CloseUpstream(stray=True)]
    _second_goes_on_a_fresh_connection(ex, get("/b", "edge-1:9100"))
