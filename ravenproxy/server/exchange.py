"""One client connection's HTTP/1.1 exchanges with their targets, sans-I/O (h11 at both ends).

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
Transfer-Encoding loses its Content-Length (§6.3); every forwarded request carries ``Via`` with
this process's token, and one that already does is a loop (508). A kept target connection that
turns out closed before answering an idempotent request is retried once on a new one
(RFC 9110 §9.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import h11

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
from ravenproxy.server.podroutes import Destination, find_destination, forwardable, wants_upgrade
from ravenproxy.server.router import Route

Headers = list[tuple[str, str]]

IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


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


def _decode(headers: h11._headers.Headers) -> Headers:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.raw_items()]


def _encode(headers: Headers) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def _header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def head_size(event: h11.Request | h11.Response | h11.InformationalResponse) -> int:
    """Bytes of the head on the wire, near enough (the start line is estimated)."""
    if isinstance(event, h11.Request):
        size = len(event.method) + len(event.target) + 12
    else:
        size = len(event.reason) + 15
    return size + sum(len(k) + len(v) + 4 for k, v in event.headers.raw_items()) + 2


class Exchange:
    """See the module docstring. ``phase``: ``head`` (waiting for a request head), ``routing``,
    ``opening``, ``forwarding`` (request sent, response being read), ``closed``."""

    def __init__(self, *, via: str, max_head: int) -> None:
        self.via = via
        self.max_head = max_head
        self.client = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        self.phase = "head"
        self.first = True
        """No request has begun on this connection yet."""
        self.route: Route | None = None
        self._request: h11.Request | None = None
        self._dest: Destination | None = None
        self._upgrade = False
        self._outbound: list[h11.Event] = []
        """What went to the target: replayed on a retry (only kept when it is whole)."""
        self._up: h11.Connection | None = None
        self._up_key: UpstreamKey | None = None
        self._up_used = False
        self._reused = False
        self._switched: h11.InformationalResponse | None = None
        self.body_done = False
        """The request body was forwarded whole (or there is none)."""
        self._body_error: Refuse | None = None
        self.started = False
        """Part of a response went to the client: a refusal can no longer be answered."""

    # -- the client side ----------------------------------------------------------------------
    @property
    def head_begun(self) -> bool:
        """Bytes of a next request head are buffered already."""
        return bool(self.client.trailing_data[0])

    def poll(self) -> list[Action]:
        """Act on client bytes already buffered (after a finished exchange)."""
        return self._client_events()

    def receive_client(self, data: bytes) -> list[Action]:
        """Bytes from the client; ``b""``: it closed its side."""
        if self.phase == "closed":
            return []
        self.client.receive_data(data)
        return self._client_events()

    def _client_events(self) -> list[Action]:
        if self.phase == "head":
            try:
                event = self.client.next_event()
            except h11.RemoteProtocolError as exc:
                return self._refuse(exc.error_status_hint, "", f"bad request: {exc}")
            if event is h11.NEED_DATA:
                return []
            if not isinstance(event, h11.Request):
                self.phase = "closed"
                return [Close("the client closed the connection")]
            self.first = False
            return self._on_request(event)
        if self.phase in ("forwarding", "switching") and not self.body_done:
            return self._body(first=False)
        return []  # bytes of a next request wait until this exchange is done

    def _on_request(self, request: h11.Request) -> list[Action]:
        if head_size(request) > self.max_head:
            # h11 bounds only heads that arrive in pieces; one that came whole is measured here.
            return self._refuse(431, "", f"request head larger than {self.max_head} bytes")
        method = request.method.decode("ascii", "replace")
        target = request.target.decode("latin-1")
        headers = _decode(request.headers)
        if _header(headers, "transfer-encoding") is not None and (
            _header(headers, "content-length") is not None
        ):
            # RFC 9112 §6.1: a proxy must not forward both (how requests are smuggled past one
            # parser into another); refusing, then closing, is the safe choice it allows.
            return self._refuse(400, "", "bad request: both Content-Length and Transfer-Encoding")
        node = ""
        try:
            dest = find_destination(method, target, headers)
        except BadRequest as exc:
            return self._refuse(exc.status, node, exc.reason)
        node = dest.host or (f"pod {dest.pod[0]}/{dest.pod[1]}" if dest.pod else "")
        via = [v for k, v in headers if k.lower() == "via"]
        if via and self.via in via_received_by(via):
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
            rest = bytes(self.client.trailing_data[0])
            return [*self._drop_upstream(), Tunnel(dest, rest)]
        self.phase = "routing"
        return [RouteRequest(dest)]

    # -- routing and the target connection ----------------------------------------------------
    def routed(self, route: Route) -> list[Action]:
        """The request's route: keep the target connection when it fits, else open one."""
        assert self.phase == "routing" and self._request is not None and self._dest is not None
        self.route = route
        self._build_outbound(self._request, self._dest, route)
        key = UpstreamKey.of(route)
        actions: list[Action] = []
        if self._up is not None and (key != self._up_key or not self._idle):
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
        self._up = h11.Connection(h11.CLIENT, max_incomplete_event_size=self.max_head)
        self._up_used = False
        return self._send()

    @property
    def _idle(self) -> bool:
        up = self._up
        return up is not None and up.our_state is h11.IDLE and up.their_state is h11.IDLE

    def _drop_upstream(self) -> list[Action]:
        if self._up is None:
            return []
        self._up = None
        self._up_key = None
        return [CloseUpstream()]

    def _build_outbound(self, request: h11.Request, dest: Destination, route: Route) -> None:
        headers = _decode(request.headers)
        upgrade = wants_upgrade(headers)
        self._upgrade = upgrade is not None
        out = forwardable(headers, upgrade=upgrade)
        if dest.authority is not None:
            out = [(k, v) for k, v in out if k.lower() != "host"]
            out.insert(0, ("Host", dest.authority))
        elif _header(out, "host") is None:
            out.insert(0, ("Host", f"{dest.host or route.node.name}:{route.target.port}"))
        if "chunked" in (_header(headers, "transfer-encoding") or "").lower():
            out.append(("Transfer-Encoding", "chunked"))
        # RFC 9110 §7.6.3; also how a request that comes back here is recognised.
        out.append(("Via", f"{request.http_version.decode('ascii')} {self.via}"))
        self._outbound = [
            h11.Request(
                method=request.method, target=dest.target.encode("latin-1"), headers=_encode(out)
            )
        ]
        self.body_done = False
        self._body_error = None
        self.started = False

    def _send(self) -> list[Action]:
        """The request (and the body bytes at hand) to the target connection."""
        assert self._up is not None
        self._reused = self._up_used
        self._up_used = True
        self.phase = "forwarding"
        if self.body_done:  # a retry: the request went whole the first time
            return [WriteUpstream(b"".join(self._up.send(e) or b"" for e in self._outbound))]
        data = self._up.send(self._outbound[0]) or b""
        actions = self._body(first=True, head=data)
        if not self.body_done and self.phase == "forwarding":
            self._outbound = []  # not whole: never retried
            actions.append(ReadBody())
        return actions

    def _body(self, *, first: bool, head: bytes = b"") -> list[Action]:
        """Forward the request-body events at hand. A malformed body (a bad chunk size, ...)
        is a 400: at once before the target saw a byte of it, else when the response fails
        (the target connection is closed to stop waiting for its answer)."""
        assert self._up is not None
        out = [head] if head else []
        while True:
            try:
                event = self.client.next_event()
            except h11.RemoteProtocolError as exc:
                assert self.route is not None
                refusal = Refuse(400, self.route.node.name, f"bad request body: {exc}")
                if first:
                    return [*self._drop_upstream(), *self._refuse_with(refusal)]
                self._body_error = refusal
                return self._drop_upstream()
            if event is h11.NEED_DATA:
                break
            if isinstance(event, h11.Data):
                out.append(self._up.send(h11.Data(data=event.data)) or b"")
                if self._outbound:
                    self._outbound.append(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                out.append(self._up.send(h11.EndOfMessage(headers=event.headers)) or b"")
                if self._outbound:
                    self._outbound.append(h11.EndOfMessage(headers=event.headers))
                self.body_done = True
                break
            elif first:  # PAUSED (an upgrade or CONNECT is waiting), or the client closed
                self.body_done = True
                break
            else:  # the client closed inside the body: the answer is read, the connection ends
                break
        data = b"".join(out)
        return [WriteUpstream(data)] if data else []

    # -- the target side ----------------------------------------------------------------------
    def receive_upstream(self, data: bytes) -> list[Action]:
        """Bytes from the target connection; ``b""``: it closed."""
        if self.phase != "forwarding" or self._up is None:
            return []
        up = self._up
        up.receive_data(data)
        # Bytes for the client are gathered while events come without waiting (head, body,
        # end of a small response: one write) and flushed before the driver waits again.
        out: list[bytes] = []
        actions: list[Action] = []

        def flush() -> None:
            if out:
                actions.append(WriteClient(b"".join(out)))
                out.clear()

        while True:
            try:
                event = up.next_event()
            except h11.RemoteProtocolError as exc:
                flush()
                return actions + self._failed(f"bad response from the target: {exc}")
            if event is h11.NEED_DATA:
                flush()
                return actions
            if isinstance(event, h11.ConnectionClosed):
                flush()
                return actions + self._failed("")
            if isinstance(event, h11.InformationalResponse):
                self.started = True
                if event.status_code == 101:
                    flush()
                    if not self._upgrade:
                        return [*actions, *self._close("101 without an upgrade request")]
                    self.phase = "switching"
                    self._switched = event
                    return [*actions, SwitchProtocols()]
                out.append(self.client.send(event) or b"")
            elif isinstance(event, h11.Response):
                if head_size(event) > self.max_head:
                    flush()
                    return actions + self._failed("response head too large", status=502)
                self.started = True
                actions.append(Count(event.status_code))
                headers = _decode(event.headers)
                kept = forwardable(headers)
                if _header(headers, "transfer-encoding") is not None:
                    # RFC 9112 §6.3: Transfer-Encoding wins, and a proxy drops the length.
                    kept = [(k, v) for k, v in kept if k.lower() != "content-length"]
                response = h11.Response(
                    status_code=event.status_code, headers=_encode(kept), reason=event.reason
                )
                out.append(self.client.send(response) or b"")
            elif isinstance(event, h11.Data):
                out.append(self.client.send(h11.Data(data=event.data)) or b"")
            elif isinstance(event, h11.EndOfMessage):
                out.append(self.client.send(h11.EndOfMessage(headers=event.headers)) or b"")
                flush()
                return actions + self._finished()
            else:  # PAUSED: the target switched protocols unasked
                flush()
                return [*actions, *self._close(f"unexpected event from the target: {event!r}")]

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
        up = self._up
        event = self._switched
        assert event is not None
        headers = _decode(event.headers)
        response = h11.InformationalResponse(
            status_code=101,
            headers=_encode(
                forwardable(headers, upgrade=_header(headers, "upgrade") or "websocket")
            ),
            reason=event.reason,
        )
        head = self.client.send(response) or b""
        return head, bytes(self.client.trailing_data[0]), bytes(up.trailing_data[0])

    def _failed(self, what: str, *, status: int | None = None) -> list[Action]:
        """The target connection failed before the response ended (``what`` "": it closed)."""
        assert self.route is not None
        node = self.route.node.name
        if self._body_error is not None and not self.started:
            return [*self._drop_upstream(), *self._refuse_with(self._body_error)]
        request = self._request
        if (
            self._reused
            and self._outbound
            and request is not None
            and request.method in IDEMPOTENT
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
        actions: list[Action] = []
        up = self._up
        if not self.body_done:
            # The target answered before the client finished its body: the rest of it would
            # be read as a new request.
            return [*self._drop_upstream(), *self._close("answered before the request body ended")]
        if up is not None and up.our_state is h11.DONE and up.their_state is h11.DONE:
            up.start_next_cycle()
        else:
            actions += self._drop_upstream()
        if self.client.our_state is h11.DONE and self.client.their_state is h11.DONE:
            self.client.start_next_cycle()
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
