"""Review of branch ansside (issue 15): the answer side against 812de76's, differentially.

ansside cuts the work per answer: the response head's build (its wire made from a template per
shape — status, reason, field names — shared by every target connection, PlainHead), the
exchange's receive_upstream/_body/_finished and the path from the tunnel stream to the client
write. Framing is where an answer can go wrong: Content-Length, chunked (trailers), until-close,
HEAD/204/304, 1xx (100, 103, several), 101, Connection: close and other hop-by-hop fields, an
answer before the request body is through, a truncated answer, a target closing between
requests, a body split at every byte.

Pinned here: 812de76's :class:`Exchange` kept verbatim below (``_OldExchange``; only renamed,
with 812de76's request_head and same_fields, and 3466b61's Parsed — whose parse
test_srvhttp_requests and test_review20_requests hold equal to 812de76's: only its request
side changed since, to the same events — as ``_OldParsed``), and the branch's Exchange fed the
same client bytes and the same target bytes, cut the same way; after every call the actions
of both (the bytes to the client and their counted status, the bytes to the target, the
connections closed or opened, refusals and closes with their reasons), their phase and
keep-alive decisions are compared. And the branch's Parsed against ``_OldParsed`` over answers
whose reason, names and values hold ``%`` and odd bytes, on many connections at once (shared
shapes), past the shape cache's bounds. Nothing is imported from a baseline checkout; the
helpers neither branch changes (response_framing, keeps_alive, find_destination, forwardable,
chunk, fields, UpstreamKey) are imported.
"""

from __future__ import annotations

from collections import deque
from dataclasses import astuple
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as tally
from hypothesis import strategies as st

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
from ravenproxy.server.http1 import BadRequest
from ravenproxy.server.http_heads import Head, keeps_alive
from ravenproxy.server.http_messages import DATA, END, EOF, ERROR, HEAD
from ravenproxy.server.http_rewrite import (
    Framing,
    Outbound,
    chunk,
    fields,
    header,
    last_chunk,
    response_framing,
)
from ravenproxy.server.loops import via_received_by
from ravenproxy.server.podroutes import (
    _POD_PATH_HEADS,
    NODE_NAME_PARAM,
    Destination,
    find_destination,
    forwardable,
)
from ravenproxy.server.router import Route, UpstreamKey
from tests.helpers import examples

from .flat_events import FlatParsed
from .test_exchange import VIA, route
from .test_reqside_requests import _old_request_head
from .test_review20_requests import _answer_view
from .test_srvhttp_requests import _OldParsed

# -- 812de76's same_fields, verbatim (only renamed); its request_head is test_reqside_requests' --


def _old_same_fields(last: Destination, target: str) -> Destination | None:
    """The destination of a request with the method, version and fields of the one ``last``
    was found for (by :func:`find_destination`), whose target is ``target``: ``last``'s node
    and port when that request named them by X-Tunnel-Proxy-Host (which no target overrides
    but a non-origin one), or by Host and this target names no node itself (no ``nodeName``
    nor ``%`` in it, no pod path's start); else None (:func:`find_destination` asks)."""
    if target[:1] != "/":
        return None
    via = last.via
    if via == "host":
        if NODE_NAME_PARAM in target or "%" in target or target[1:5] in _POD_PATH_HEADS:
            return None
    elif via != "tunnel-header":
        return None
    # Positional: a call with keywords is not specialized.
    return Destination(via, last.host, last.port, None, target)


# -- 812de76's Exchange, verbatim (only renamed: _OldExchange, _OldParsed, the two above) ---------


