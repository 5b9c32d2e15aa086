"""Review of the ansfast cuts (issue 15): the guarantees each moved, pinned where they now live.

- A response's wire begins with a status line kept per status (not a format per answer): for
  any status llhttp takes (000-999), reason and fields, on one connection whose answers follow
  each other, the wire is the old format's, and a PlainHead (reason decoded when asked, target
  a class attribute) reads as the Head the old code made.
- Exchange._response_head answers a plain answer to a kept client without response_framing:
  over whole conversations (1xx before the answer, HEAD, 204/304, HTTP/1.0 on either side,
  ``Connection: close``, an answer before the request body is through), what the client and
  the target get, and when the connection ends, are what 691ee7b's _response_head gave.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    OpenUpstream,
    RouteRequest,
    WriteClient,
    WriteUpstream,
)
from ravenproxy.server.http_heads import Head, PlainHead
from ravenproxy.server.http_messages import HEAD, Parsed
from ravenproxy.server.http_rewrite import response_framing
from tests.helpers import examples

from .test_exchange import VIA, route

# -- the wire and the PlainHead -------------------------------------------------------------------

_reasons = st.one_of(
    st.sampled_from([b"OK", b"", b"Not Found", b"Content-Length: 3", b"\xe9t\xe9"]),
    st.binary(max_size=12).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F)),
)
_fields = st.lists(
    st.tuples(
        st.sampled_from([b"Date", b"Content-Type", b"X-A", b"Connection", b"ETag"]),
        st.sampled_from([b"x", b"close", b"text/plain; version=0.0.4", b"\xe9"]),
    ),
    max_size=3,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.one_of(st.integers(0, 999), st.sampled_from([200, 99, 0, 204, 304])),
            _reasons,
            _fields,
            st.sampled_from([b"1.1", b"1.0"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_every_answers_wire_and_head_read_as_the_old_codes(
    answers: list[tuple[int, bytes, list[tuple[bytes, bytes]], bytes]],
) -> None:
    parsed = Parsed(response=True)
    heads: list[tuple[Head, int, bytes, list[tuple[bytes, bytes]], bytes]] = []
    for status, reason, fields, version in answers:
        if 100 <= status < 200:
            status += 100  # an interim answer has no body: the next one would be its final
        if heads and (heads[-1][4] == b"1.0" or heads[-1][3]):  # maybe the connection's end
            parsed = Parsed(response=True)
        lines = [b"%b: %b" % f for f in fields] + [b"Content-Length: 0"]
        parsed.feed(
            b"HTTP/%b %03d %b\r\n%b\r\n\r\n" % (version, status, reason, b"\r\n".join(lines))
        )
        kind, head = parsed.events.popleft()
        assert kind == HEAD and isinstance(head, Head)
        heads.append((head, status, reason, fields, version))
        parsed.events.clear()
    for head, status, reason, fields, version in heads:  # read after the later ones came
        all_fields = [*fields, (b"Content-Length", b"0")]
        old = b"HTTP/1.1 %d %b\r\n%b\r\n\r\n" % (
            status,
            reason,
            b"\r\n".join(b"%b: %b" % f for f in all_fields),
        )
        assert head.wire == old and head.size == len(old)
        assert head.start == reason.decode("latin-1")
        assert head.target == "" and head.status == status
        assert head.version == version.decode()
        decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in all_fields]
        assert head.headers == decoded
        assert isinstance(head, PlainHead) == (not any(k == b"Connection" for k, _ in fields))


def test_a_plain_heads_target_cannot_be_told_from_a_heads() -> None:
    """``target`` moved from Head's slot to PlainHead's class: read the same, and it is no
    field of the instance a caller could set by mistake for one answer and see on all."""
    parsed = Parsed(response=True)
    parsed.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    head = parsed.events.popleft()[1]
    assert isinstance(head, PlainHead) and head.target == ""
    with pytest.raises(AttributeError):
        head.target = "/x"  # type: ignore[misc]
    assert PlainHead.target == ""


# -- whole conversations: the fast path against 691ee7b's _response_head -------------------------


def _old_response_head(self: Exchange, response: Head, bodiless: bool) -> bytes:
    """Exchange._response_head as 691ee7b had it (every answer through response_framing)."""
    client_keep = self._client_keep and self.body_done
    request, rest = self._request, (bodiless, client_keep, self._up is not None)
    seen = self._answered
    if seen is not None and seen[0] is response and seen[1] is request and seen[2] == rest:
        framing = seen[3]
    else:
        assert self._request is not None
        framing = response_framing(
            response,
            bodiless=bodiless,
            request_version=self._request.version,
            client_keep=client_keep,
            upstream=self._up is not None,
        )
        self._answered = (response, request, rest, framing)
    self._body_out, self._until_close = framing.body_out, framing.until_close
    self._up_keep, self._client_keep = framing.up_keep, framing.client_keep
    return framing.head


@st.composite
def _request(draw: st.DrawFn) -> tuple[bytes, bool, bool]:
    """A request, whether it asks HEAD, and whether its body comes whole."""
    method = draw(st.sampled_from([b"GET", b"HEAD", b"POST"]))
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    fields = [b"Host: edge-1:9100"]
    fields += draw(
        st.lists(
            st.sampled_from([b"Connection: close", b"Connection: keep-alive", b"Accept: */*"]),
            max_size=2,
        )
    )
    body, whole = b"", True
    if method == b"POST":
        body = b"abcdefgh"
        fields.append(b"Content-Length: 8")
        whole = draw(st.booleans())
    head = b"%b /m HTTP/%b\r\n%b\r\n\r\n" % (method, version, b"\r\n".join(fields))
    return head + (body if whole else body[:3]), method == b"HEAD", whole


@st.composite
def _answer(draw: st.DrawFn, bodiless: bool) -> bytes:
    out = b""
    if draw(st.integers(0, 4)) == 0:
        out += b"HTTP/1.1 100 Continue\r\n\r\n"
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    status = draw(st.sampled_from([200, 200, 404, 204, 304, 500]))
    reason = draw(st.sampled_from([b"OK", b"", b"\xe9"]))
    size = draw(st.integers(0, 12))
    fields = [b"Date: Sat, 05 Dec 2026 01:%02d:00 GMT" % draw(st.integers(0, 59))]
    framing = draw(st.sampled_from(["length", "length", "length", "chunked", "close", "hop"]))
    body = b"x" * size
    if framing in ("length", "hop"):
        fields.append(b"Content-Length: %d" % size)
    if framing == "hop":
        fields.append(b"Keep-Alive: timeout=5")
    if framing == "chunked":
        fields.append(b"Transfer-Encoding: chunked")
        body = (b"%x\r\n%b\r\n" % (size, body) if size else b"") + b"0\r\n\r\n"
    if bodiless or status in (204, 304):
        body = b""
    if framing == "close" and not bodiless and status not in (204, 304):
        fields.append(b"Connection: close")
    head = b"HTTP/%b %d %b\r\n%b\r\n\r\n" % (version, status, reason, b"\r\n".join(fields))
    return out + head + body


def _converse(steps: list[tuple[bytes, bool, bool, bytes]]) -> list[Any]:
    """What the exchange does over the steps (a request, then its answer): its actions (by type
    and bytes), its state after each."""
    ex = Exchange(via=VIA, max_head=4096)
    seen: list[Any] = []

    def note(actions: list[Action]) -> list[Action]:
        for a in actions:
            if isinstance(a, WriteClient):
                seen.append((type(a).__name__, bytes(a.data), a.status))
            elif isinstance(a, WriteUpstream):
                seen.append((type(a).__name__, bytes(a.data)))
            elif isinstance(a, Close):
                seen.append(repr(a))
            else:
                seen.append(type(a).__name__)
        return actions

    for request, _, _, answer in steps:
        actions = note(ex.receive_client(request))
        if not any(isinstance(a, RouteRequest) for a in actions):
            break
        actions = note(ex.routed(route("edge-1")))
        if any(isinstance(a, OpenUpstream) for a in actions):
            note(ex.upstream_opened())
        actions = note(ex.receive_upstream(answer))
        if ex.phase == "forwarding":  # an answer framed by the close ends with it
            actions = note(ex.receive_upstream(b""))
        seen.append((ex.phase, ex._client_keep, ex._up_keep, ex._body_out, ex._until_close))
        if ex.phase != "head" or any(isinstance(a, Close) for a in actions):
            break
    return seen


@st.composite
def _conversations(draw: st.DrawFn) -> list[tuple[bytes, bool, bool, bytes]]:
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        request, bodiless, whole = draw(_request())
        steps.append((request, bodiless, whole, draw(_answer(bodiless))))
    return steps


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conversations())
def test_a_conversation_goes_as_it_did_through_response_framing(
    steps: list[tuple[bytes, bool, bool, bytes]],
) -> None:
    now = _converse(steps)
    fast = Exchange._response_head
    try:
        Exchange._response_head = _old_response_head  # type: ignore[method-assign]
        before = _converse(steps)
    finally:
        Exchange._response_head = fast  # type: ignore[method-assign]
    assert now == before
