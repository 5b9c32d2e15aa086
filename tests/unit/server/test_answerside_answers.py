"""answerside: an answer read without llhttp (near_answers) is one ``ANSWER`` event, its head
and its bytes as they came, and ``AnswerSide.receive_upstream`` sends a plain one to a kept
client as those bytes (no DATA and END events, no join of head and body; the answer's end is
handled once, after the events loop). Held to bd24f07's ``receive_upstream``, kept verbatim
below (``Old``, which reads the parser's events unfolded, as bd24f07's parser queued them:
:class:`.flat_events.FlatParsed`), over generated conversations on one connection — answers of
one layout with other values (the path's), the same answer again, two in one read (a stray),
HEAD, HTTP/1.0 requests and answers, a client's last request, every framing of
test_exchange_answers and test_outlet3_actions, a head bound the near heads exceed, requests
and answers whole or cut anywhere: the same actions field by field and in order, and the same
exchange state after each step (server90's view, the target parser's events counted unfolded).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    OpenUpstream,
    RouteRequest,
    SwitchProtocols,
    WriteClient,
)
from ravenproxy.server.exchange_answer import _CLOSED_UNANSWERED, _new
from ravenproxy.server.http_events import ANSWER, DATA, END, EOF, ERROR, HEAD
from ravenproxy.server.http_messages import Parsed
from ravenproxy.server.http_rewrite import chunk, last_chunk
from tests.helpers import examples

from .flat_events import FlatUpstream, flatten
from .test_exchange import VIA, route
from .test_exchange_answers import EXCHANGES, LAST, get
from .test_outlet3_actions import ENDINGS, MORE
from .test_server90_inline import PLAIN, _run


class Old(Exchange):
    """bd24f07's method, verbatim."""

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
                    if (
                        value.plain
                        and self._client_keep
                        and self.body_done
                        and not up.bodiless
                        and status not in (204, 304)
                    ):
                        # response_framing's plain case kept alive, written out (not in
                        # _response_head: a call an answer): a target's usual answer goes on as
                        # parsed, without two calls, a Framing and a memo entry per answer
                        # (test_exchange_plain and test_server90_inline hold it to
                        # response_framing's and 8a65720's). ``up`` is held.
                        self._body_out, self._until_close = "length", False
                        self._up_keep = value.version == "1.1"
                        out.append(value.wire)
                    else:
                        out.append(self._response_head(value, up.bodiless))  # no keyword: faster
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


class FlatOld(FlatUpstream, Old):
    """The oracle, reading its parser's events unfolded."""


def _near(i: int, body: bytes = b"pong") -> bytes:
    """An answer of latency.py's varied layout: its Date and body other, as long."""
    return (
        b"HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 09:%02d:%02d GMT\r\n"
        b"Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n%b"
        % (i // 60 % 60, i % 60, len(body) + 5, body + b" %04d" % i)
    )


TEN_GET = b"GET /ten HTTP/1.0\r\nHost: edge-1:9100\r\n\r\n"
NEAR: list[tuple[bytes, bytes, bool]] = [
    *((get("/ping"), _near(i), False) for i in range(6)),
    (get("/ping"), _near(7), False),
    (get("/ping"), _near(7), False),  # the same bytes again
    (get("/ping"), _near(8, b"gnop"), False),
    (get("/ping"), _near(9) + _near(10), False),  # two in one read: the second one stray
    (get("/ping"), _near(11), True),  # the target closes after it
    (b"HEAD /ping HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n", _near(12)[:-9], False),
    (TEN_GET, _near(13), False),  # an HTTP/1.0 client: not the plain case
    (get("/ping", "Connection: close\r\n"), _near(14), False),  # the client's last
    (get("/ping"), _near(15).replace(b"HTTP/1.1", b"HTTP/1.0", 1), False),
    (get("/ping"), _near(16).replace(b"text", b"te\x01t", 1), False),  # llhttp refuses
]


NEAR_LAST: list[tuple[bytes, bytes, bool]] = [
    (TEN_GET, _near(20), False),  # not kept: the ANSWER unfolded
    (get("/ping", "Connection: close\r\n"), _near(21), False),
    (b"POST /early HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 9\r\n\r\n", _near(22), False),
]
"""Near answers to a last request (the client's, or one whose body has not come): not the
plain kept case, the event unfolded."""


def _state(ex: Exchange) -> tuple[object, ...]:
    """server90's view, the target parser's queued events counted as they unfold."""
    up = ex._up
    events: deque[tuple[int, Any]] = deque(() if up is None else up.events)
    flatten(events)
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
        ex._info,
        None if ex._outbound is None else list(ex._outbound),
        None if up is None else (up.bodiless, len(events), up.in_head, up.in_body),
    )


def _logged(ex: Exchange, conversation: list[tuple[bytes, bytes, bool]], seed: int) -> list[object]:
    """server90's run of the conversation, the state after it too; each answer event counted."""
    log = _run(ex, conversation, seed)
    return [*log, _state(ex)]


@settings(max_examples=examples(1200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(st.sampled_from(NEAR * 3 + PLAIN + EXCHANGES + MORE), min_size=1, max_size=16),
    st.sampled_from([None, *ENDINGS, *LAST, *NEAR_LAST * 3]),
    st.sampled_from([4096, 4096, 4096, 90]),
    st.integers(0, 2**32),
)
def test_the_same_actions_and_state_as_bd24f07(
    order: list[tuple[bytes, bytes, bool]],
    ending: tuple[bytes, bytes, bool] | None,
    max_head: int,
    seed: int,
) -> None:
    conversation = [*order, ending] if ending is not None else order
    new = _logged(Exchange(via=VIA, max_head=max_head), conversation, seed)
    old = _logged(FlatOld(via=VIA, max_head=max_head), conversation, seed)
    assert new == old


def test_a_run_of_near_answers_takes_the_answer_event() -> None:
    """The path is taken: from the third answer of the layout on, the parser queues one
    ``ANSWER`` (its head, the read) and the client gets the read itself (no join, no slice), as
    bd24f07 sent it."""
    parsed = Parsed(response=True)
    for i in range(4):
        parsed.feed(_near(i))
        kinds = [kind for kind, _ in parsed.events]
        assert kinds == ([HEAD, DATA, END] if i < 2 else [ANSWER])
        parsed.events.clear()
    ex = Exchange(via=VIA, max_head=4096)
    writes: list[WriteClient] = []
    answers = [_near(i) for i in range(5)]
    for answer in answers:
        actions = ex.receive_client(get("/ping"))
        for action in actions:
            if isinstance(action, RouteRequest):
                actions.extend(ex.routed(route("edge-1")))
            elif isinstance(action, OpenUpstream):
                actions.extend(ex.upstream_opened())
        assert ex.phase == "forwarding"
        writes.extend(a for a in ex.receive_upstream(answer) if isinstance(a, WriteClient))
    assert [(w.data, w.status) for w in writes] == [(a, 200) for a in answers]
    assert [w.data is a for w, a in zip(writes, answers, strict=True)] == [False] * 2 + [True] * 3
    assert ex.phase == "head"