_OLD_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class _OldExchange:
    """See the module docstring. ``phase``: ``head`` (waiting for a request head), ``routing``,
    ``opening``, ``forwarding`` (request sent, response being read), ``switching``,
    ``closed``."""

    def __init__(self, *, via: str, max_head: int) -> None:
        self.via = via
        self.max_head = max_head
        self.client = _OldParsed(response=False, max_tail=max_head)
        self.phase = "head"
        self.first = True
        """No request has begun on this connection yet."""
        self.route: Route | None = None
        self._request: Head | None = None
        self._dest: Destination | None = None
        self.client_raw: bytes | None = None
        """Bytes past an upgrade's or a CONNECT's head (not HTTP: never parsed)."""
        self._client_keep, self._upgrade = True, False
        self._chunked_up = False
        """The request body goes to the target chunked."""
        self._outbound: list[bytes] | None = None
        """What went to the target: replayed on a retry (only kept when it is whole)."""
        self._up: _OldParsed | None = None
        self._up_key: UpstreamKey | None = None
        self._up_used, self._up_keep, self._up_rest, self._reused = False, False, b"", False
        self._switched: Head | None = None
        self._info = False
        """The head being forwarded is a 1xx (its end writes nothing)."""
        self._body_out = "length"
        """How the response body goes to the client: ``length``, ``chunked`` or ``none``."""
        self._until_close = False
        """The response body ends when the target closes the connection."""
        self.body_done = False
        """The request body was forwarded whole (or there is none)."""
        self._body_error: Refuse | None = None
        self.started = False
        """Part of a response went to the client: a refusal can no longer be answered."""
        # What the last heads led to, reused while the next are the same (Parsed._last) objects:
        self._seen: tuple[Head, bool, RouteRequest] | None = None
        self._built: tuple[Head, Route, Outbound, WriteUpstream] | None = None
        self._answered: tuple[Head, Head | None, tuple[bool, ...], Framing] | None = None

    # -- the client side ----------------------------------------------------------------------
    @property
    def head_begun(self) -> bool:
        """Bytes of a next request head are buffered already."""
        return bool(self.client.events) or self.client.in_head

    def receive_client(self, data: bytes) -> list[Action]:
        """Bytes from the client; ``b""``: it closed its side."""
        if self.phase == "closed":
            return []
        seen = self._seen
        if seen is not None and self.phase == "head" and self.client.again(data, seen[0]):
            # The last request again (no HEAD event queued): it goes on as it went (the head
            # of _on_request, inline: once a request).
            self._client_keep, self._request, self._dest = seen[1], seen[0], seen[2].dest
            self.phase = "routing"
            return [seen[2]]
        if not data:
            self.client.events.append((EOF, None))
        elif self.client_raw is not None:
            self.client_raw += data
        else:
            self.client_raw = self.client.feed(data)
        return self._client_events()

    def _client_events(self) -> list[Action]:
        if self.phase == "head":
            events = self.client.events
            if not events:
                if self.client.fed > self.max_head:
                    return self._refuse(431, "", f"request head larger than {self.max_head} bytes")
                return []
            kind, value = events.popleft()
            if kind == HEAD:
                self.first = False
                assert isinstance(value, Head)
                return self._on_request(value)
            if kind == ERROR:
                if "Content-Length" in str(value) and "Transfer-Encoding" in str(value):
                    # RFC 9112 §6.1: a proxy must not forward both (how requests are smuggled
                    # past one parser into another); refusing, then closing, is allowed.
                    reason = "both Content-Length and Transfer-Encoding"
                    return self._refuse(400, "", f"bad request: {reason}")
                return self._refuse(400, "", f"bad request: {value}")
            self.phase = "closed"
            return [Close("the client closed the connection")]
        if self.phase in ("forwarding", "switching") and not self.body_done:
            return self._body(first=False)
        return []  # bytes of a next request wait until this exchange is done

    poll = _client_events
    """Act on client bytes already buffered (after a finished exchange); the same method."""

    def _on_request(self, request: Head) -> list[Action]:
        seen = self._seen
        if seen is not None and seen[0] is request:  # as the last one: it went on
            self._client_keep = seen[1]
            self._request, self._dest = request, seen[2].dest
            self.phase = "routing"
            return [seen[2]]
        if request.size > self.max_head:
            return self._refuse(431, "", f"request head larger than {self.max_head} bytes")
        routing = request.routing  # all it reads of the fields (Head.routing: Host, Via, ...)
        dest = None
        if seen is not None and routing is (last := seen[0]).routing:
            # The last request's fields (the parse shares their routing fields then: a
            # keep-alive client's next URL): what they decided stands (Host, keep-alive, Via);
            # only its target may name another node.
            if request.start == last.start and request.version == last.version:
                dest = _old_same_fields(seen[2].dest, request.target)
                self._client_keep = seen[1]
        if dest is None:
            host = routing.get("host")
            if (host is None and request.version == "1.1") or (host is not None and "," in host):
                why = "bad request: an HTTP/1.1 request needs one Host field"
                return self._refuse(400, "", why)
            self._client_keep = keeps_alive(request)
            try:
                dest = find_destination(request.start, request.target, (), routing)
            except BadRequest as exc:
                return self._refuse(exc.status, "", exc.reason)
            via = routing.get("via")
            if via and self.via in via_received_by([via]):
                node = dest.host or (f"pod {dest.pod[0]}/{dest.pod[1]}" if dest.pod else "")
                why = "loop detected: the request already passed through this server"
                return [Looped(), *self._refuse(508, node, f"{why} (Via {self.via})")]
        self._request, self._dest = request, dest
        if dest.via == "connect":
            self.phase = "closed"
            return [*self._drop_upstream(), Tunnel(dest, self.client_raw or b"")]
        self.phase = "routing"
        action = RouteRequest(dest)
        self._seen = (request, self._client_keep, action)
        return [action]

    # -- routing and the target connection ----------------------------------------------------
    def routed(self, route: Route) -> list[Action]:
        """The request's route: keep the target connection when it fits, else open one."""
        assert self.phase == "routing" and self._request is not None and self._dest is not None
        same = route is self.route and self._up is not None  # the driver reused the route
        self.route = route
        self.body_done, self._body_error, self.started = False, None, False
        # The head for the target, reused while the request head and the route are the same
        # objects (a keep-alive client polling one URL); inline: it runs per request.
        request, built = self._request, self._built
        if built is None or built[0] is not request or built[1] is not route:
            out = _old_request_head(request, self._dest, route, self.via)
            built = self._built = (request, route, out, WriteUpstream(out.head))
        head, self._upgrade, self._chunked_up = built[2]  # an Outbound, unpacked as a tuple
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

    def refused(self, status: int, node: str, reason: str) -> list[Action]:
        """Routing, or opening the target connection, failed with this status."""
        return self._refuse(status, node, reason)

    def upstream_opened(self) -> list[Action]:
        """The target connection :class:`OpenUpstream` asked for is open."""
        assert self.phase == "opening"
        self._up = _OldParsed(response=True, max_tail=self.max_head)
        self._up_used = False
        return self._send()

    def _drop_upstream(self) -> list[Action]:
        if self._up is None:
            return []
        self._up = self._up_key = None
        return [CloseUpstream()]

    def _send(self) -> list[Action]:
        """The request (and the body bytes at hand) to the target connection."""
        assert self._up is not None and self._outbound is not None and self._request is not None
        self._reused = self._up_used
        self._up_used = True
        self._up.bodiless = self._request.start == "HEAD"
        self.phase = "forwarding"
        if self.body_done:  # a retry: the request went whole the first time
            return [WriteUpstream(b"".join(self._outbound))]
        events = self.client.events
        if events and events[0][0] == END and not self._chunked_up:
            # A whole request without a body (most are): its head, as _body would send it
            # (the action made with the head: this is the head in _outbound).
            events.popleft()
            self.body_done = True
            assert self._built is not None
            return [self._built[3]]
        actions = self._body(first=True, head=self._outbound[0])
        if not self.body_done and self.phase == "forwarding":
            self._outbound = None  # not whole: never retried
            actions.append(ReadBody())
        return actions

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
                what = "the connection was closed" if self.started else _OLD_CLOSED_UNANSWERED
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

    def upstream_lost(self) -> list[Action]:
        """Reading from, or writing to, the target connection failed."""
        if self.phase != "forwarding":
            return []
        return self._failed("the connection to the target was lost")

    def upstream_ended(self) -> list[Action]:
        """The kept target connection ended between requests: let it go (the next opens one)."""
        return self._drop_upstream() if self.phase == "head" else []

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
        self.phase, headers = "closed", event.headers
        kept = forwardable(headers, upgrade=header(headers, "upgrade") or "websocket")
        head = f"HTTP/1.1 101 {event.start}\r\n".encode("latin-1") + fields(kept) + b"\r\n"
        return head, self.client_raw or b"", self._up_rest

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
            and request.start in _OLD_IDEMPOTENT
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
                *self._refuse(status or 502, node, what or _OLD_CLOSED_UNANSWERED),
            ]
        return self._close(what or "the target closed the connection mid-response")

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

    # -- endings ------------------------------------------------------------------------------
    def _refuse(self, status: int, node: str, reason: str) -> list[Action]:
        return self._refuse_with(Refuse(status, node, reason))

    def _refuse_with(self, refusal: Refuse) -> list[Action]:
        self.phase = "closed"
        return [*self._drop_upstream(), refusal]

    def _close(self, reason: str) -> list[Action]:
        self.phase = "closed"
        return [*self._drop_upstream(), Close(reason)]


