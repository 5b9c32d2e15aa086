"""outlet3: the actions :class:`Exchange` makes per request and per answer (``WriteClient``,
``WriteUpstream``) are built by ``object.__new__`` and their fields' stores, not by their
dataclass ``__init__``, and ``_response_head`` moved to :mod:`ravenproxy.server.answer_head`.
Held to ebcf73b's code, kept verbatim below as the oracle (``Old``: its ``routed``, ``_body``,
``receive_upstream``, ``_flushed`` and ``_response_head``): over generated conversations (every
answer framing, answers and request bodies cut at random places, the target closing, the
client's last request) the same actions come, equal field by field, every field set (``repr``
reads each: an unset slot raises), in the same order; and the same bytes reach each side."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import pytest

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
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
from ravenproxy.server.http_rewrite import chunk, last_chunk, response_framing
from ravenproxy.server.router import Route, UpstreamKey

from .bd24_requests import Bd24Routing
from .flat_events import FlatUpstream
from .test_exchange import VIA, route
from .test_exchange_answers import EXCHANGES, LAST


class Old(Bd24Routing):
    """ebcf73b's methods, verbatim (over bd24f07's ``_send`` and ``RequestHeads``, which it
    inherited from the Exchange until reqside folded them: ``Bd24Routing``)."""

    def routed(self, route: Route) -> list[Action]:
        """The request's route: keep the target connection when it fits, else open one."""
        seen = self._seen  # the request's RouteRequest: its destination
        assert self.phase == "routing" and self._request is not None and seen is not None
        same = route is self.route and self._up is not None  # the driver reused the route
        self.route = route
        self.body_done, self._body_error, self.started = False, None, False
        # The head for the target, reused while the request head and the route are the same
        # objects (a keep-alive client polling one URL); inline: it runs per request.
        request, built = self._request, self._built
        if built is None or built[0] is not request or built[1] is not route:
            out = self._request_head(request, seen[2].dest, route)
            built = self._built = (request, route, out, WriteUpstream(out[0]))
        head, self._upgrade, self._chunked_up = built[2]
        self._outbound = [head]
        if same:
            return self._send()
        key = UpstreamKey.of(route)
        actions: list[Action] = []
        if self._up is not None and key != self._up_key:
            actions += self._drop_upstream()
        if self._up is None:
            self._up_key = key
            self.phase = "opening"
            return [*actions, OpenUpstream(route)]
        return [*actions, *self._send()]

    def _body(self, *, first: bool, head: bytes = b"") -> list[Action]:
        """Forward the request-body events at hand. A malformed body (a bad chunk size, ...)
        is a 400: at once before the target saw a byte of it, else when the response fails
        (the target connection is closed to stop waiting for its answer)."""
        assert self._up is not None
        out = [head] if head else []
        events = self.client.events
        kept = self._outbound if not first else None
        while events:
            kind, value = events[0]
            if kind == DATA:
                events.popleft()
                assert isinstance(value, bytes)
                piece = chunk(value) if self._chunked_up else value
            elif kind == END:
                events.popleft()
                assert isinstance(value, list)
                piece = last_chunk(value) if self._chunked_up else b""
                self.body_done = True
            elif kind == ERROR:
                events.popleft()
                assert self.route is not None
                refusal = Refuse(400, self.route.node.name, f"bad request body: {value}")
                if first:
                    return [*self._drop_upstream(), *self._refuse_with(refusal)]
                self._body_error = refusal
                return self._drop_upstream()
            else:  # the client closed inside the body: the answer is read, the connection ends
                break
            if piece:
                out.append(piece)
                if first and self._outbound is not None:
                    self._outbound.append(piece)
                elif kept is not None:
                    kept.append(piece)
            if self.body_done:
                break
        data = b"".join(out)
        return [WriteUpstream(data)] if data else []

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
                actions: list[Action] = [WriteClient(b"".join(out), counted)] if out else []
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

    @staticmethod
    def _flushed(out: list[bytes], counted: int, then: list[Action]) -> list[Action]:
        return [WriteClient(b"".join(out), counted), *then] if out else then

    def _bad_response(self, what: str) -> list[Action]:
        return self._failed(f"bad response from the target: {what}", status=502)

    def _response_head(self, response: Head, bodiless: bool) -> bytes:
        """The head for the client, and how the body after it is framed. An answer before the
        request body is through closes the connection after it (:meth:`_finished`): it says so."""
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


def post_chunked(path: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\n"
        "4\r\nwxyz\r\n3\r\nabc\r\n0\r\n\r\n"
    ).encode()


