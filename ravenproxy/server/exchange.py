"""One client connection's HTTP/1.1 exchanges with their targets, sans-I/O (llhttp, through
``httptools``, parses both ends; the heads sent on are written here).

:class:`Exchange` is fed what happened — client bytes, target bytes, the route it asked for,
a target connection opened or lost — and answers with *actions* for the driver
(:mod:`ravenproxy.server.http_proxy`) to carry out: route a request, open or close the target
connection, write bytes to either side, read the rest of a request body alongside the
response, switch protocols (101), tunnel (CONNECT), refuse with a status, or close. It does no
I/O and knows no clock, so every rule below is tested with bytes alone.

The rules: one client connection carries any number of requests (keep-alive), each routed on
its own; the target connection is kept for the next request with the same :class:`UpstreamKey`.
Bodies stream both ways, never buffered whole. ``Expect: 100-continue`` is carried (the target's
``100`` goes back). ``Connection: Upgrade`` becomes a raw relay once the target answers ``101``;
``CONNECT node:port`` one at once. Hop-by-hop fields are dropped (RFC 9110 §7.6.1); a request
with both Content-Length and Transfer-Encoding is refused (RFC 9112 §6.1); a response with
Transfer-Encoding loses its Content-Length (§6.3); a response framed by the close of its
connection goes to an HTTP/1.1 client chunked; every forwarded request carries ``Via`` with
this process's token, and one that already does is a loop (508). A kept target connection that
turns out closed before answering an idempotent request is retried once on a new one
(RFC 9110 §9.2.2).

The parsers run ahead of the exchange (a pipelined request is parsed while the one before it is
answered): what they parse is queued as events (:class:`_Parsed`) and taken when the exchange
is ready for it. The client's bytes are read only when the exchange wants them, which bounds
that queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from httptools import (
    HttpParserError,
    HttpParserUpgrade,
    HttpRequestParser,
    HttpResponseParser,
)

from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    CloseUpstream,
    Count,
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
from ravenproxy.server.loops import via_received_by
from ravenproxy.server.podroutes import (
    Destination,
    find_destination,
    forwardable,
    wants_upgrade,
)
from ravenproxy.server.router import Route

Headers = list[tuple[str, str]]

IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

# Event kinds of :class:`_Parsed`.
_HEAD, _DATA, _END, _ERROR, _EOF = range(5)


@dataclass(frozen=True)
class UpstreamKey:
    """What a kept target connection must match to carry the next request."""

    session: int
    """``id()`` of the agent session that carries it; 0: dialled by the server itself."""
    host: str
    port: int
    tls: bool

    @classmethod
    def of(cls, route: Route) -> UpstreamKey:
        session = id(route.session) if route.session is not None else 0
        return cls(session, route.target.host, route.target.port, route.tls)


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed request or response head. ``start``: the method (request) or the reason phrase
    (response); ``target``: the request-target; ``status``: 0 for a request."""

    start: str
    target: str
    status: int
    version: str
    headers: Headers
    lower: dict[str, str]
    """The fields by lower-cased name (repeated ones joined with ", ")."""
    size: int
    """Bytes of the head on the wire."""


class _Stop(Exception):
    """Raised from a parser callback to end the parse (a response that has no body)."""