_OLD_CLOSED_UNANSWERED = "the target closed the connection without answering"


# -- the twin drive: both exchanges, the same calls, compared after each ---------------------------


def _view(actions: list[Action]) -> list[Any]:
    """Actions as data: adjacent writes to one side joined (how many writes carry the bytes is
    the driver's business, not what they say), a final answer's status with its bytes."""
    out: list[Any] = []
    for a in actions:
        if type(a) is WriteClient:
            if out and out[-1][0] == "client":
                out[-1] = ("client", out[-1][1] + bytes(a.data), [*out[-1][2], a.status])
            else:
                out.append(("client", bytes(a.data), [a.status]))
        elif type(a) is WriteUpstream:
            if out and out[-1][0] == "up":
                out[-1] = ("up", out[-1][1] + bytes(a.data))
            else:
                out.append(("up", bytes(a.data)))
        elif isinstance(a, RouteRequest | Tunnel):
            out.append((type(a).__name__, astuple(a.dest)))
        elif isinstance(a, OpenUpstream):
            out.append(("open", a.route))
        else:
            out.append(a)
    for i, item in enumerate(out):  # statuses: the counted ones only (0: a body's or a 1xx's)
        if type(item) is tuple and item[0] == "client":
            out[i] = ("client", item[1], [s for s in item[2] if s])
    return out


