"""HTTP/1.1 proxying for the fronts: the thin async driver of
:class:`~ravenproxy.server.exchange.Exchange`.

The exchange decides (what to route, what to write where, when to refuse); this module only
carries its actions out — it reads the client and the target, routes with the
:class:`~ravenproxy.server.router.Router`, opens target connections with the
:class:`~ravenproxy.server.connector.Connector`, relays after a 101 or a CONNECT — and keeps the
clocks: --header-timeout for request heads, :data:`KEEPALIVE_TIMEOUT` between requests,
--idle-timeout while a response is awaited. Once a connection is answered and kept alive over a
tunnel stream, its next requests are served by callbacks
(:class:`~ravenproxy.server.http_callbacks.CallbackPath`) until one needs the task again.

Every refusal answers with its status and a one-line body that names the node and the reason,
logs a line and counts ``ravenproxy_server_front_requests_total{front,status}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, NoReturn

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.metrics import Tallied
from ravenproxy.server.accept import unix_peer
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
from ravenproxy.server.front import FrontContext
from ravenproxy.server.http1 import error_response
from ravenproxy.server.http_callbacks import KEEPALIVE_TIMEOUT, CallbackPath
from ravenproxy.server.http_messages import ERROR, HEAD
from ravenproxy.server.limits import StreamLease
from ravenproxy.server.router import Route
from ravenproxy.transport.bytestream import READ_LIMIT, ByteStream
from ravenproxy.transport.front_splice import splice_or_relay
from ravenproxy.transport.linger import lingering_close
from ravenproxy.transport.relay import IdleTimeout, IdleWatch
from ravenproxy.transport.socket_stream import SocketReader, SocketWriter
from ravenproxy.transport.tunnel_stream import StreamClosedError

log = logging.getLogger(__name__)

_IO_ERRORS = (ConnectionError, StreamClosedError, OSError)

__all__ = ["KEEPALIVE_TIMEOUT", "HttpProxy"]

# How a connection that ends while its client may still be sending is closed (_Connection.linger):
_THROUGH = 1
"""Lingering until the request being sent is through (:meth:`_Connection._through`)."""
_QUIET = 2
"""Lingering until the client stops sending (or a bound of :func:`lingering_close`): what it
sends past the request has no end to wait for (pipelined requests, a CONNECT's tunnel bytes)."""


class HttpProxy:
    """Serves one front's client connections (the HTTP front, or terminated HTTPS)."""

    def __init__(
        self, ctx: FrontContext, front: str, *, over_tls: bool, egress: str | None = None
    ) -> None:
        self.ctx = ctx
        self.front = front
        self.over_tls = over_tls
        self.egress = egress
        """The egress listener's transport (uds, tcp): only CONNECT is served (405 for any
        other method, as konnectivity-server), and answers count in the egress metric too."""
        self.counters: dict[int, list[Tallied]] = {}
        """The series each status counts in, once it was counted (:meth:`count`)."""

    def count(self, status: int) -> None:
        counters = self.counters.get(status)
        if counters is None:
            metrics = self.ctx.metrics
            counters = [metrics.requests.labels(front=self.front, status=str(status))]
            if self.egress is not None:
                counters.append(
                    metrics.egress_requests.labels(transport=self.egress, status=str(status))
                )
            self.counters[status] = counters
        for counter in counters:
            counter.n += 1  # a Tallied: no call, no lock

    def serve(self, reader: SocketReader, writer: SocketWriter) -> Coroutine[Any, Any, None]:
        """Serve one client connection (await it). The connection's own coroutine, not one
        awaiting it: a relayed connection holds this frame as long as it lives."""
        return _Connection(self, reader, writer).run()


class _Done(Exception):
    """The client connection is finished (answered, relayed or closed)."""


@dataclass(frozen=True, slots=True)
class _RawRelay:
    """What a relay of raw bytes needs, once a CONNECT or an upgrade ended the exchange."""

    kind: str
    route: Route
    upstream: ByteStream
    lease: StreamLease
    initial_up: bytes = b""
    initial_down: bytes = b""


class _Raw(Exception):
    """The connection carries raw bytes from here: :meth:`_Connection.run` relays them in
    its own frame, so that an idle relay does not hold the frames (and their locals) of the
    request that led to it."""

    def __init__(self, relay: _RawRelay) -> None:
        super().__init__(relay.kind)
        self.relay = relay


class _Connection(CallbackPath):
    """One client connection: its exchange, and the target connection it holds."""

    # Slots: one of these lives as long as its connection, idle ones included.
    __slots__ = (
        "authenticated",
        "ctx",
        "ex",
        "keepalive",
        "lease",
        "linger",
        "peer",
        "proxy",
        "pump",
        "reader",
        "upstream",
        "watch",
        "writer",
    )

    def __init__(self, proxy: HttpProxy, reader: SocketReader, writer: SocketWriter) -> None:
        super().__init__()
        self.proxy = proxy
        self.ctx = proxy.ctx
        self.reader = reader
        self.writer = writer
        self.peer = writer.get_extra_info("peername") or unix_peer(writer.get_extra_info("socket"))
        # Authenticated: a client certificate verified against --front-client-ca-file (the
        # TLS context asks for one only then). Only such a client gets the server's kubelet
        # identity on re-originated TLS.
        self.authenticated = proxy.over_tls and bool(writer.get_extra_info("peercert"))
        self.ex = Exchange(via=self.ctx.limits.via, max_head=self.ctx.limits.max_header_size)
        self.upstream: ByteStream | None = None
        self.lease: StreamLease | None = None
        """The client's stream slot (--max-streams-per-client), held with the upstream."""
        self.pump: asyncio.Task[None] | None = None
        self.watch = IdleWatch(self.ctx.limits.idle_timeout)
        """Guards each wait for the target's answer (--idle-timeout); one per connection,
        entered once per read: entering stamps the activity of the last event."""
        self.keepalive: IdleWatch | None = None
        """Guards the wait for a next request (KEEPALIVE_TIMEOUT), from the second one on."""
        self.linger = 0
        """The connection ends while the client may still be sending (a refusal, an answer
        before the request body was through, pipelined requests): closed by
        :func:`lingering_close` — until the request is through (:data:`_THROUGH`), or the client
        stops (:data:`_QUIET`); 0: closed at once."""

    async def run(self) -> None:
        front = self.proxy.front
        drain = self.ctx.drain
        drain.follow(self)  # once: its waiting flag says when a drain may close it
        try:
            raw = await self._exchanges()
            drain.unfollow(self)  # raw bytes from here: it never waits for a request again
            # Raw bytes both ways until both sides are done (the relay closes both ends),
            # relayed from this frame: an idle relay holds no frame of the exchange. Nor its
            # parser state (~1.5 KB): the exchange is over, nothing reads it from here on.
            # Over a tunnel stream, spliced by callbacks (no task wake-up per chunk).
            del self.ex
            try:
                result = await splice_or_relay(
                    raw.upstream,
                    self.reader,
                    self.writer,
                    initial_up=raw.initial_up,
                    initial_down=raw.initial_down,
                    idle_timeout=self.ctx.limits.idle_timeout,
                )
            finally:
                raw.lease.release()
            node, port = raw.route.node.name, raw.route.target.port
            self.ctx.relay_done(
                self.proxy.front, raw.kind, result, peer=self.peer, node=node, port=port
            )
        except _Done:
            pass
        except _IO_ERRORS as exc:
            log.debug(f"{front} front: connection ended", extra=kv(peer=self.peer, error=exc))
        except Exception:
            log.exception(f"{front} front: connection failed", extra=kv(peer=self.peer))
        finally:
            try:
                await self._stop_pump()
                self._close_upstream()
                if self.linger and not drain.draining and not self.writer.is_closing():
                    self.waiting = True  # a drain that starts now closes it
                    through = self._through if self.linger == _THROUGH else None
                    dropped = await lingering_close(self.reader, self.writer, through=through)
                    log.debug(f"{front} front: closed", extra=kv(peer=self.peer, dropped=dropped))
            finally:  # also when cancelled in the waits above (at shutdown)
                self._close_upstream()
                drain.unfollow(self)
                if not self.writer.is_closing():
                    self.writer.close()

    async def _exchanges(self) -> _RawRelay:
        """Requests, until one turns the connection into raw bytes (returned: the relay runs
        after this frame is gone) or the connection ends (:class:`_Done`)."""
        try:
            while True:
                if self._callbacks_fit():
                    await self._act(await self._by_callbacks())
                else:
                    await self._request()
                await self._response()
        except _Raw as raw:
            return raw.relay

    # -- reading ------------------------------------------------------------------------------
    async def _request(self) -> None:
        """Read until the next request is routed and sent. The first head of a connection must
        arrive whole within --header-timeout of the accept; a later one may keep the
        connection idle up to KEEPALIVE_TIMEOUT, then must be whole within --header-timeout of
        its first byte."""
        if self.upstream is not None and self.ex.client.events:
            self._let_go_ended()  # a pipelined request, parsed already: no wait before it
        actions = self.ex.poll()
        if not actions and not self.ex.first and not self.ex.head_begun:
            if self.ctx.drain.draining:  # the server drains: no next request on this connection
                raise _Done
            self.waiting = True  # the drain closes it (Drain.start)
            self._hook_kept()
            self._kept_ended()
            if self.keepalive is None:
                self.keepalive = IdleWatch(KEEPALIVE_TIMEOUT)
            try:
                async with self.keepalive:
                    data = await self.reader.read(READ_LIMIT)
            except IdleTimeout:
                raise _Done from None
            finally:
                self.waiting = False
                self._unhook()
            actions = self.ex.receive_client(data)
        if not actions:
            timeout = self.ctx.limits.header_timeout
            try:
                async with asyncio.timeout(timeout) as head:
                    while not actions:
                        data = await self.reader.read(READ_LIMIT)
                        if self.upstream is not None:  # the head came in pieces, unhooked
                            self._let_go_ended()
                        actions = self.ex.receive_client(data)
            except TimeoutError:
                if not head.expired():
                    raise
                self.ctx.metrics.header_timeouts.labels(front=self.proxy.front, stage="head").inc()
                actions = self.ex.refused(408, "", f"request head not received within {timeout:g}s")
        await self._act(actions)

    async def _response(self) -> None:
        """Read the target's answer until the exchange is done with it."""
        # No byte either way for --idle-timeout ends the exchange (the body pump counts too).
        watch = self.watch
        while self.ex.phase == "forwarding":
            upstream = self.upstream
            if upstream is None:  # the body pump closed it (a malformed body)
                await self._act(self.ex.upstream_lost())
                continue
            try:
                async with watch:  # entering stamps the activity of the last event
                    data = await upstream.read()
            except IdleTimeout:
                assert self.ex.route is not None
                self._count_idle(self.peer)
                actions = self.ex.upstream_idle(watch.timeout or 0.0)
            except _IO_ERRORS:
                actions = self.ex.upstream_lost()
            else:
                actions = self.ex.receive_upstream(bytes(data))  # a view of a tunnel message
            await self._act(actions)
        if self.pump is not None:
            pump, self.pump = self.pump, None
            if not pump.done() or pump.exception() is not None:
                # The target answered before the client's body was through (or it failed):
                # the connection cannot carry another request.
                self.linger = _THROUGH if self.ex.client.midway else 0
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
                raise _Done

    async def _pump(self) -> None:
        """The rest of the request body, client → target, alongside the response."""
        while not self.ex.body_done and self.ex.phase in ("forwarding", "switching"):
            data = await self.reader.read(READ_LIMIT)
            self.watch.touch()
            for action in self.ex.receive_client(data):
                if isinstance(action, WriteUpstream):
                    if self.upstream is None:
                        return  # the exchange ended meanwhile
                    await self.upstream.write(action.data)
                elif isinstance(action, CloseUpstream):
                    self._close_upstream()  # a malformed body: stop waiting for the answer
            if not data:
                return

    # -- acting -------------------------------------------------------------------------------
    async def _act(self, actions: list[Action]) -> None:
        """Carry out the exchange's actions (and those they lead to) in order."""
        # A list, not a deque: this frame is held through a whole relay (a deque's first block
        # alone is ~600 bytes per connection).
        queue, done = list(actions), 0
        while done < len(queue):
            action = queue[done]
            done += 1
            if isinstance(action, WriteClient):
                if action.status:
                    self.proxy.count(action.status)
                self.writer.write(action.data)
                await self._drain_client()
            elif isinstance(action, WriteUpstream):
                assert self.upstream is not None
                try:
                    await self.upstream.write(action.data)
                except _IO_ERRORS:
                    queue.extend(self.ex.upstream_lost())
            elif isinstance(action, RouteRequest):
                if self.proxy.egress is not None:
                    queue.extend(self.ex.refused(405, "", "this listener serves only CONNECT"))
                    continue
                queue.extend(self._route_again(action))
            elif isinstance(action, OpenUpstream):
                queue.extend(await self._open(action))
            elif isinstance(action, CloseUpstream):
                if action.stray:
                    self._count_stray()
                self._close_upstream()
            elif isinstance(action, ReadBody):
                self.pump = asyncio.create_task(self._pump(), name="http-body-up")
            elif isinstance(action, Looped):
                self.ctx.metrics.loops.labels(kind="via").inc()
            elif isinstance(action, Refuse):
                await self._refuse(action.status, action.node, action.reason)
            elif isinstance(action, Close):
                # An answer before the body was through, more sent after this request.
                self.linger = self._lingers(tcp=False)
                log.debug(
                    f"{self.proxy.front} front: closing",
                    extra=kv(peer=self.peer, reason=action.reason),
                )
                raise _Done
            elif isinstance(action, SwitchProtocols):
                await self._switch()
            elif isinstance(action, Tunnel):
                await self._tunnel(action)

    async def _open(self, action: OpenUpstream) -> list[Action]:
        try:
            lease = self.ctx.stream_lease(self.proxy.front, self.peer)  # 429 past the cap
            try:
                upstream = await self.ctx.connector.connect(
                    action.route, authenticated=self.authenticated
                )
            except BaseException:
                lease.release()
                raise
        except RoutingError as exc:
            return self.ex.refused(exc.status, exc.node, exc.reason)
        self.upstream, self.lease = upstream, lease
        return self.ex.upstream_opened()

    def _close_upstream(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if self.lease is not None:
            self.lease.release()
            self.lease = None

    def _lingers(self, *, tcp: bool) -> int:
        """How the connection ends after its last answer (:attr:`linger`): lingering while the
        client may still be sending — pipelined requests after this one (or bytes past a
        CONNECT's or an upgrade's head, not parsed: an optimistic client's tunnel or protocol
        bytes) have no end to wait for; a request not through yet has. ``tcp``:
        else too on plain TCP, where the half-close tells the client at once (it may be
        sending what has not arrived yet: an optimistic CONNECT, pipelined requests); over TLS
        (no half-close) a client that reads to EOF would wait for the lingering to end."""
        client = self.ex.client
        if self.ex.client_raw or any(kind == HEAD or kind == ERROR for kind, _ in client.events):
            return _QUIET  # (an error: what came after a "Connection: close" request, say)
        if client.midway:
            return _THROUGH
        return _QUIET if tcp and self.writer.can_write_eof() else 0

    def _through(self, data: bytes) -> bool:
        """What a lingering close drops, parsed as the rest of the request: True once it is
        through (the client has no more to send; over TLS it is not waited for). A next request
        after it (pipelined) has no end to wait for: lingering goes on until the client stops."""
        if self.linger == _QUIET:
            return False
        client = self.ex.client
        client.feed(data)
        pipelined = any(kind == HEAD or kind == ERROR for kind, _ in client.events)
        client.events.clear()  # dropped (a body's chunks, its end, an error)
        if pipelined:
            self.linger = _QUIET
            return False
        return not client.midway

    async def _stop_pump(self) -> None:
        if self.pump is not None:
            self.pump.cancel()
            await asyncio.gather(self.pump, return_exceptions=True)
            self.pump = None

    async def _refuse(self, status: int, node: str, reason: str) -> NoReturn:
        await self._stop_pump()
        self._close_upstream()
        log.info(
            f"{self.proxy.front} front: refused",
            extra=kv(peer=self.peer, node=node, status=status, reason=reason),
        )
        self.proxy.count(status)
        body = f"{node}: {reason}" if node else reason
        with contextlib.suppress(*_IO_ERRORS):
            self.writer.write(error_response(status, body))
            # At most --idle-timeout for a client that takes nothing (as an answer's writes):
            # a bare drain held the task and its buffers for as long as the client lived. Not
            # an idle relay (counted by its status above: once; _drain_client says why).
            await self._drain_client(relayed=False)
            # The rest of the request, or more, may be on its way (a CONNECT's tunnel bytes,
            # say); not waited for from a client that was too slow to send a head (408).
            self.linger = 0 if status == 408 else self._lingers(tcp=True)
        raise _Done

    # -- raw relays ---------------------------------------------------------------------------
    async def _switch(self) -> NoReturn:
        """101: answer the client, then relay raw bytes both ways until both sides are done."""
        if self.pump is not None:
            pump, self.pump = self.pump, None
            await pump
        head, client_rest, target_rest = self.ex.switch()
        self.writer.write(head)
        self.proxy.count(101)  # made: counted, as a refusal is, whether the client takes it
        await self._drain_client()  # no longer than --idle-timeout without progress
        upstream, lease = self.upstream, self.lease
        assert upstream is not None and lease is not None and self.ex.route is not None
        self.upstream, self.lease = None, None  # the relay closes it, then gives the slot back
        raise _Raw(_RawRelay("upgrade", self.ex.route, upstream, lease, client_rest, target_rest))

    async def _tunnel(self, action: Tunnel) -> NoReturn:
        """CONNECT node:port: 200, then raw bytes both ways."""
        try:
            lease = self.ctx.stream_lease(self.proxy.front, self.peer)
        except RoutingError as exc:
            await self._refuse(exc.status, exc.node, exc.reason)
        try:
            r = self.ctx.router.route(action.dest.host, action.dest.port)
            stream = await self.ctx.connector.connect(r)
        except BaseException as exc:
            lease.release()
            if isinstance(exc, RoutingError):
                await self._refuse(exc.status, exc.node, exc.reason)
            raise
        self.proxy.count(200)
        self.writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        raise _Raw(_RawRelay("connect", r, stream, lease, initial_up=action.rest))