class _Parsed:
    """The callbacks of one llhttp parser, turning what it parses into queued events:
    ``(_HEAD, Head)``, ``(_DATA, bytes)``, ``(_END, trailers)``, ``(_ERROR, message)``,
    ``(_EOF, None)``."""

    __slots__ = (
        "_fields",
        "_last",
        "_start",
        "_trailers",
        "bodiless",
        "events",
        "fed",
        "in_body",
        "in_head",
        "parser",
    )

    def __init__(self, *, response: bool) -> None:
        self.events: deque[tuple[int, object]] = deque()
        self.parser: HttpRequestParser | HttpResponseParser = (
            HttpResponseParser(self) if response else HttpRequestParser(self)
        )
        if response:
            # RFC 9112 §6.3: a response with both framings is read by its Transfer-Encoding
            # (a request with both is refused).
            self.parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self.fed = 0
        """Bytes fed while no head was complete: what an unfinished head may have taken."""
        self.in_head = False
        self.in_body = False
        self.bodiless = False
        """The response to come has no body whatever its fields say (it answers a HEAD)."""
        self._start = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._trailers: list[tuple[bytes, bytes]] = []
        self._last: tuple[bytes, list[tuple[bytes, bytes]], object, str, Head] | None = None
        """The last head as parsed (start, fields, method or status, version) and its
        :class:`Head`: the same head again (a keep-alive client polling one URL, a target's
        same answer) is the same object, and what was derived from it can be reused."""

    def feed(self, data: bytes) -> bytes | None:
        """Parse ``data``; returns the bytes past an upgrade's (or CONNECT's) head, if one
        ended the HTTP part of the connection. An error is queued after what came before it."""
        if not self.in_body:
            self.fed += len(data)
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            return data[exc.args[0] :]
        except HttpParserError as exc:
            if not isinstance(exc.__context__, _Stop):
                self.events.append((_ERROR, str(exc) or type(exc).__name__))
        return None

    # -- llhttp's callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.in_head = True
        self._start = b""
        self._fields = []
        self._trailers = []

    def on_url(self, url: bytes) -> None:
        self._start += url

    def on_status(self, reason: bytes) -> None:
        self._start += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:
            self._fields.append((name, value))
        else:
            self._trailers.append((name, value))

    def on_headers_complete(self) -> None:
        self.in_head, self.in_body, self.fed = False, True, 0
        parser = self.parser
        version = parser.get_http_version()
        kind: object = (
            parser.get_status_code()
            if isinstance(parser, HttpResponseParser)
            else parser.get_method()
        )
        last = self._last
        if (
            last is not None
            and last[0] == self._start
            and last[2] == kind
            and last[3] == version
            and last[1] == self._fields
        ):
            head = last[4]
        else:
            head = self._head(version)
            self._last = (self._start, self._fields, kind, version, head)
        self.events.append((_HEAD, head))
        if self.bodiless and head.status >= 200:
            # llhttp cannot be told a response answers a HEAD: the parse ends here, and the
            # connection is not used again.
            self.in_body = False
            self.events.append((_END, []))
            raise _Stop

    def _head(self, version: str) -> Head:
        parser = self.parser
        headers: Headers = []
        lower: dict[str, str] = {}
        size = len(self._start) + 2
        for k, v in self._fields:
            size += len(k) + len(v) + 4
            name, value = k.decode("latin-1"), v.decode("latin-1")
            headers.append((name, value))
            key = name.lower()
            seen = lower.get(key)
            lower[key] = value if seen is None else f"{seen}, {value}"
        start = self._start.decode("latin-1")
        if isinstance(parser, HttpResponseParser):
            status = parser.get_status_code()
            return Head(start, "", status, version, headers, lower, size + 15)
        method = parser.get_method().decode("ascii", "replace")
        return Head(method, start, 0, version, headers, lower, size + len(method) + 12)

    def on_body(self, body: bytes) -> None:
        self.events.append((_DATA, body))

    def on_message_complete(self) -> None:
        self.in_body = False
        trailers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._trailers]
        self.events.append((_END, trailers))


def _header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _fields(headers: Headers) -> bytes:
    return "".join(f"{k}: {v}\r\n" for k, v in headers).encode("latin-1")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _last_chunk(trailers: Headers) -> bytes:
    return b"0\r\n" + _fields(trailers) + b"\r\n"


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


def _keeps_alive(head: Head) -> bool:
    """The sender keeps the connection open after this message (RFC 9112 §9.3)."""
    connection = head.lower.get("connection")
    tokens = _tokens(connection) if connection else ()
    if head.version == "1.1":
        return "close" not in tokens
    return head.version == "1.0" and "keep-alive" in tokens