_STATE = ("phase", "_client_keep", "_up_keep", "body_done", "started", "client_raw", "_up_rest")


class _Twins:
    """The branch's Exchange and 812de76's, driven alike; each call's actions compared."""

    def __init__(self, max_head: int = 4096, *, tallied: bool = False) -> None:
        self.tallied = tallied
        """Tally refusals and closes (inside a hypothesis test only)."""
        self.new = Exchange(via=VIA, max_head=max_head)
        self.old = _OldExchange(via=VIA, max_head=max_head)
        self.route = route("a")

    def call(self, name: str, *args: Any) -> list[Any]:
        got = _view(getattr(self.new, name)(*args))
        want = _view(getattr(self.old, name)(*args))
        assert got == want, (name, args)
        for attr in _STATE:
            assert getattr(self.new, attr) == getattr(self.old, attr), (name, attr)
        assert (self.new._up is None) == (self.old._up is None), name
        for item in got if self.tallied else ():
            if isinstance(item, Refuse | Close):
                tally(f"{type(item).__name__}: {getattr(item, 'status', '')} {item.reason[:40]}")
        return got

    def settle(self, view: list[Any]) -> None:
        """Answer what the exchanges asked: a route (always the same object: the target
        connection is kept when its key matches), a target connection opened."""
        while view:
            item, view = view[0], view[1:]
            if type(item) is tuple and item[0] == "RouteRequest":
                view = self.call("routed", self.route) + view
            elif type(item) is tuple and item[0] == "open":
                view = self.call("upstream_opened") + view
            elif isinstance(item, SwitchProtocols):
                assert self.new.switch() == self.old.switch()
                return

    @property
    def phase(self) -> str:
        return str(self.new.phase)


# -- generated conversations: requests and the answers a target may give -----------------------

