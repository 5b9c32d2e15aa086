"""Review of branch stray (a kept target connection that sends bytes nobody asked for is let go):
the exchange's answers against 812de76's, differentially.

Over generated keep-alive conversations — answers framed by Content-Length, chunked (with chunk
extensions and trailers), 1xx before the final answer, 204 and 304 (with a Content-Length that
frames nothing), HEAD's, ``Connection: close``, HTTP/1.0, bodies ended by the close, empty lines
after an answer, a request body the target answered early — each answer split into reads at
generated places: the client is written the same bytes, the same actions come in the same
order, the target connection is kept and let go exactly as 812de76 did. Only bytes past a kept
answer's end (anything but empty lines) differ, and only by ``CloseUpstream(stray=True)`` at
that answer's end, after the same bytes to the client; the next request then goes on a fresh
connection and gets its own answer.

812de76's ``receive_upstream``, ``upstream_ended``, ``_finished`` and ``_drop_upstream`` are
kept below verbatim (``_OldExchange``: the rest of exchange.py did not change).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

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
from ravenproxy.server.http_messages import DATA, END, EOF, ERROR, HEAD
from ravenproxy.server.http_rewrite import chunk, last_chunk
from tests.helpers import examples

from .flat_events import FlatUpstream
from .test_exchange import VIA, route


class _OldExchange(Exchange):
    """812de76's Exchange: the methods branch stray changed, verbatim."""

    def _drop_upstream(self) -> list[Action]:  # type: ignore[override]
        if self._up is None:
            return []
        self._up = self._up_key = None
        return [CloseUpstream()]

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
                if self._up_keep and self._client_keep and self.body_done:
                    if self.client_raw is None:  # _finished's common case, inline (per request)
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

    def upstream_ended(self) -> list[Action]:  # type: ignore[override]
        """The kept target connection ended between requests: let it go (the next opens one)."""
        return self._drop_upstream() if self.phase == "head" else []

    def _finished(self) -> list[Action]:
        """The response ended: keep both connections for more when both sides are done."""
        if not self.body_done:
            # The target answered before the client finished its body: the rest of it would
            # be read as a new request.
            return [*self._drop_upstream(), *self._close("answered before the request body ended")]
        actions = [] if self._up_keep else self._drop_upstream()
        if self._client_keep and self.client_raw is None:
            self.phase = "head"
            return actions
        return [*actions, *self._close("the client connection cannot carry more")]


# -- generated conversations -----------------------------------------------------------------
HOST = "edge-1:9100"
ROUTE = route("edge-1")


@dataclass
class Turn:
    """One request and its answer, fed in reads cut at ``cuts``; ``close``: the target closes
    after it (a body framed by the close); ``pipelined``: the request went with the last one's
    (in its read)."""

    request: bytes
    answer: bytes
    cuts: list[int]
    close: bool = False
    pipelined: bool = False


def _request(
    method: str, n: int, body: bytes | None, early: bool, close: bool = False, up: bool = False
) -> bytes:
    head = f"{method} /r{n} HTTP/1.1\r\nHost: {HOST}\r\n"
    if close:
        head += "Connection: close\r\n"
    if up:
        head += "Connection: Upgrade\r\nUpgrade: websocket\r\n"
    if body is None:
        return (head + "\r\n").encode()
    length = len(body) + (3 if early else 0)  # early: the body's end never comes
    return (head + f"Content-Length: {length}\r\n\r\n").encode() + body


_BODY = st.binary(max_size=24)
_KINDS = [
    "length",
    "chunked",
    "info",
    "204",
    "304",
    "head",
    "close",
    "http10",
    "http10_keep",
    "until_close",
]


@st.composite
def _chunked(draw: st.DrawFn) -> bytes:
    out = b""
    for part in draw(st.lists(st.binary(min_size=1, max_size=12), max_size=3)):
        ext = draw(st.sampled_from([b"", b";x=1", b";name"]))
        out += b"%x%s\r\n%s\r\n" % (len(part), ext, part)
    out += b"0\r\n"
    if draw(st.booleans()):
        out += b"Trailer-One: 1\r\nX-Sum: abc\r\n"
    return out + b"\r\n"


