"""One client connection's HTTP/1.1 exchanges with their targets, sans-I/O (the messages are
parsed by :mod:`ravenproxy.server.http_messages`, the heads sent on written by
:mod:`ravenproxy.server.http_rewrite`).

:class:`Exchange` is fed what happened — client bytes, target bytes, the route it asked for,
a target connection opened or lost — and answers with *actions* for the driver
(:mod:`ravenproxy.server.http_proxy`) to carry out: route a request, open or close the target
connection, write bytes to either side, read the rest of a request body alongside the
response, switch protocols (101), tunnel (CONNECT), refuse with a status, or close. It does no
I/O and knows no clock, so every rule below is tested with bytes alone.

The rules: one client connection carries any number of requests (keep-alive), each routed on
its own; the target connection is kept for the next request with the same
:class:`~ravenproxy.server.router.UpstreamKey`, unless it sent bytes past its answer's end.
Bodies stream both ways, never buffered whole. ``Expect: 100-continue`` is carried (the target's
``100`` goes back). ``Connection: Upgrade`` becomes a raw relay once the target answers ``101``;
``CONNECT node:port`` one at once. Hop-by-hop fields are dropped (RFC 9110 §7.6.1); a request
with both Content-Length and Transfer-Encoding is refused (RFC 9112 §6.1); a response with
Transfer-Encoding loses its Content-Length (§6.3); a response framed by the close of its
connection goes to an HTTP/1.1 client chunked; every forwarded request carries ``Via`` with
this process's token, and one that already does is a loop (508). A kept target connection that
turns out closed before answering an idempotent request is retried once on a new one
(RFC 9110 §9.2.2).

The parsers run ahead of the exchange (:class:`~ravenproxy.server.http_messages.Parsed`); the
client's bytes are read only when the exchange wants them, which bounds their queue. This module
is the request's side; the answer's, and how an exchange ends, are its base's
(:mod:`ravenproxy.server.exchange_answer`).
"""

from __future__ import annotations

from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    Looped,
    OpenUpstream,
    ReadBody,
    Refuse,
    RouteRequest,
    Tunnel,
    WriteUpstream,
)
from ravenproxy.server.exchange_answer import AnswerSide
from ravenproxy.server.http1 import BadRequest
from ravenproxy.server.http_heads import Head, keeps_alive
from ravenproxy.server.http_messages import DATA, END, EOF, ERROR, HEAD, Parsed
from ravenproxy.server.http_rewrite import Framing, chunk, last_chunk, request_head
from ravenproxy.server.loops import via_received_by
from ravenproxy.server.podroutes import Destination, find_destination, same_node
from ravenproxy.server.router import Route, UpstreamKey

_new = object.__new__
"""A hot action made by this and its fields' stores, not by its class (a dataclass's
``__init__`` is a Python call: ~1 660 instructions against ~1 120; exchange_actions' note)."""