_ANSWER_FIELDS = [
    b"Date: Sat, 05 Dec 2026 06:00:00 GMT",
    b"Content-Type: text/plain; version=0.0.4",
    b"content-type: text/plain",
    b"Connection: close",
    b"Connection: keep-alive",
    b"Connection: x-foo",
    b"X-Foo: 1",
    b"Proxy-Connection: close",
    b"Keep-Alive: timeout=5",
    b"Upgrade: h2c",
    b"TE: trailers",
    b"Trailer: X-T",
    b"Via: 1.1 other",
    b"Server:  x ",
    b"X-\xe9: \xe9",
    b"Set-Cookie: a=1",
    b"X-%b: %s",
    b"X-%%: 100%",
    b"X-Pct: %d%s%%",
    b"%: %",
    b"X-Empty: ",
    b'ETag: "%22"',
]
_REASONS = [b"OK", b"OK", b"", b"Fine", b"100% OK", b"%b", b"%s%%", b"\xe9t\xe9", b"Not Found"]


@st.composite
def _answer(draw: st.DrawFn, head_request: bool) -> tuple[bytes, str]:
    """An answer (interim ones first, or none), and how its body is framed."""
    interim = b"".join(
        draw(
            st.lists(
                st.sampled_from(
                    [
                        b"HTTP/1.1 100 Continue\r\n\r\n",
                        b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n",
                        b"HTTP/1.1 102 %Processing\r\nX-%: 1\r\n\r\n",
                    ]
                ),
                max_size=2,
            )
        )
    )
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.1", b"1.0"]))
    status = draw(st.sampled_from([200] * 6 + [201, 204, 304, 404, 500, 101, 599, 999]))
    reason = draw(st.sampled_from(_REASONS))
    flds = draw(st.lists(st.sampled_from(_ANSWER_FIELDS), max_size=4))
    framing = draw(st.sampled_from(["length"] * 5 + ["chunked", "chunked", "close", "length0"]))
    size = draw(st.integers(0, 9))
    body = bytes(range(97, 97 + size))
    if framing == "length":
        flds.append(draw(st.sampled_from([b"Content-Length: %d", b"content-length: %d"])) % size)
    elif framing == "length0":
        flds.append(b"Content-Length: 0")
        body = b""
    elif framing == "chunked":
        flds.append(b"Transfer-Encoding: chunked")
        trailers = draw(st.sampled_from([b"", b"X-T: 1\r\n", b"Via: 1.1 t\r\nX-%: %\r\n"]))
        pieces = draw(st.sampled_from([[body], [body[:2], body[2:]], []]))
        body = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces if p) + b"0\r\n"
        body += trailers + b"\r\n"
    flds = list(draw(st.permutations(flds)))
    if head_request or status in (204, 304) or status < 200:
        body = b""
    head = b"HTTP/%b %d %b\r\n" % (version, status, reason)
    return interim + head + b"".join(f + b"\r\n" for f in flds) + b"\r\n" + body, framing


@st.composite
def _request(draw: st.DrawFn) -> tuple[bytes, bytes, str]:
    """(head, body, method): the body may be sent before or after the answer."""
    method = draw(st.sampled_from(["GET", "GET", "GET", "HEAD", "POST", "PUT"]))
    version = draw(st.sampled_from(["1.1", "1.1", "1.1", "1.0"]))
    target = draw(st.sampled_from(["/metrics", "/ping?n=1", "/containerLogs/ns/p/c?follow=true"]))
    flds = ["Host: a:9100"]
    flds += draw(
        st.lists(
            st.sampled_from(
                [
                    "Connection: close",
                    "Connection: keep-alive",
                    "Connection: Upgrade",
                    "Upgrade: websocket",
                    "Expect: 100-continue",
                    "Accept: */*",
                    "TE: trailers",
                ]
            ),
            max_size=2,
            unique=True,
        )
    )
    body = b""
    if method in ("POST", "PUT"):
        if draw(st.booleans()):
            flds.append("Content-Length: 5")
            body = b"hello"
        else:
            flds.append("Transfer-Encoding: chunked")
            body = b"5\r\nhello\r\n0\r\n\r\n"
    head = f"{method} {target} HTTP/{version}\r\n" + "".join(f"{f}\r\n" for f in flds) + "\r\n"
    return head.encode("latin-1"), body, method