@st.composite
def _turn(draw: st.DrawFn, n: int) -> Turn:
    kind = draw(st.sampled_from([*_KINDS, "post", "early", "client_close", "refused", "switch"]))
    method, body, early, close = "GET", None, False, False
    body_bytes = draw(_BODY)
    final = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body_bytes), body_bytes)
    if kind == "chunked":
        final = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + draw(_chunked())
    elif kind == "info":
        info = draw(
            st.sampled_from(
                [
                    b"HTTP/1.1 100 Continue\r\n\r\n",
                    b"HTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n",
                ]
            )
        )
        final = info + final
    elif kind == "204":
        final = b"HTTP/1.1 204 No Content\r\nX-A: b\r\n\r\n"
    elif kind == "304":
        # A 304 may say the Content-Length of the 200 it stands for: no body follows.
        final = b'HTTP/1.1 304 Not Modified\r\nETag: "e"\r\nContent-Length: 57\r\n\r\n'
    elif kind == "head":
        method = "HEAD"  # a HEAD's answer ends the parse: its connection is let go
        final = b"HTTP/1.1 200 OK\r\nContent-Length: 57\r\n\r\n"
    elif kind == "close":
        final = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    elif kind == "http10":
        final = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    elif kind == "http10_keep":
        final = b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok"
    elif kind == "until_close":
        final = b"HTTP/1.1 200 OK\r\nX-A: b\r\n\r\n" + body_bytes
        close = True
    elif kind == "switch":  # the bytes past a 101 are the new protocol's, not stray
        final = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n" + body_bytes
    elif kind in ("post", "early"):
        method, body, early = "POST", draw(_BODY), kind == "early"
    if draw(st.booleans()):
        final += draw(st.sampled_from([b"\r\n", b"\n", b"\r\n\r\n"]))  # empty lines: skipped
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(final) - 1)), max_size=6)))
    up = kind in ("refused", "switch")  # an upgrade asked for: answered 200 (refused) or 101
    request = _request(method, n, body, early, close=kind == "client_close", up=up)
    return Turn(request, final, cuts, close, pipelined=n > 0 and draw(st.integers(0, 3)) == 0)


@st.composite
def _conversation(draw: st.DrawFn) -> list[Turn]:
    return [draw(_turn(n)) for n in range(draw(st.integers(1, 5)))]


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *(c for c in cuts if 0 < c < len(data)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


class _Driver:
    """Carries out an exchange's actions as the fronts do (the route at once, the target
    connection opened at once, a pipelined request polled once an answer ended), and records
    every call's actions."""

    def __init__(self, ex: Exchange) -> None:
        self.ex = ex
        self.log: list[tuple[str, list[Action], str]] = []
        self.opened = 0
        self.over = False

    def _carry(self, what: str, actions: list[Action]) -> None:
        self.log.append((what, actions, self.ex.phase))
        for action in actions:
            if isinstance(action, RouteRequest):
                self._carry("routed", self.ex.routed(ROUTE))
            elif isinstance(action, OpenUpstream):
                self.opened += 1
                self._carry("opened", self.ex.upstream_opened())
            elif isinstance(action, (Close, Refuse)):
                self.over = True
            elif isinstance(action, SwitchProtocols):
                self.log.append(("switch", [], repr(self.ex.switch())))
                self.over = True
            else:
                assert isinstance(action, (WriteClient, WriteUpstream, CloseUpstream, ReadBody))

    def client(self, data: bytes) -> None:
        self._carry("client", self.ex.receive_client(data))

    def upstream(self, data: bytes) -> list[Action]:
        actions = self.ex.receive_upstream(data)
        self._carry("upstream", actions)
        return actions

    def poll(self) -> None:
        if self.ex.phase == "head" and not self.over:
            self._carry("poll", self.ex.poll())


def _pair() -> tuple[_Driver, _Driver]:
    return _Driver(FlatOld(via=VIA, max_head=4096)), _Driver(Exchange(via=VIA, max_head=4096))


def _send(drivers: tuple[_Driver, ...], turns: list[Turn], i: int) -> None:
    """Turn ``i``'s request, with the next ones pipelined after it."""
    if turns[i].pipelined and i > 0:
        return  # sent with the last one's
    data = turns[i].request
    for later in turns[i + 1 :]:
        if not later.pipelined:
            break
        data += later.request
    for d in drivers:
        d.client(data)


def _play(drivers: tuple[_Driver, ...], turns: list[Turn], i: int) -> None:
    turn = turns[i]
    _send(drivers, turns, i)
    for piece in _pieces(turn.answer, turn.cuts):
        for d in drivers:
            d.upstream(piece)
    if turn.close:
        for d in drivers:
            d.upstream(b"")
    for d in drivers:
        d.poll()


def _stray_free(old: _Driver, new: _Driver) -> None:
    assert new.log == old.log
    assert new.opened == old.opened and new.over == old.over
    assert not any(
        isinstance(a, CloseUpstream) and a.stray for _, actions, _ in new.log for a in actions
    )


_OK0 = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conversation())
@example([Turn(_request("GET", n, None, False), _OK0 + b"\r\n", []) for n in range(2)])
@example(
    [
        Turn(_request("GET", n, None, False), b"HTTP/1.1 100 Continue\r\n\r\n" + _OK0, [25])
        for n in range(2)
    ]
)
def test_answers_without_stray_bytes_go_as_at_812de76(turns: list[Turn]) -> None:
    old, new = _pair()
    for i in range(len(turns)):
        _play((old, new), turns, i)
        _stray_free(old, new)
        if old.over:
            break


