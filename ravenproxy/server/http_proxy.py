"""HTTP/1.1 proxying for the fronts, on h11 (sans-I/O) at both ends: client ⇄ server ⇄ target.

One client connection carries any number of requests (keep-alive), each routed on its own, so
consecutive requests may go to different nodes; the connection to a target is kept for the next
request to the same one. Bodies stream both ways and are never buffered whole: each chunk of a
response (``kubectl logs -f``) is written and flushed as soon as it arrives. ``Expect:
100-continue`` is carried (the target's ``100`` goes back to the client). ``Connection: Upgrade``
(WebSocket, SPDY/3.1) becomes a raw bidirectional relay once the target answers ``101``, and
``CONNECT node:port`` one at once. Hop-by-hop fields are dropped as RFC 9110 §7.6.1 says.

Every refusal answers with its status and a one-line body that names the node and the reason,
logs a line and counts ``ravenproxy_server_front_requests_total{front,status}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import h11

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.server.http1 import BadRequest, error_response
from ravenproxy.server.limits import StreamLease
from ravenproxy.server.loops import via_received_by
from ravenproxy.server.podroutes import Destination, find_destination, forwardable, wants_upgrade
from ravenproxy.server.routing import Route, route
from ravenproxy.server.upstream import ByteStream, splice
from ravenproxy.transport.relay import IDLE_ERROR, READ_LIMIT, IdleTimeout, IdleWatch, RelayResult
from ravenproxy.transport.session import StreamClosedError

if TYPE_CHECKING:
    from ravenproxy.server.app import ProxyServer

log = logging.getLogger(__name__)

Headers = list[tuple[str, str]]
UpstreamKey = tuple[int, str, int, bool]

_IO_ERRORS = (ConnectionError, StreamClosedError, OSError)

IDEMPOTENT = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})

KEEPALIVE_TIMEOUT = 300.0
"""A kept-alive client connection with no byte of a next request for this long is closed (once
a head has begun, --header-timeout bounds it)."""


class _Closed(Exception):
    """The client connection is finished (after an error answer or a relay)."""


class _Stale(Exception):
    """A kept-alive target connection turned out to be closed before it answered."""


class _HeadTimeout(Exception):
    """A request head did not arrive whole within --header-timeout."""


class _KeepAliveIdle(Exception):
    """No next request began on a kept-alive connection within the keep-alive timeout."""


def _decode(headers: h11._headers.Headers) -> Headers:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers.raw_items()]


def _head_size(event: h11.Request | h11.Response) -> int:
    """Bytes of the head on the wire, near enough (the start line is estimated)."""
    if isinstance(event, h11.Request):
        size = len(event.method) + len(event.target) + 12
    else:
        size = len(event.reason) + 15
    return size + sum(len(k) + len(v) + 4 for k, v in event.headers.raw_items()) + 2


def _encode(headers: Headers) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def _header(headers: Headers, name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


class _Upstream:
    """One connection to a target, with the h11 client state of the requests sent on it."""

    def __init__(
        self, key: UpstreamKey, stream: ByteStream, max_head: int, lease: StreamLease
    ) -> None:
        self.key = key
        self.stream = stream
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head)
        self.used = False
        self.lease = lease
        """The client's stream slot (--max-streams-per-client), held while this is open."""

    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            await self.stream.write(data)

    async def next_event(
        self, before_read: Callable[[], Awaitable[None]] | None = None
    ) -> h11.Event | type[h11.PAUSED]:
        """The next event; ``before_read`` runs before waiting for bytes (to flush what was
        produced from the events so far: nothing is held while the target is silent)."""
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                if before_read is not None:
                    await before_read()
                self.conn.receive_data(await self.stream.read())
                continue
            return event  # type: ignore[return-value]

    @property
    def finished(self) -> bool:
        """The exchange on it ended cleanly both ways: it may carry another."""
        return self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE

    @property
    def idle(self) -> bool:
        """Ready for the next request."""
        return self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE

    def close(self) -> None:
        self.stream.close()
        self.lease.release()