@st.composite
def _steps(draw: st.DrawFn) -> list[tuple[bytes, bytes, str, bytes, list[int], str]]:
    """A conversation: each request with its answer, where the body goes, how the answer is
    cut, and how the target's side ends (kept, closed after the answer, closed mid-answer,
    lost, ended between requests, idle). Never bytes past an answer's end: since 2a0d526
    (stray, after 812de76) such a target connection is let go, as stray's tests pin."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        head, body, method = draw(_request())
        answer, _ = draw(_answer(method == "HEAD"))
        cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(answer) - 1)), max_size=4))))
        end = draw(st.sampled_from(["kept"] * 6 + ["eof", "eof-mid", "lost", "ended", "idle"]))
        out.append((head, body, method, answer, cuts, end))
    return out


def framing_of(answer: bytes) -> str:
    head = answer.rpartition(b"HTTP/1.")[2].partition(b"\r\n\r\n")[0].lower()
    if b"transfer-encoding" in head:
        return "chunked"
    return "length" if b"content-length" in head else "no length"


def _converse(steps: list[tuple[bytes, bytes, str, bytes, list[int], str]], data: Any) -> None:
    # The head-size limit far, or near a request's or an answer's head (431, "head too large").
    limit = data.draw(st.sampled_from([4096, 4096, 4096, 90, 120, 160, 200]))
    twins = _Twins(limit, tallied=True)
    for head, body, method, answer, cuts, end in steps:
        tally(f"{method}: {twins.phase}")
        if twins.phase != "head":
            return
        late = bool(body) and data.draw(st.sampled_from([False, False, True]))
        twins.settle(twins.call("receive_client", head if late else head + body))
        if twins.phase not in ("forwarding", "switching"):
            return
        if end == "eof-mid":
            answer = answer[: data.draw(st.integers(0, len(answer)))]
        for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True):
            piece = answer[a:b]
            if piece and twins.phase in ("forwarding", "opening"):
                twins.settle(twins.call("receive_upstream", piece))
            if late and a == 0 and twins.phase == "forwarding":
                twins.settle(twins.call("receive_client", body))
                late = False
        if late and twins.phase != "closed":
            twins.settle(twins.call("receive_client", body))
        if end in ("eof", "eof-mid"):
            twins.settle(twins.call("receive_upstream", b""))
        elif end == "lost":
            twins.settle(twins.call("upstream_lost"))
        elif end == "ended":
            twins.settle(twins.call("upstream_ended"))
        elif end == "idle" and twins.phase == "forwarding":
            twins.settle(twins.call("upstream_idle", 5.0))
        tally(f"after {framing_of(answer)}/{end}: {twins.phase}")
        if twins.phase == "head":
            twins.settle(twins.call("poll"))


@settings(max_examples=examples(2500), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_steps(), st.data())
def test_a_conversation_goes_both_ways_as_812de76s(steps: Any, data: Any) -> None:
    """Keep-alive conversations (GET, HEAD, POST/PUT with a body sent before or after the
    answer, Expect, Upgrade, HTTP/1.0 and 1.1; answers interim and final, every framing,
    hop-by-hop fields, ``%`` in reasons, names and values, cut anywhere, the target closing
    after, mid-answer or between requests, lost, idle): after every call the
    branch's exchange does what 812de76's did."""
    _converse(steps, data)


# -- every byte: fixed answers with each framing, cut at each place and fed byte by byte ---------

_FIXED = [
    (
        b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    ),
    (
        b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-%: %s\r\n\r\n"
        b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nX-T: 1\r\nVia: t\r\n\r\n",
    ),
    (
        b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n",
        b"HTTP/1.1 200 100%\r\nDate: x\r\n\r\nuntil close",
    ),
    (
        b"GET /m HTTP/1.0\r\nHost: a:9100\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nbye",
    ),
    (
        b"HEAD /m HTTP/1.1\r\nHost: a:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\nKeep-Alive: timeout=5\r\n\r\n",
    ),
    (b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n", b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'),
    (b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n", b"HTTP/1.1 204 No Content\r\n\r\n"),
    (
        b"POST /m HTTP/1.1\r\nHost: a:9100\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
    ),
    (
        b"GET /ws HTTP/1.1\r\nHost: a:9100\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\n\r\n\x81",
    ),
    (
        b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\nx\r\n0\r\n\r\n",
    ),
    (
        b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
    ),
    (b"GET /m HTTP/1.1\r\nHost: a:9100\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"),
]


def _fixed(request: bytes, pieces: list[bytes]) -> None:
    twins = _Twins()
    twins.settle(twins.call("receive_client", request))
    for piece in pieces:
        if twins.phase != "forwarding":
            return
        twins.settle(twins.call("receive_upstream", piece))
    if twins.phase == "forwarding":
        twins.settle(twins.call("receive_upstream", b""))
    if twins.phase == "head":
        twins.settle(twins.call("receive_client", request))


@pytest.mark.parametrize(("request_", "answer"), _FIXED)
def test_an_answer_cut_at_every_byte_goes_on_as_812de76s(request_: bytes, answer: bytes) -> None:
    """Each framing (length, chunked with extensions and trailers, until close, HTTP/1.0 with
    Connection: close, HEAD, 304, 204, 100 and 103 before a 201, 101, both lengths, short,
    bad), cut in two at every place, then fed a byte at a time; the target's close after, and
    the client's next request."""
    for cut in range(len(answer) + 1):
        _fixed(request_, [answer[:cut], answer[cut:]])
    _fixed(request_, [answer[i : i + 1] for i in range(len(answer))])