class Exchange(AnswerSide):
    """See the module docstring. ``phase``: ``head`` (waiting for a request head), ``routing``,
    ``opening``, ``forwarding`` (request sent, response being read), ``switching``,
    ``closed``."""

    def __init__(self, *, via: str, max_head: int) -> None:
        self.via = via
        self.max_head = max_head
        self.client = Parsed(response=False, max_tail=max_head)
        self.phase = "head"
        self.first = True
        """No request has begun on this connection yet."""
        self.route: Route | None = None
        self._request: Head | None = None
        self.client_raw: bytes | None = None
        """Bytes past an upgrade's or a CONNECT's head (not HTTP: never parsed)."""
        self._client_keep, self._upgrade = True, False
        self._chunked_up = False
        """The request body goes to the target chunked."""
        self._outbound: list[bytes] | None = None
        """What went to the target: replayed on a retry (only kept when it is whole)."""
        self._up: Parsed | None = None
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
        self._built: tuple[Head, Route, WriteUpstream, Destination, bytes, bool, bool] | None = None
        """The last head sent on (routed's): the request head and route it was made for, the
        action carrying it, the destination, the head past its request line, upgrade and
        chunking."""
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
        if seen is not None and self.phase == "head":
            last = seen[0]
            request = self.client.again(data, last)  # its head taken at once (END queued)
            if request is last:  # the last request again: it goes on as it went
                self._client_keep, self._request, self.phase = seen[1], last, "routing"
                return [seen[2]]
            if request is not None:  # but for its target: _on_request's case of the last
                # fields (see there)
                if request.size <= self.max_head and same_node(seen[2].dest, request.target):
                    return self._retarget(request, seen)
                return self._on_request(request)
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
            if self._up is None:  # the body went bad, its target dropped: the 400 comes then
                return []
            return self._body(first=False)
        return []  # bytes of a next request wait until this exchange is done

    poll = _client_events
    """Act on client bytes already buffered (after a finished exchange); the same method."""

    def _retarget(self, request: Head, seen: tuple[Head, bool, RouteRequest]) -> list[Action]:
        """The last request's route for ``request``, which differs only in a target naming the
        same node: the last destination (the router memo's) and action go on, retargeted."""
        dest = seen[2].dest
        dest.target, self._request = request.target, request
        self._client_keep, self.phase = seen[1], "routing"
        self._seen = (request, seen[1], seen[2])
        return [seen[2]]

    def _on_request(self, request: Head) -> list[Action]:
        seen = self._seen
        if seen is not None and seen[0] is request:  # as the last one: it went on
            self._client_keep = seen[1]
            self._request = request
            self.phase = "routing"
            return [seen[2]]
        if request.size > self.max_head:
            return self._refuse(431, "", f"request head larger than {self.max_head} bytes")
        routing = request.routing  # all it reads of the fields (Head.routing: Host, Via, ...)
        if seen is not None and routing is (last := seen[0]).routing:
            # The last request's fields (the parse shares their routing fields then: a
            # keep-alive client's next URL): what they decided stands (Host, keep-alive, Via);
            # only its target may name another node. When it names none: _retarget.
            same = request.start == last.start and request.version == last.version
            if same and same_node(seen[2].dest, request.target):
                return self._retarget(request, seen)
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
        self._request = request
        if dest.via == "connect":
            self.phase = "closed"
            return [*self._drop_upstream(), Tunnel(dest, self.client_raw or b"")]
        self.phase = "routing"
        action = RouteRequest(dest)
        self._seen = (request, self._client_keep, action)
        return [action]

    # -- routing and the target connection ----------------------------------------------------
    def routed(self, route: Route | None) -> list[Action]:
        """The request's route: keep the target connection when it fits, else open one. With
        it (or once the one opened is: ``None``, :meth:`upstream_opened`'s) the request and the
        body bytes at hand go to the target connection: one method, not a call to a sender
        (it runs per request)."""
        if route is not None:
            seen = self._seen  # the request's RouteRequest: its destination
            assert self.phase == "routing" and self._request is not None and seen is not None
            same = route is self.route and self._up is not None  # the driver reused the route
            self.route = route
            self.body_done, self._body_error, self.started = False, None, False
            # The head for the target, reused while the request head and the route are the same
            # objects (a keep-alive client polling one URL); inline: it runs per request.
            request, built = self._request, self._built
            if built is None or built[0] is not request or built[1] is not route:
                dest = seen[2].dest
                if (
                    built is not None
                    and built[1] is route
                    and built[3] is dest
                    and request.wire is (last := built[0]).wire
                    and request.version == last.version
                ):
                    # The last head's fields (the parse's same wire object: the same fields, so
                    # the same routing fields and decoded forms) and version, its destination and
                    # route the same objects (a keep-alive client's next URL: _retarget): the same
                    # fields, Via, upgrade and chunking past the request line — the request line
                    # as it came when the target goes on unchanged (not rewritten by the
                    # destination: no format, no encode).
                    line = request.line if dest.target is request.target else None
                    if line is None:
                        line = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
                    tail, upgrade, chunked = built[4], built[5], built[6]
                    data = line + tail
                else:
                    data, upgrade, chunked = request_head(request, dest, route, self.via)
                    tail = data[data.index(b"\r\n") + 2 :]  # (a target holds no CRLF)
                send = _new(WriteUpstream)  # made without its __init__ (a request that differs)
                send.data = data
                built = self._built = (request, route, send, dest, tail, upgrade, chunked)
            self._upgrade, self._chunked_up = built[5], built[6]
            self._outbound = [built[2].data]
            if not same:
                key = UpstreamKey.of(route)
                if self._up is None or key != self._up_key:
                    actions = self._drop_upstream()  # (none held: none)
                    self._up_key = key
                    self.phase = "opening"
                    return [*actions, OpenUpstream(route)]
        # The request (and the body bytes at hand) to the target connection.
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
            return [self._built[2]]
        actions = self._body(first=True, head=self._outbound[0])
        if not self.body_done and self.phase == "forwarding":
            self._outbound = None  # not whole: never retried
            actions.append(ReadBody())
        return actions

    def refused(self, status: int, node: str, reason: str) -> list[Action]:
        """Routing, or opening the target connection, failed with this status."""
        return self._refuse(status, node, reason)

    def upstream_opened(self) -> list[Action]:
        """The target connection :class:`OpenUpstream` asked for is open: the request goes."""
        assert self.phase == "opening"
        self._up = Parsed(response=True, max_tail=self.max_head)
        self._up_used = False
        return self.routed(None)

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
        if not data:
            return []
        send = _new(WriteUpstream)  # (a body's chunk: no __init__ called)
        send.data = data
        return [send]