class Exchange:
    """See the module docstring. ``phase``: ``head`` (waiting for a request head), ``routing``,
    ``opening``, ``forwarding`` (request sent, response being read), ``switching``,
    ``closed``."""

    def __init__(self, *, via: str, max_head: int) -> None:
        self.via = via
        self.max_head = max_head
        self.client = _Parsed(response=False)
        self.phase = "head"
        self.first = True
        """No request has begun on this connection yet."""
        self.route: Route | None = None
        self._request: Head | None = None
        self._dest: Destination | None = None
        self._client_raw: bytes | None = None
        """Bytes past an upgrade's or a CONNECT's head (not HTTP: never parsed)."""
        self._client_keep = True
        self._upgrade = False
        self._chunked_up = False
        """The request body goes to the target chunked."""
        self._outbound: list[bytes] | None = None
        """What went to the target: replayed on a retry (only kept when it is whole)."""
        self._up: _Parsed | None = None
        self._up_key: UpstreamKey | None = None
        self._up_used = False
        self._up_keep = False
        self._up_rest = b""
        self._reused = False
        self._switched: Head | None = None
        self._info = False
        """The head being forwarded is a 1xx (its end writes nothing)."""
        self._body_out = "length"
        """How the response body goes to the client: ``length`` (as it comes), ``chunked``
        (each piece a chunk), ``none``."""
        self._until_close = False
        """The response body ends when the target closes the connection."""
        self.body_done = False
        """The request body was forwarded whole (or there is none)."""
        self._body_error: Refuse | None = None
        self.started = False
        """Part of a response went to the client: a refusal can no longer be answered."""
        # What the last request and response heads led to, reused while the next ones are
        # the same objects (:attr:`_Parsed._last`) and what else it depends on is unchanged.
        self._seen: tuple[Head, bool, RouteRequest] | None = None
        self._built: tuple[Head, Route, bytes, bool, bool] | None = None
        self._answered: tuple[tuple[object, ...], bytes, str, bool, bool, bool] | None = None

    # -- the client side ----------------------------------------------------------------------
    @property
    def head_begun(self) -> bool:
        """Bytes of a next request head are buffered already."""
        return bool(self.client.events) or self.client.in_head

    def poll(self) -> list[Action]:
        """Act on client bytes already buffered (after a finished exchange)."""
        return self._client_events()

    def receive_client(self, data: bytes) -> list[Action]:
        """Bytes from the client; ``b""``: it closed its side."""
        if self.phase == "closed":
            return []
        if not data:
            self.client.events.append((_EOF, None))
        elif self._client_raw is not None:
            self._client_raw += data
        else:
            self._client_raw = self.client.feed(data)
        return self._client_events()

    def _client_events(self) -> list[Action]:
        if self.phase == "head":
            events = self.client.events
            if not events:
                if self.client.fed > self.max_head:
                    return self._refuse(431, "", f"request head larger than {self.max_head} bytes")
                return []
            kind, value = events.popleft()
            if kind == _HEAD:
                self.first = False
                assert isinstance(value, Head)
                return self._on_request(value)
            if kind == _ERROR:
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

    def _on_request(self, request: Head) -> list[Action]:
        seen = self._seen
        if seen is not None and seen[0] is request:  # as the last one: it went on
            self._client_keep = seen[1]
            self._request, self._dest = request, seen[2].dest
            self.phase = "routing"
            return [seen[2]]
        if request.size > self.max_head:
            return self._refuse(431, "", f"request head larger than {self.max_head} bytes")
        headers, lower = request.headers, request.lower
        host = lower.get("host")
        if (host is None and request.version == "1.1") or (host is not None and "," in host):
            return self._refuse(400, "", "bad request: an HTTP/1.1 request needs one Host field")
        self._client_keep = _keeps_alive(request)
        node = ""
        try:
            dest = find_destination(request.start, request.target, headers, lower)
        except BadRequest as exc:
            return self._refuse(exc.status, node, exc.reason)
        node = dest.host or (f"pod {dest.pod[0]}/{dest.pod[1]}" if dest.pod else "")
        via = lower.get("via")
        if via and self.via in via_received_by([via]):
            return [
                Looped(),
                *self._refuse(
                    508,
                    node,
                    "loop detected: the request already passed through this server "
                    f"(Via {self.via})",
                ),
            ]
        self._request, self._dest = request, dest
        if dest.via == "connect":
            self.phase = "closed"
            return [*self._drop_upstream(), Tunnel(dest, self._client_raw or b"")]
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
        self._build_outbound(self._request, self._dest, route)
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
        self._up = _Parsed(response=True)
        self._up_used = False
        return self._send()

    def _drop_upstream(self) -> list[Action]:
        if self._up is None:
            return []
        self._up = None
        self._up_key = None
        return [CloseUpstream()]

    def _build_outbound(self, request: Head, dest: Destination, route: Route) -> None:
        self.body_done = False
        self._body_error = None
        self.started = False
        built = self._built
        if built is not None and built[0] is request and built[1] is route:
            self._outbound = [built[2]]
            self._upgrade, self._chunked_up = built[3], built[4]
            return
        headers, lower = request.headers, request.lower
        upgrade = wants_upgrade(headers) if "connection" in lower else None
        self._upgrade = upgrade is not None
        out = forwardable(headers, upgrade=upgrade, names=lower)
        if dest.authority is not None:
            out = [(k, v) for k, v in out if k.lower() != "host"]
            out.insert(0, ("Host", dest.authority))
        elif "host" not in lower:
            out.insert(0, ("Host", f"{dest.host or route.node.name}:{route.target.port}"))
        self._chunked_up = "chunked" in lower.get("transfer-encoding", "").lower()
        if self._chunked_up:
            out.append(("Transfer-Encoding", "chunked"))
        # RFC 9110 §7.6.3; also how a request that comes back here is recognised.
        out.append(("Via", f"{request.version} {self.via}"))
        head = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
        head += _fields(out) + b"\r\n"
        self._outbound = [head]
        self._built = (request, route, head, self._upgrade, self._chunked_up)

    def _send(self) -> list[Action]:
        """The request (and the body bytes at hand) to the target connection."""
        assert self._up is not None and self._outbound is not None and self._request is not None
        self._reused = self._up_used
        self._up_used = True
        self._up.bodiless = self._request.start == "HEAD"
        self.phase = "forwarding"
        if self.body_done:  # a retry: the request went whole the first time
            return [WriteUpstream(b"".join(self._outbound))]
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
            if kind == _DATA:
                events.popleft()
                assert isinstance(value, bytes)
                piece = _chunk(value) if self._chunked_up else value
            elif kind == _END:
                events.popleft()
                assert isinstance(value, list)
                piece = _last_chunk(value) if self._chunked_up else b""
                self.body_done = True
            elif kind == _ERROR:
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
            up.events.append((_EOF, None))
        else:
            rest = up.feed(data)
            if rest is not None:
                self._up_rest = rest
        # Bytes for the client are gathered while events come without waiting (head, body,
        # end of a small response: one write) and flushed before the driver waits again.
        out: list[bytes] = []
        actions: list[Action] = []
        events = up.events
        while events:
            kind, value = events.popleft()
            if kind == _DATA:
                assert isinstance(value, bytes)
                out.append(_chunk(value) if self._body_out == "chunked" else value)
            elif kind == _HEAD:
                assert isinstance(value, Head)
                if value.size > self.max_head:
                    return self._flushed(out, actions, self._bad_response("head too large"))
                if value.status == 101:
                    if not self._upgrade:
                        failure = self._failed("101 without an upgrade request", status=502)
                        return self._flushed(out, actions, failure)
                    self.started = True
                    self.phase = "switching"
                    self._switched = value
                    return self._flushed(out, actions, [SwitchProtocols()])
                self.started = True
                if value.status < 200:
                    self._info = True
                    head = f"HTTP/1.1 {value.status} {value.start}\r\n".encode("latin-1")
                    out.append(head + _fields(value.headers) + b"\r\n")
                else:
                    actions.append(Count(value.status))
                    out.append(self._response_head(value, bodiless=up.bodiless))
            elif kind == _END:
                if self._info:
                    self._info = False
                    continue
                assert isinstance(value, list)
                if self._body_out == "chunked":
                    out.append(_last_chunk(value))
                return self._flushed(out, actions, self._finished())
            elif kind == _ERROR:
                return self._flushed(out, actions, self._bad_response(str(value)))
            elif self._until_close and self.started:  # _EOF ends a body framed by the close
                if self._body_out == "chunked":
                    out.append(_last_chunk([]))
                self._up_keep = False
                return self._flushed(out, actions, self._finished())
            else:
                what = "the connection was closed" if self.started else _CLOSED_UNANSWERED
                return self._flushed(out, actions, self._bad_response(what))
        if up.in_head and up.fed > self.max_head:
            return self._flushed(out, actions, self._bad_response("head too large"))
        return self._flushed(out, actions, [])

    @staticmethod
    def _flushed(out: list[bytes], actions: list[Action], then: list[Action]) -> list[Action]:
        if out:
            actions.append(WriteClient(b"".join(out)))
        return actions + then

    def _bad_response(self, what: str) -> list[Action]:
        return self._failed(f"bad response from the target: {what}", status=502)

    def _response_head(self, response: Head, *, bodiless: bool) -> bytes:
        """The head for the client, and how the body after it is framed."""
        key = (response, bodiless, self._request, self._client_keep, self._up is not None)
        answered = self._answered
        if answered is not None and answered[0] == key:
            _, head, self._body_out, self._until_close, self._up_keep, self._client_keep = answered
            return head
        head = self._new_response_head(response, bodiless=bodiless)
        self._answered = (
            key,
            head,
            self._body_out,
            self._until_close,
            self._up_keep,
            self._client_keep,
        )
        return head

    def _new_response_head(self, response: Head, *, bodiless: bool) -> bytes:
        headers, lower = response.headers, response.lower
        kept = forwardable(headers, names=lower)
        te = lower.get("transfer-encoding", "").lower()
        if te:
            # RFC 9112 §6.3: Transfer-Encoding wins, and a proxy drops the length.
            kept = [(k, v) for k, v in kept if k.lower() != "content-length"]
        self._up_keep = _keeps_alive(response) and self._up is not None and not bodiless
        self._until_close = False
        if bodiless or response.status in (204, 304):
            self._body_out = "none"
            if te.endswith("chunked"):
                kept.append(("Transfer-Encoding", "chunked"))
        elif te.endswith("chunked"):
            self._body_out = "chunked"
            kept.append(("Transfer-Encoding", "chunked"))
        elif te or "content-length" not in lower:
            self._until_close = True
            self._up_keep = False
            assert self._request is not None
            if self._request.version == "1.1":
                self._body_out = "chunked"
                kept.append(("Transfer-Encoding", "chunked"))
            else:
                self._body_out = "length"
                self._client_keep = False
        else:
            self._body_out = "length"
        if not self._client_keep:
            kept.append(("Connection", "close"))
        head = f"HTTP/1.1 {response.status} {response.start}\r\n".encode("latin-1")
        return head + _fields(kept) + b"\r\n"

    def upstream_lost(self) -> list[Action]:
        """Reading from, or writing to, the target connection failed."""
        if self.phase != "forwarding":
            return []
        return self._failed("the connection to the target was lost")

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
        assert self._up is not None and self.phase == "switching"
        self.phase = "closed"
        event = self._switched
        assert event is not None
        headers = event.headers
        kept = forwardable(headers, upgrade=_header(headers, "upgrade") or "websocket")
        head = f"HTTP/1.1 101 {event.start}\r\n".encode("latin-1") + _fields(kept) + b"\r\n"
        return head, self._client_raw or b"", self._up_rest

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
        actions = [] if self._up_keep else self._drop_upstream()
        if self._client_keep and self._client_raw is None:
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


_CLOSED_UNANSWERED = "the target closed the connection without answering"