# -- the answer parse: many target connections at once, odd reasons, names and values --------------


@settings(max_examples=examples(800), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), _answer(False), st.booleans()), min_size=1, max_size=8),
    st.data(),
)
def test_answers_on_many_connections_parse_as_812de76s(answers: list[Any], data: Any) -> None:
    """Answers (interim and final, ``%`` in the reason, names and values, every framing) on
    three target connections at once, each cut anywhere: every event, every head (its type,
    fields, size, wire, plainness) and the head and framing the client would get for it, as
    812de76's parse gives them (what one connection's answers leave behind does not show in
    another's)."""
    new = [FlatParsed(response=True, max_tail=8192) for _ in range(3)]
    old = [_OldParsed(response=True, max_tail=8192) for _ in range(3)]
    for conn, (answer, _), bodiless in answers:
        cuts = sorted(data.draw(st.lists(st.integers(0, len(answer)), max_size=2)))
        for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True):
            new[conn].bodiless = old[conn].bodiless = bodiless
            assert new[conn].feed(answer[a:b]) == old[conn].feed(answer[a:b])
            got = [_answer_view(e, bodiless) for e in new[conn].events]
            assert got == [_answer_view(e, bodiless) for e in old[conn].events], answer
            new[conn].events.clear()
            old[conn].events.clear()


def _many(names: int, width: int, count: int) -> list[bytes]:
    return [
        b"HTTP/1.1 200 R%d\r\n" % i
        + b"".join(b"X-%d-%s: v%d%%\r\n" % (j, b"n" * width, i) for j in range(names))
        + b"Content-Length: 1\r\n\r\nx"
        for i in range(count)
    ]


@pytest.mark.parametrize(
    "answers",
    [
        _many(1, 1, 1100),  # more shapes than any cache of them keeps
        _many(40, 40, 3),  # heads longer than a kept template may be
        [
            b"HTTP/1.1 200 OK\r\n" + b"X-A: %d\r\n" % i * 300 + b"Content-Length: 0\r\n\r\n"
            for i in range(3)
        ],
    ],
)
def test_answers_past_any_cache_bound_parse_as_812de76s(answers: list[bytes]) -> None:
    """A target whose answers differ in their reason or names each time, or whose heads are
    long: each read as 812de76 read it, the first and again."""
    for _ in range(2):
        new = FlatParsed(response=True, max_tail=65536)
        old = _OldParsed(response=True, max_tail=65536)
        for answer in answers:
            new.feed(answer)
            old.feed(answer)
            assert [_answer_view(e, False) for e in new.events] == [
                _answer_view(e, False) for e in old.events
            ]
            new.events.clear()
            old.events.clear()
