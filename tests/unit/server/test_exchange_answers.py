"""The end of a response as :meth:`Exchange.receive_upstream` takes it in its usual case (both
connections kept, the request body through: the exchange waits for the next request, inline)
against the general path (every end through ``_finished``, as before the shortcut): the same
bytes to the client, the same actions, for answers of every framing — a length, chunked with
trailers, 1xx before the answer, a HEAD's, 204, 304, ``Connection: close``, until the target
closes — cut at random places, with the client's last request closing, or answered before its
body came."""

from __future__ import annotations

import random
from collections import deque

import pytest

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    CloseUpstream,
    OpenUpstream,
    ReadBody,
    Refuse,
    RouteRequest,
    SwitchProtocols,
    WriteClient,
    WriteUpstream,
)
from ravenproxy.server.exchange_answer import _CLOSED_UNANSWERED
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import DATA, END, EOF, ERROR, HEAD
from ravenproxy.server.http_rewrite import chunk, fields, last_chunk

from .flat_events import FlatUpstream
from .test_exchange import OK, VIA, route


class General(Exchange):
    """:meth:`Exchange.receive_upstream` as it was before the shortcut: every response's end
    through ``_finished``."""

    def receive_upstream(self, data: bytes) -> list[Action]:
        up = self._up
        if self.phase != "forwarding" or up is None:
            return []
        if not data:
            up.events.append((EOF, None))
        else:
            rest = up.feed(data)
            if rest is not None:
                self._up_rest = rest
        out: list[bytes] = []
        counted = 0
        events = up.events
        while events:
            kind, value = events.popleft()
            if kind == DATA:
                assert isinstance(value, bytes)
                out.append(chunk(value) if self._body_out == "chunked" else value)
            elif kind == HEAD:
                assert isinstance(value, Head)
                if value.size > self.max_head:
                    return self._flushed(out, counted, self._bad_response("head too large"))
                if value.status == 101:
                    if not self._upgrade:
                        failure = self._failed("101 without an upgrade request", status=502)
                        return self._flushed(out, counted, failure)
                    self.started = True
                    self.phase = "switching"
                    self._switched = value
                    return self._flushed(out, counted, [SwitchProtocols()])
                self.started = True
                if value.status < 200:
                    self._info = True
                    head = f"HTTP/1.1 {value.status} {value.start}\r\n".encode("latin-1")
                    out.append(head + fields(value.headers) + b"\r\n")
                else:
                    counted = value.status
                    out.append(self._response_head(value, bodiless=up.bodiless))
            elif kind == END:
                if self._info:
                    self._info = False
                    continue
                assert isinstance(value, list)
                if self._body_out == "chunked":
                    out.append(last_chunk(value))
                return self._flushed(out, counted, self._finished())
            elif kind == ERROR:
                return self._flushed(out, counted, self._bad_response(str(value)))
            elif self._until_close and self.started:
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


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: edge-1:9100\r\n{extra}\r\n".encode()


# (request, answer, the target closes after it)
EXCHANGES: list[tuple[bytes, bytes, bool]] = [
    (get("/ok"), OK, False),
    (
        get("/chunked"),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
        False,
    ),
    (
        get("/hints"),
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK,
        False,
    ),
    (
        b"HEAD /h HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
        False,
    ),
    (get("/none"), b"HTTP/1.1 204 No Content\r\n\r\n", False),
    (get("/same", "If-None-Match: x\r\n"), b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n", False),
    (
        get("/closing"),
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        False,
    ),
    (get("/stream"), b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nstream", True),
    (b"GET /old HTTP/1.0\r\nHost: edge-1:9100\r\nConnection: keep-alive\r\n\r\n", OK, False),
    (
        b"POST /p HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 2\r\n\r\nhi",
        b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
        False,
    ),
]
LAST = [
    (get("/last", "Connection: close\r\n"), OK, False),  # the client's last
    (b"POST /early HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 9\r\n\r\n", OK, False),
]


def run(ex: Exchange, exchanges: list[tuple[bytes, bytes, bool]], seed: int) -> list[object]:
    """Each request on one connection, its answer in random pieces (then the target's close,
    when it closes after it); what went where and which actions came, in order."""
    rng = random.Random(seed)
    target = route("edge-1")
    log: list[object] = []

    def act(actions: list[Action]) -> bool:
        queue: deque[Action] = deque(actions)
        while queue:
            action = queue.popleft()
            if isinstance(action, RouteRequest):
                queue.extend(ex.routed(target))
            elif isinstance(action, OpenUpstream):
                log.append("open")
                queue.extend(ex.upstream_opened())
            elif isinstance(action, WriteClient):
                log.append(("WriteClient", action.data, action.status))
            elif isinstance(action, WriteUpstream):
                log.append(("WriteUpstream", action.data))
            elif isinstance(action, CloseUpstream | ReadBody):
                log.append(type(action).__name__)
            else:
                assert isinstance(action, Close | Refuse), action
                log.append(action)
                return False
        return True

    for request, answer, closes in exchanges:
        if not act(ex.receive_client(request)):
            return log
        cuts = sorted(rng.sample(range(1, len(answer)), min(3, len(answer) - 1)))
        pieces = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
        for piece in [*pieces, b""] if closes else pieces:
            if ex.phase != "forwarding":
                break
            if not act(ex.receive_upstream(piece)):
                return log
        log.append(ex.phase)
    return log


def both(exchanges: list[tuple[bytes, bytes, bool]], seed: int) -> list[object]:
    fast = run(Exchange(via=VIA, max_head=4096), exchanges, seed)
    general = run(FlatGeneral(via=VIA, max_head=4096), exchanges, seed)
    assert fast == general
    return fast


@pytest.mark.parametrize("last", range(len(LAST)))
@pytest.mark.parametrize("seed", range(12))
def test_answers_end_the_same_as_by_the_general_path(seed: int, last: int) -> None:
    rng = random.Random(seed)
    order = [rng.choice(EXCHANGES) for _ in range(14)]
    log = both([*order, LAST[last]], seed)
    assert isinstance(log[-1], Close)
    counted = [item for item in log if isinstance(item, tuple) and item[0] == "WriteClient"]
    assert sum(1 for item in counted if item[2]) == 15  # each answer's head, counted once


def test_each_answer_again_and_again_the_same_as_by_the_general_path() -> None:
    log = both([e for e in EXCHANGES for _ in range(3)] + [LAST[0]], seed=99)
    assert [i for i in log if isinstance(i, str) and i != "open"].count("head") >= 3 * 8


class FlatGeneral(FlatUpstream, General):
    """answerside: the oracle reads the parser's ``ANSWER`` events unfolded, as its
    parser queued them."""