class HttpProxy:
    """Serves one front's client connections (the HTTP front, or terminated HTTPS)."""

    def __init__(self, server: ProxyServer, front: str, *, over_tls: bool) -> None:
        self.server = server
        self.front = front
        self.over_tls = over_tls
        self._counters: dict[int, Any] = {}

    # -- accounting ---------------------------------------------------------------------------
    def _count(self, status: int) -> None:
        counter = self._counters.get(status)
        if counter is None:
            counter = self.server.metrics.requests.labels(front=self.front, status=str(status))
            self._counters[status] = counter
        counter.inc()

    async def _refuse(
        self, writer: asyncio.StreamWriter, status: int, node: str, reason: str, peer: object
    ) -> NoReturn:
        log.info(
            f"{self.front} front: refused",
            extra=kv(peer=peer, node=node, status=status, reason=reason),
        )
        self._count(status)
        body = f"{node}: {reason}" if node else reason
        with contextlib.suppress(*_IO_ERRORS):
            writer.write(error_response(status, body))
            await writer.drain()
        raise _Closed

    # -- connection loop ----------------------------------------------------------------------
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        max_head = self.server.settings.max_header_size
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_head)
        peer = writer.get_extra_info("peername")
        # Authenticated: a client certificate verified against --front-client-ca-file (the
        # TLS context asks for one only then). Only such a client gets the server's kubelet
        # identity on re-originated TLS.
        authenticated = self.over_tls and bool(writer.get_extra_info("peercert"))
        upstream: _Upstream | None = None
        first = True
        try:
            while True:
                try:
                    event = await self._next_request(conn, reader, first)
                except _KeepAliveIdle:
                    return
                except _HeadTimeout:
                    timeout = self.server.settings.header_timeout
                    self.server.metrics.header_timeouts.labels(front=self.front, stage="head").inc()
                    await self._refuse(
                        writer, 408, "", f"request head not received within {timeout:g}s", peer
                    )
                except h11.RemoteProtocolError as exc:
                    await self._refuse(
                        writer, exc.error_status_hint, "", f"bad request: {exc}", peer
                    )
                if not isinstance(event, h11.Request):
                    return  # ConnectionClosed (or PAUSED after a switch: not reached)
                first = False
                upstream = await self._exchange(
                    conn, reader, writer, event, upstream, peer, authenticated
                )
                if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                else:
                    return
        except _Closed:
            pass  # answered (or relayed) and done; closing the upstream again is harmless
        except _IO_ERRORS as exc:
            log.debug(f"{self.front} front: connection ended", extra=kv(peer=peer, error=exc))
        except h11.ProtocolError as exc:
            log.info(f"{self.front} front: HTTP error", extra=kv(peer=peer, error=exc))
        except Exception:
            log.exception(f"{self.front} front: connection failed", extra=kv(peer=peer))
        finally:
            if upstream is not None:
                upstream.close()
            if not writer.is_closing():
                writer.close()

    async def _next_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader, first: bool
    ) -> h11.Event | type[h11.PAUSED]:
        """The next request head. The first one of a connection must arrive whole within
        --header-timeout of the accept; a later one may keep the connection idle up to
        KEEPALIVE_TIMEOUT, then must be whole within --header-timeout of its first byte."""
        if not first:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            if not conn.trailing_data[0]:  # nothing of the next head buffered yet
                try:
                    async with asyncio.timeout(KEEPALIVE_TIMEOUT) as idle:
                        data = await reader.read(READ_LIMIT)
                except TimeoutError:
                    if idle.expired():
                        raise _KeepAliveIdle from None
                    raise
                conn.receive_data(data)
        try:
            async with asyncio.timeout(self.server.settings.header_timeout) as head:
                return await _next_event(conn, reader)
        except TimeoutError:
            if head.expired():
                raise _HeadTimeout from None
            raise

    async def _exchange(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        upstream: _Upstream | None,
        peer: object,
        authenticated: bool,
    ) -> _Upstream | None:
        """One request and its response; returns the target connection to keep, if any."""
        limit = self.server.settings.max_header_size
        if _head_size(request) > limit:
            # h11 bounds only heads that arrive in pieces; one that came whole is measured here.
            await self._refuse(writer, 431, "", f"request head larger than {limit} bytes", peer)
        method = request.method.decode("ascii", "replace")
        target = request.target.decode("latin-1")
        headers = _decode(request.headers)
        if _header(headers, "transfer-encoding") is not None and (
            _header(headers, "content-length") is not None
        ):
            # RFC 9112 §6.1: a proxy must not forward both (how requests are smuggled past
            # one parser into another); refusing, then closing, is the safe choice it allows.
            await self._refuse(
                writer, 400, "", "bad request: both Content-Length and Transfer-Encoding", peer
            )
        node_label = ""
        try:
            dest = find_destination(method, target, headers)
            node_label = dest.host or (f"pod {dest.pod[0]}/{dest.pod[1]}" if dest.pod else "")
            via = [v for k, v in headers if k.lower() == "via"]
            if via and self.server.via in via_received_by(via):
                self.server.metrics.loops.labels(kind="via").inc()
                raise RoutingError(
                    508,
                    node_label,
                    "loop detected: the request already passed through this server "
                    f"(Via {self.server.via})",
                )
            if dest.via == "connect":
                if upstream is not None:
                    upstream.close()
                await self._connect(conn, reader, writer, dest)
                raise _Closed
            r = self._route(dest)
            node_label = r.node.name
            tls_to = self.over_tls or dest.scheme == "https" or r.target.port == r.node.kubelet_port
            key: UpstreamKey = (
                id(r.session) if r.session is not None else 0,
                r.target.host,
                r.target.port,
                tls_to,
            )
            if upstream is not None and (upstream.key != key or not upstream.idle):
                upstream.close()
                upstream = None
            if upstream is None:
                upstream = await self._open(r, key, tls_to, peer, authenticated)
        except BadRequest as exc:
            if upstream is not None:
                upstream.close()
            await self._refuse(writer, exc.status, node_label, exc.reason, peer)
        except RoutingError as exc:
            if upstream is not None:
                upstream.close()
            await self._refuse(writer, exc.status, exc.node, exc.reason, peer)

        upgrade = wants_upgrade(headers)
        out = forwardable(headers, upgrade=upgrade)
        if dest.authority is not None:
            out = [(k, v) for k, v in out if k.lower() != "host"]
            out.insert(0, ("Host", dest.authority))
        elif _header(out, "host") is None:
            out.insert(0, ("Host", f"{dest.host or r.node.name}:{r.target.port}"))
        if "chunked" in (_header(headers, "transfer-encoding") or "").lower():
            out.append(("Transfer-Encoding", "chunked"))
        # RFC 9110 §7.6.3; also how a request that comes back here is recognised.
        out.append(("Via", f"{request.http_version.decode('ascii')} {self.server.via}"))
        outbound = h11.Request(
            method=method.encode("ascii"),
            target=dest.target.encode("latin-1"),
            headers=_encode(out),
        )

        for attempt in (1, 2):
            try:
                return await self._forward(
                    conn, reader, writer, outbound, upstream, r, upgrade is not None
                )
            except _Stale:
                upstream.close()
                if attempt == 2:
                    break
                try:
                    upstream = await self._open(
                        r, upstream.key, upstream.key[3], peer, authenticated
                    )
                except RoutingError as exc:
                    await self._refuse(writer, exc.status, exc.node, exc.reason, peer)
        await self._refuse(
            writer, 502, r.node.name, "the target closed the connection without answering", peer
        )
        return None

    def _route(self, dest: Destination) -> Route:
        model = self.server.store.model
        host = dest.host
        if dest.pod is not None:
            namespace, name = dest.pod
            pod = model.pod(namespace, name)
            if pod is None or not pod.node_name:
                raise RoutingError(404, f"pod {namespace}/{name}", "pod not found on any node")
            host = pod.node_name
        return route(
            model,
            self.server.registry,
            host,
            dest.port,
            local_node=self.server.settings.node_name,
        )

    async def _open(
        self, r: Route, key: UpstreamKey, tls_to: bool, peer: object, authenticated: bool
    ) -> _Upstream:
        lease = self.server.stream_lease(self.front, peer)  # 429 past the client's cap
        try:
            stream = await self.server.connect(r, tls_to=tls_to, authenticated=authenticated)
        except BaseException:
            lease.release()
            raise
        return _Upstream(key, stream, self.server.settings.max_header_size, lease)

    async def _connect(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        dest: Destination,
    ) -> None:
        peer = writer.get_extra_info("peername")
        try:
            lease = self.server.stream_lease(self.front, peer)
        except RoutingError as exc:
            await self._refuse(writer, exc.status, exc.node, exc.reason, peer)
        try:
            try:
                r = route(
                    self.server.store.model,
                    self.server.registry,
                    dest.host,
                    dest.port,
                    local_node=self.server.settings.node_name,
                )
                stream = await self.server.connect(r)
            except RoutingError as exc:
                await self._refuse(writer, exc.status, exc.node, exc.reason, peer)
            self._count(200)
            rest, _ = conn.trailing_data
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            result = await splice(
                stream,
                reader,
                writer,
                initial_up=bytes(rest),
                idle_timeout=self.server.settings.idle_timeout,
            )
        finally:
            lease.release()
        self.server.relay_done(
            self.front, "connect", result, peer=peer, node=r.node.name, port=r.target.port
        )

    async def _forward(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        outbound: h11.Request,
        upstream: _Upstream,
        r: Route,
        upgrade: bool,
    ) -> _Upstream | None:
        reused = upstream.used
        upstream.used = True
        try:
            await upstream.send(outbound)
        except _IO_ERRORS:
            if reused:
                raise _Stale from None
            raise
        # The request body: what is already buffered goes now; the rest is pumped alongside
        # the response (the client may wait for a 100 before sending it).
        pump: asyncio.Task[None] | None = None
        try:
            body_done = await self._pump_buffered(conn, upstream)
        except BadRequest as exc:
            upstream.close()
            await self._refuse(
                writer, exc.status, r.node.name, exc.reason, writer.get_extra_info("peername")
            )
        # A kept connection the target closed while idle fails before any answer; the request
        # is sent again on a new one only if that cannot repeat an effect (RFC 9110 §9.2.2).
        retry_ok = reused and body_done and outbound.method in IDEMPOTENT
        # No byte either way for --idle-timeout ends the exchange (the body pump counts too).
        watch = IdleWatch(self.server.settings.idle_timeout)
        if not body_done:
            pump = asyncio.create_task(
                self._pump(conn, reader, upstream, watch), name="http-body-up"
            )
        started = False
        # Bytes for the client are gathered while the target's events come without waiting
        # (head, body, end of a small response: one write) and flushed before any wait.
        out: list[bytes] = []

        async def flush() -> None:
            if out:
                writer.write(b"".join(out))
                out.clear()
                await writer.drain()

        def body_refused() -> RoutingError | None:
            """The client's body turned out malformed (the pump closed the target to stop
            waiting for its answer): the 400 to give instead of a 502, before any response."""
            if pump is None or not pump.done() or pump.cancelled() or started:
                return None
            exc = pump.exception()
            if isinstance(exc, BadRequest):
                return RoutingError(exc.status, r.node.name, exc.reason)
            return None

        try:
            while True:
                try:
                    async with watch:  # entering stamps the activity of the last event
                        event = await upstream.next_event(flush)
                except IdleTimeout:
                    peer = writer.get_extra_info("peername")
                    idle = RelayResult(error=IDLE_ERROR, idle=True)
                    self.server.relay_done(self.front, "request", idle, peer=peer, node=r.node.name)
                    if not started:
                        raise RoutingError(
                            504,
                            r.node.name,
                            f"no byte either way for {watch.timeout:g}s (--idle-timeout)",
                        ) from None
                    raise _Closed from None
                except h11.RemoteProtocolError as exc:
                    if (refused := body_refused()) is not None:
                        raise refused from None
                    if retry_ok and not started:
                        raise _Stale from None  # closed while idle: h11 calls that an error
                    if not started:
                        raise RoutingError(
                            502, r.node.name, f"bad response from the target: {exc}"
                        ) from None
                    raise ConnectionError(f"bad response from the target: {exc}") from None
                except _IO_ERRORS:
                    if (refused := body_refused()) is not None:
                        raise refused from None
                    if retry_ok and not started:
                        raise _Stale from None
                    if not started:
                        raise RoutingError(
                            502, r.node.name, "the connection to the target was lost"
                        ) from None
                    raise
                if isinstance(event, h11.ConnectionClosed):
                    if (refused := body_refused()) is not None:
                        raise refused
                    if retry_ok and not started:
                        raise _Stale
                    if not started:
                        raise RoutingError(
                            502, r.node.name, "the target closed the connection without answering"
                        )
                    raise ConnectionError("the target closed the connection mid-response")
                if isinstance(event, h11.InformationalResponse):
                    started = True
                    if event.status_code == 101:
                        if not upgrade:
                            raise ConnectionError("101 without an upgrade request")
                        await flush()
                        await self._switch(conn, reader, writer, upstream, event, r, pump)
                        raise _Closed
                    out.append(conn.send(event))
                elif isinstance(event, h11.Response):
                    if _head_size(event) > self.server.settings.max_header_size:
                        raise RoutingError(502, r.node.name, "response head too large")
                    started = True
                    self._count(event.status_code)
                    resp_headers = forwardable(_decode(event.headers))
                    if _header(_decode(event.headers), "transfer-encoding") is not None:
                        # RFC 9112 §6.3: Transfer-Encoding wins and a proxy drops the length.
                        resp_headers = [
                            (k, v) for k, v in resp_headers if k.lower() != "content-length"
                        ]
                    response = h11.Response(
                        status_code=event.status_code,
                        headers=_encode(resp_headers),
                        reason=event.reason,
                    )
                    out.append(conn.send(response))
                elif isinstance(event, h11.Data):
                    out.append(conn.send(h11.Data(data=event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    out.append(conn.send(h11.EndOfMessage(headers=event.headers)))
                    await flush()
                    break
                else:  # PAUSED: the target switched protocols unasked
                    raise ConnectionError(f"unexpected event from the target: {event!r}")
        except RoutingError as exc:
            if pump is not None:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
            upstream.close()
            peer = writer.get_extra_info("peername")
            await self._refuse(writer, exc.status, exc.node, exc.reason, peer)
        except BaseException:
            if pump is not None:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
            upstream.close()
            raise
        if pump is not None:
            if not pump.done():
                # The target answered before the client finished its body: the connection
                # cannot be reused (the rest of the body would be read as a new request).
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                upstream.close()
                raise _Closed
            pump.result()
        if upstream.finished:
            upstream.conn.start_next_cycle()
            return upstream
        upstream.close()
        return None

    async def _pump_buffered(self, conn: h11.Connection, upstream: _Upstream) -> bool:
        """Forward the body events h11 can give without reading; True once the body ended."""
        while True:
            event = _body_event(conn.next_event)
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return event is h11.PAUSED
            if isinstance(event, h11.Data):
                await upstream.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await upstream.send(h11.EndOfMessage(headers=event.headers))
                return True
            else:
                return True  # ConnectionClosed: the response may still be read

    async def _pump(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        upstream: _Upstream,
        watch: IdleWatch,
    ) -> None:
        while True:
            try:
                event = await _next_event(conn, reader)
            except h11.RemoteProtocolError as exc:
                upstream.close()  # the answer will not be forwarded: stop waiting for it
                raise BadRequest(400, f"bad request body: {exc}") from None
            watch.touch()
            if isinstance(event, h11.Data):
                await upstream.send(h11.Data(data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await upstream.send(h11.EndOfMessage(headers=event.headers))
                return
            else:
                raise ConnectionError("the client closed the connection inside the body")

    async def _switch(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream: _Upstream,
        event: h11.InformationalResponse,
        r: Route,
        pump: asyncio.Task[None] | None,
    ) -> None:
        """101: answer the client, then relay raw bytes both ways until both sides are done."""
        if pump is not None:
            await pump
        headers = _decode(event.headers)
        await _send(
            conn,
            writer,
            h11.InformationalResponse(
                status_code=101,
                headers=_encode(
                    forwardable(headers, upgrade=_header(headers, "upgrade") or "websocket")
                ),
                reason=event.reason,
            ),
        )
        self._count(101)
        client_rest, _ = conn.trailing_data
        target_rest, _ = upstream.conn.trailing_data
        result = await splice(
            upstream.stream,
            reader,
            writer,
            initial_up=bytes(client_rest),
            initial_down=bytes(target_rest),
            idle_timeout=self.server.settings.idle_timeout,
        )
        self.server.relay_done(
            self.front,
            "upgrade",
            result,
            peer=writer.get_extra_info("peername"),
            node=r.node.name,
            port=r.target.port,
        )


async def _next_event(
    conn: h11.Connection, reader: asyncio.StreamReader
) -> h11.Event | type[h11.PAUSED]:
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(READ_LIMIT))
            continue
        return event  # type: ignore[return-value]


async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, event: h11.Event) -> None:
    data = conn.send(event)
    if data:
        writer.write(data)
        await writer.drain()


def _body_event(
    next_event: Callable[[], h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]],
) -> object:
    """The next request-body event; a malformed body (a bad chunk size, ...) is a 400."""
    try:
        return next_event()
    except h11.RemoteProtocolError as exc:
        raise BadRequest(400, f"bad request body: {exc}") from None
