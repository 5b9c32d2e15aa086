"""server90: a plain answer to a kept client is framed by ``AnswerSide.receive_upstream`` itself
(response_framing's plain case, moved there from ``_response_head``, which keeps the other
cases: a call an answer fewer). Held to 8a65720's ``receive_upstream`` and ``_response_head``,
kept verbatim below as the oracle (``Old``), over generated conversations on one connection
(every answer framing of test_exchange_answers and test_outlet3_actions, an HTTP/1.0 answer,
HEAD, 1xx, 204/304, request bodies, the client's last, the route kept or changed, requests and
answers whole or cut anywhere): the same actions, field by field and in order, and the same
exchange state after each step (phase, framing, keep-alive of both sides, the retry's state,
the target parser's ``bodiless``).

The callbacks' side (``_advance``'s watch stamps written out, as the splice's are) is held by
test_httptake_take's f194fe2 oracle on real sockets and test_review24's clocks."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    OpenUpstream,
    Refuse,
    RouteRequest,
    SwitchProtocols,
    WriteClient,
)
from ravenproxy.server.exchange_answer import _CLOSED_UNANSWERED, _new
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import DATA, END, EOF, ERROR, HEAD
from ravenproxy.server.http_rewrite import chunk, last_chunk, response_framing
from ravenproxy.server.router import Route

from .flat_events import FlatUpstream
from .test_exchange import VIA, route
from .test_exchange_answers import EXCHANGES, LAST, get
from .test_outlet3_actions import ENDINGS, MORE


class Old(Exchange):
    """8a65720's methods, verbatim."""

    def receive_upstream(self, data: bytes) -> list[Action]:
        """Bytes from the target connection; ``b""``: it closed."""
        up = self._up
        if self.phase != "forwarding" or up is None:
            return []
        if not data:
            up.events.append((EOF, None))
        else:
            rest = up.feed(data)
            if rest is not None:
                self._up_rest = rest
        # Bytes for the client are gathered while events come without waiting (head, body,
        # end of a small response: one write) and flushed before the driver waits again.
        out: list[bytes] = []
        counted = 0  # the final answer's status once its head is in out (WriteClient.status)
        events: deque[tuple[int, Any]] = up.events  # a kind says its value's type: no isinstance
        while events:
            kind, value = events.popleft()
            if kind == DATA:
                out.append(chunk(value) if self._body_out == "chunked" else value)
            elif kind == HEAD:
                status = value.status
                if value.size > self.max_head:
                    return self._flushed(out, counted, self._bad_response("head too large"))
                if status == 101:
                    if not self._upgrade:
                        failure = self._failed("101 without an upgrade request", status=502)
                        return self._flushed(out, counted, failure)
                    self.started = True
                    self.phase = "switching"
                    self._switched = value
                    return self._flushed(out, counted, [SwitchProtocols()])
                self.started = True
                if status < 200:
                    self._info = True
                    out.append(value.wire)  # an interim answer goes on whole
                else:
                    counted = status
                    out.append(self._response_head(value, up.bodiless))  # no keyword: a faster call
            elif kind == END:
                if self._info:
                    self._info = False
                    continue
                if self._body_out == "chunked":
                    out.append(last_chunk(value))
                if out:  # the action made without its __init__ (a Python call an answer)
                    write = _new(WriteClient)
                    write.data, write.status = b"".join(out), counted
                    actions: list[Action] = [write]
                else:
                    actions = []
                if self._up_keep and self._client_keep and self.body_done and not events:
                    if self.client_raw is None and not up.in_head:  # _finished's common case
                        self.phase = "head"
                        return actions
                return actions + self._finished()
            elif kind == ERROR:
                return self._flushed(out, counted, self._bad_response(str(value)))
            elif self._until_close and self.started:  # EOF ends a body framed by the close
                if self._body_out == "chunked":
                    out.append(last_chunk([]))
                self._up_keep = False
                return self._flushed(out, counted, self._finished())
            else:
                what = "the connection was closed" if self.started else _CLOSED_UNANSWERED
                return self._flushed(out, counted, self._bad_response(what))
        if up.in_head and up.fed > self.max_head:
            return self._flushed(out, counted, self._bad_response("head too large"))
        return self._flushed(out, counted, [])

    def _response_head(self, response: Head, bodiless: bool) -> bytes:
        """The head for the client, and how the body after it is framed. An answer before the
        request body is through closes the connection after it (``Exchange._finished``): it
        says so."""
        client_keep = self._client_keep and self.body_done
        if response.plain and client_keep and not bodiless and response.status not in (204, 304):
            # response_framing's plain case kept alive, written out: a target's usual answer
            # goes on as parsed, without two calls, a Framing and a memo entry per answer
            # (test_exchange_plain holds it to response_framing's).
            self._body_out, self._until_close = "length", False
            self._up_keep = response.version == "1.1" and self._up is not None
            return response.wire
        request, rest = self._request, (bodiless, client_keep, self._up is not None)
        seen = self._answered  # heads by identity: a changed one is not compared field by field
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