_STRAY = st.sampled_from(
    [
        b"x",
        b" ",
        b"H",
        b"\r\nH",
        b"\r\n\r\nxyz",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nx",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"garbage\r\n\r\n",
    ]
)


def _unclosed(actions: list[Action]) -> list[Action]:
    return [a for a in actions if not isinstance(a, CloseUpstream)]


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conversation(), st.integers(0, 4), _STRAY, st.booleans())
def test_bytes_past_a_kept_answer_let_its_connection_go_after_the_same_bytes(
    turns: list[Turn], at: int, stray: bytes, own_read: bool
) -> None:
    """The answer's bytes reach the client as at 812de76, in the same writes, with the same
    actions; then, where 812de76 kept the connection (the stray bytes in the answer's last
    read), it is let go as stray, and the next request goes on a fresh one with its own answer.
    In a read of their own the exchange has them not (the answer is over: phase "head"), as at
    812de76: the drivers' hooks do (test_review22_kept), and ``upstream_ended(stray=True)``
    lets it go."""
    old, new = _pair()
    for i, turn in enumerate(turns):
        if i != at:
            _play((old, new), turns, i)
            _stray_free(old, new)
            if old.over:
                return
            continue
        _send((old, new), turns, i)
        pieces = _pieces(turn.answer, turn.cuts)
        if own_read or turn.close:
            pieces.append(stray)
        else:
            pieces[-1] += stray
        for piece in pieces[:-1]:
            old.upstream(piece)
            new.upstream(piece)
        assert new.log == old.log
        own_read = own_read or turn.close or new.ex.phase != "forwarding"
        got_old, got_new = old.upstream(pieces[-1]), new.upstream(pieces[-1])
        if own_read:  # the answer ended before (or ends with the close, after the stray bytes)
            assert got_new == got_old
            if turn.close:
                got_old, got_new = old.upstream(b""), new.upstream(b"")
                assert got_new == got_old
            assert new.ex.phase == old.ex.phase
            kept = old.ex.phase == "head" and old.ex._up is not None
            assert new.ex.upstream_ended(stray=True) == (
                [CloseUpstream(stray=True)] if kept else []
            )
        else:
            assert _unclosed(got_new) == _unclosed(got_old) and new.ex.phase == old.ex.phase
            # Let go as stray exactly where 812de76 kept it for the next request (or would
            # have, but for the client's ``close``).
            kept = old.ex._up_keep and old.ex.body_done and old.ex.phase in ("head", "closed")
            kept = kept and SwitchProtocols() not in got_old  # past a 101: the new protocol's
            assert (CloseUpstream(stray=True) in got_new) == kept, (got_old, got_new)
            closes = [a for a in got_new if isinstance(a, CloseUpstream)]
            assert len(closes) == max(int(kept), len(got_old) - len(_unclosed(got_old)))
            if kept:
                assert got_new[-1] == CloseUpstream(stray=True) or got_new[-2:] == [
                    CloseUpstream(stray=True),
                    got_old[-1],
                ]
        new.log.append(("stray", got_new, new.ex.phase))
        if new.over or new.ex.phase != "head":
            return
        before = new.opened
        if new.ex.head_begun:
            new.poll()  # the pipelined request, parsed already
        else:
            new.client(_request("GET", 99, None, False))
        if new.over:  # the pipelined bytes were a bad request (an early answer's body took some)
            return
        assert new.ex.phase == "forwarding" and new.opened == before + 1  # a fresh connection
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nmine"
        got = new.upstream(answer)
        to_client = b"".join(a.data for a in got if isinstance(a, WriteClient))
        assert to_client.startswith(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n")
        assert to_client.endswith(b"\r\n\r\n" if new.ex._request.start == "HEAD" else b"mine")
        assert not any(isinstance(a, CloseUpstream) and a.stray for a in got)
        return


class FlatOld(FlatUpstream, _OldExchange):
    """answerside: the oracle reads the parser's ``ANSWER`` events unfolded, as its
    parser queued them."""
