"""The target's side of an :class:`~ravenproxy.server.exchange.Exchange`: its answer read
(parsed by :mod:`ravenproxy.server.http_messages`) and sent on to the client, a lost or idle
target connection, the switch after a ``101``, and how an exchange ends (a refusal, a close,
the target connection dropped). A base of the exchange (its own module: one concept, the
answer, where the exchange's is the request), reading and setting the exchange's state it
declares; sans-I/O as the exchange is.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ravenproxy.server.answer_head import AnswerHead
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    CloseUpstream,
    OpenUpstream,
    Refuse,
    SwitchProtocols,
    WriteClient,
)
from ravenproxy.server.http_events import ANSWER, DATA, END, EOF, ERROR, HEAD
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_rewrite import chunk, last_chunk, switch_head
from ravenproxy.server.near_answers import unfolded
from ravenproxy.server.router import Route, UpstreamKey

_new = object.__new__
"""A hot action made by this and its fields' stores, not by its class (a dataclass's
``__init__`` is a Python call: ~1 660 instructions against ~1 120; exchange_actions' note)."""

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

_CLOSED_UNANSWERED = "the target closed the connection without answering"


class AnswerSide(AnswerHead):
    """The target side of :class:`~ravenproxy.server.exchange.Exchange` and its endings. The
    state it reads is the exchange's (set by its ``__init__``; declared here, not made)."""

    phase: str
    max_head: int
    route: Route | None
    client_raw: bytes | None
    started: bool
    _upgrade: bool
    _outbound: list[bytes] | None
    _up_key: UpstreamKey | None
    _up_rest: bytes
    _reused: bool
    _switched: Head | None
    _info: bool
    _body_error: Refuse | None

    # -- the target side ----------------------------------------------------------------------
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
            elif kind == HEAD or kind == ANSWER:
                answer = None
                if kind == ANSWER:  # a whole answer (near_answers.Answer)
                    if not (self._client_keep and self.body_done):
                        # Not the plain case kept alive below (where an ANSWER, plain, not a
                        # HEAD's, of a final status with a body, always goes): its HEAD, DATA and
                        # END as llhttp's events, next (its own head made).
                        events.extendleft(unfolded(value)[::-1])
                        continue
                    # A head of its layout: its status, size, plainness and version (all that
                    # is read of it here) the answer's own; its values maybe not.
                    answer, value = value, value[0]
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
                        if answer is not None:  # head, body and end: its bytes as they came
                            out.append(answer[1])
                            break  # (its end: below)
                        out.append(value.wire)
                    else:
                        out.append(self._response_head(value, up.bodiless))  # no keyword: faster
            elif kind == END:
                if self._info:
                    self._info = False
                    continue
                if self._body_out == "chunked":
                    out.append(last_chunk(value))
                break  # (the answer's end: below)
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
        else:  # no answer ended
            if up.in_head and up.fed > self.max_head:
                return self._flushed(out, counted, self._bad_response("head too large"))
            return self._flushed(out, counted, [])
        # An answer ended (its END, or an ANSWER's whole).
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

    @staticmethod
    def _flushed(out: list[bytes], counted: int, then: list[Action]) -> list[Action]:
        if not out:
            return then
        write = _new(WriteClient)  # (each chunk of a long answer: no __init__ called)
        write.data, write.status = b"".join(out), counted
        return [write, *then]

    def _bad_response(self, what: str) -> list[Action]:
        return self._failed(f"bad response from the target: {what}", status=502)

    def upstream_lost(self) -> list[Action]:
        """Reading from, or writing to, the target connection failed."""
        if self.phase != "forwarding":
            return []
        return self._failed("the connection to the target was lost")

    def upstream_ended(self, stray: bool = False) -> list[Action]:
        """The kept target connection ended (``stray``: sent bytes) between requests: let it go."""
        return self._drop_upstream(stray) if self.phase == "head" else []

    def upstream_idle(self, timeout: float) -> list[Action]:
        """No byte either way for ``timeout`` seconds (--idle-timeout)."""
        if self.started:
            return self._close("idle")
        assert self.route is not None
        return self._refuse(
            504, self.route.node.name, f"no byte either way for {timeout:g}s (--idle-timeout)"
        )

    def switch(self) -> tuple[bytes, bytes, bytes]:
        """After :class:`SwitchProtocols`: the 101 for the client, the client's bytes read past
        its request, the target's bytes read past its 101."""
        event = self._switched
        assert self._up is not None and self.phase == "switching" and event is not None
        self.phase = "closed"
        return switch_head(event), self.client_raw or b"", self._up_rest

    def _failed(self, what: str, *, status: int | None = None) -> list[Action]:
        """The target connection failed before the response ended (``what`` "": it closed)."""
        assert self.route is not None
        node = self.route.node.name
        if self._body_error is not None and not self.started:
            return [*self._drop_upstream(), *self._refuse_with(self._body_error)]
        request = self._request
        if (
            self._reused
            and self._outbound is not None
            and self.body_done
            and request is not None
            and request.start in IDEMPOTENT
            and not self.started
        ):
            # A kept connection the target closed while idle fails before any answer: the
            # request goes again, whole, on a new one (that one is not retried).
            actions = self._drop_upstream()
            self.phase = "opening"
            self._up_key = UpstreamKey.of(self.route)
            return [*actions, OpenUpstream(self.route)]
        if not self.started:
            return [
                *self._drop_upstream(),
                *self._refuse(status or 502, node, what or _CLOSED_UNANSWERED),
            ]
        return self._close(what or "the target closed the connection mid-response")

    def _finished(self) -> list[Action]:
        """The response ended: keep both connections for more when both sides are done."""
        if not self.body_done:
            # The target answered before the client finished its body: the rest of it would
            # be read as a new request.
            return [*self._drop_upstream(), *self._close("answered before the request body ended")]
        up, keep = self._up, self._up_keep
        # Bytes past the answer's end (a body longer than its Content-Length, say) would begin
        # the next request's answer: the connection is not used again (Envoy's, HAProxy's rule).
        stray = keep and up is not None and bool(up.events or up.in_head)
        actions = [] if keep and not stray else self._drop_upstream(stray)
        if self._client_keep and self.client_raw is None:
            self.phase = "head"
            return actions
        return [*actions, *self._close("the client connection cannot carry more")]

    # -- endings ------------------------------------------------------------------------------
    def _refuse(self, status: int, node: str, reason: str) -> list[Action]:
        return self._refuse_with(Refuse(status, node, reason))

    def _refuse_with(self, refusal: Refuse) -> list[Action]:
        self.phase = "closed"
        return [*self._drop_upstream(), refusal]

    def _close(self, reason: str) -> list[Action]:
        self.phase = "closed"
        return [*self._drop_upstream(), Close(reason)]

    def _drop_upstream(self, stray: bool = False) -> list[Action]:
        if self._up is None:
            return []
        self._up = self._up_key = None
        return [CloseUpstream(stray)]