OK2 = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
MORE: list[tuple[bytes, bytes, bool]] = [
    # request bodies that arrive after their head, in pieces (``_body(first=False)``)
    (post_chunked("/c"), OK2, False),
    (
        b"POST /l HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 12\r\n\r\nhello, world",
        OK2,
        False,
    ),
    # a long answer in chunks (``_flushed`` per chunk), chunked too
    (
        b"GET /big HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b"0123456789" * 4,
        False,
    ),
    (
        b"GET /tc HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        False,
    ),
]
ENDINGS: list[tuple[bytes, bytes, bool]] = [
    *LAST,
    # an upgrade's 101 (SwitchProtocols after the flushed head), one without an upgrade asked
    (
        b"GET /ws HTTP/1.1\r\nHost: edge-1:9100\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nraw",
        False,
    ),
    (b"GET /n HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n", b"HTTP/1.1 101 No\r\n\r\n", False),
    # a bad answer mid-body (the flushed part, then the failure), a target that closes early
    (b"GET /bad HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\nxx", False),
    (
        b"GET /bad2 HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel\r\nZZZ\r\n",
        False,
    ),
    (
        b"GET /cut HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc",
        True,
    ),
    (b"GET /nothing HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n", b"HTTP/1.1", True),
]
ROUTES: list[Route] = [route("edge-1"), route("edge-1", 9200), route("edge-2", ip="10.1.0.2")]


def pieces(data: bytes, rng: random.Random, most: int) -> list[bytes]:
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(most, len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def run(ex: Exchange, exchanges: list[tuple[bytes, bytes, bool]], seed: int) -> list[object]:
    """Each request on one connection, in random pieces, routed to a random one of
    :data:`ROUTES` (a new route: the target connection changes), its answer in random pieces
    (then the target's close, when it closes after it): each action's ``repr`` (every field
    read) and the action itself, in order."""
    rng = random.Random(seed)
    log: list[object] = []

    def act(actions: list[Action]) -> bool:
        queue: deque[Action] = deque(actions)
        while queue:
            action = queue.popleft()
            log.append((repr(action), action))
            if isinstance(action, RouteRequest):
                queue.extend(ex.routed(rng.choice(ROUTES)))
            elif isinstance(action, OpenUpstream):
                queue.extend(ex.upstream_opened())
            elif isinstance(action, Close | Refuse | SwitchProtocols):
                return False
            else:
                assert isinstance(action, WriteClient | WriteUpstream | ReadBody) or (
                    type(action).__name__ == "CloseUpstream"
                ), action
        return True

    for request, answer, closes in exchanges:
        for piece in pieces(request, rng, rng.randint(0, 3)):
            if not act(ex.receive_client(piece)):
                return log
        for piece in [*pieces(answer, rng, 3), b""] if closes else pieces(answer, rng, 3):
            if ex.phase != "forwarding":
                break
            if not act(ex.receive_upstream(piece)):
                return log
        log.append(ex.phase)
    return log


@pytest.mark.parametrize("ending", range(len(ENDINGS)))
@pytest.mark.parametrize("seed", range(10))
def test_the_same_actions_as_ebcf73b(seed: int, ending: int) -> None:
    rng = random.Random(seed * 100 + ending)
    order = [rng.choice(EXCHANGES + MORE) for _ in range(12)]
    conversation = [*order, ENDINGS[ending]]
    new = run(Exchange(via=VIA, max_head=4096), conversation, seed)
    old = run(FlatOld(via=VIA, max_head=4096), conversation, seed)
    assert new == old
    made = [item[1] for item in new if isinstance(item, tuple)]
    assert sum(1 for a in made if isinstance(a, WriteClient) and a.status) >= 12
    assert any(isinstance(a, WriteUpstream) for a in made)


def test_the_hot_actions_are_whole() -> None:
    """Each per-answer and per-request action, built without its ``__init__``, has every field
    set, equals one its class makes, and is a new object each time (none shared: the driver may
    hold one while the exchange makes the next)."""
    ex = Exchange(via=VIA, max_head=4096)
    first = run(ex, [EXCHANGES[0], MORE[-1], (post_chunked("/x"), OK2, False)], seed=7)
    made = [item[1] for item in first if isinstance(item, tuple)]
    writes = [a for a in made if type(a) in (WriteClient, WriteUpstream)]
    assert len({id(a) for a in writes}) == len(writes)
    for action in writes:
        if isinstance(action, WriteClient):
            assert action == WriteClient(action.data, action.status)
        else:
            assert action == WriteUpstream(action.data)


def test_old_is_ebcf73b_verbatim_and_used() -> None:
    # The oracle's methods are its own, not Exchange's (a typo would fall back silently).
    for name in ("routed", "_body", "receive_upstream", "_flushed", "_response_head"):
        assert name in vars(Old), name


class FlatOld(FlatUpstream, Old):
    """answerside: the oracle reads the parser's ``ANSWER`` events unfolded, as its
    parser queued them."""