def _state(ex: Exchange) -> tuple[object, ...]:
    up = ex._up
    return (
        ex.phase,
        ex.body_done,
        ex.started,
        ex._client_keep,
        ex._up_keep,
        ex._body_out,
        ex._until_close,
        ex._reused,
        ex._up_used,
        ex._upgrade,
        ex._chunked_up,
        None if ex._outbound is None else list(ex._outbound),
        None if up is None else (up.bodiless, len(up.events), up.in_head, up.in_body),
        len(ex.client.events),
    )


ROUTES: list[Route] = [route("edge-1"), route("edge-1", 9200)]


def _run(ex: Exchange, conversation: list[tuple[bytes, bytes, bool]], seed: int) -> list[object]:
    """Each request on one connection (whole, or in pieces), routed to the same route as a
    rule (the target connection kept) or now and then another; its answer
    whole or in pieces, then the target's close when it closes after it. The log: each action
    (its repr reads every field) and the exchange's state after each step."""
    rng = random.Random(seed)
    log: list[object] = []
    current = ROUTES[0]

    def act(actions: list[Action]) -> bool:
        nonlocal current
        queue: deque[Action] = deque(actions)
        while queue:
            action = queue.popleft()
            log.append((type(action).__name__, repr(action)))
            if isinstance(action, RouteRequest):
                if rng.random() < 0.15:
                    current = rng.choice(ROUTES)
                queue.extend(ex.routed(current))
                log.append(_state(ex))
            elif isinstance(action, OpenUpstream):
                queue.extend(ex.upstream_opened())
            elif isinstance(action, Close | Refuse | SwitchProtocols):
                return False
        log.append(_state(ex))
        return True

    for request, answer, closes in conversation:
        pieces = [request] if rng.random() < 0.6 else _cut(request, rng)
        for piece in pieces:
            if not act(ex.receive_client(piece)):
                return log
        answers = [answer] if rng.random() < 0.6 else _cut(answer, rng)
        for piece in [*answers, b""] if closes else answers:
            if ex.phase != "forwarding":
                break
            if not act(ex.receive_upstream(piece)):
                return log
    return log


def _cut(data: bytes, rng: random.Random) -> list[bytes]:
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(rng.randint(1, 3), len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


TEN = (get("/ten"), b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False)
"""A plain answer in HTTP/1.0: its target connection is not kept."""
PLAIN = [EXCHANGES[0], EXCHANGES[0], TEN, EXCHANGES[3], EXCHANGES[4], EXCHANGES[8], EXCHANGES[9]]
"""A plain answer to a repeated request (the written-out cases), an HTTP/1.0 one, a HEAD, a
204, an HTTP/1.0 request."""


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(st.sampled_from(PLAIN + EXCHANGES + MORE), min_size=1, max_size=14),
    st.sampled_from([None, *ENDINGS, *LAST]),
    st.integers(0, 2**32),
)
def test_the_same_actions_and_state_as_8a65720(
    order: list[tuple[bytes, bytes, bool]],
    ending: tuple[bytes, bytes, bool] | None,
    seed: int,
) -> None:
    conversation = [*order, ending] if ending is not None else order
    new = _run(Exchange(via=VIA, max_head=4096), conversation, seed)
    old = _run(FlatOld(via=VIA, max_head=4096), conversation, seed)
    assert new == old


@pytest.mark.parametrize("times", [1, 5])
def test_plain_answers_to_a_kept_client_take_the_written_out_path(times: int) -> None:
    """A repeated bodiless GET and its plain answer: _response_head is not called (the path is
    taken, and agrees with the old)."""
    calls: list[str] = []

    class Counting(Exchange):
        def _response_head(self, response: Head, bodiless: bool) -> bytes:
            calls.append("_response_head")
            return super()._response_head(response, bodiless)

    conversation = [EXCHANGES[0]] * times
    log = _run(Counting(via=VIA, max_head=4096), conversation, 0)
    assert calls == []
    assert log == _run(FlatOld(via=VIA, max_head=4096), conversation, 0)


class FlatOld(FlatUpstream, Old):
    """answerside: the oracle reads the parser's ``ANSWER`` events unfolded, as its
    parser queued them."""
