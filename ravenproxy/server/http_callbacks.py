"""The HTTP fronts' keep-alive request path served by callbacks (as uvicorn's httptools
protocol serves its requests): a small request and its answer wake no task of their own.

A client connection is read, routed and given its target connection by its task
(:mod:`ravenproxy.server.http_proxy`) for its first request. Once it is answered and the
connection waits for a next request over a tunnel stream (or none yet), the task parks and
:class:`CallbackPath` drives the connection by callbacks: the client's socket
(:meth:`~ravenproxy.transport.socket_stream.SocketStream.on_data`) and the target's tunnel
stream (:meth:`~ravenproxy.transport.tunnel_stream.TunnelStream.on_readable`) call back when
bytes arrive; they go into the same sans-I/O :class:`~ravenproxy.server.exchange.Exchange`,
whose actions are carried out at once as long as none has to wait — write to the client, write
to the stream as far as its credit and the session's output reach
(:meth:`~ravenproxy.transport.tunnel_stream.TunnelStream.try_write`), count, route again (the
router's memo is synchronous), close the stream.

The first action that has to wait — open a target connection, the rest of a write past the
credit, read a request body alongside the answer, refuse, close, switch protocols, tunnel — ends
the callback mode: the task wakes and carries it (and those after it) out as before. So do a
request head that arrives in pieces (--header-timeout is the task's to keep), a server drain, a
client gone, and a client that reads slower than the answer comes: the task waits on the
socket's drain and reads the rest of that answer itself (the stream keeps its credit meanwhile,
so the agent stops sending). Client bytes are taken from the socket only while the exchange
waits for a request head; past a bound buffered, the socket stops reading (TCP pushes back).
A next request's bytes that find the socket holding none, while the exchange waits for its head
with nothing of it at hand, go to the exchange as they come (the socket's ``take``); any others
are buffered and called back.

The clocks: one :class:`~ravenproxy.transport.idle.IdleWatch` with a timeout by turns —
:data:`KEEPALIVE_TIMEOUT` while waiting for a next request, --idle-timeout while the target's
answer is awaited (each chunk of it pushes that back): stamped at each turn, its timeout asked
by the exchange's phase only when its sweep looks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import cast

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    CloseUpstream,
    Looped,
    RouteRequest,
    WriteClient,
    WriteUpstream,
)
from ravenproxy.server.front import Front, FrontContext
from ravenproxy.server.kept_upstream import KeptUpstream, news
from ravenproxy.server.router import RouteMemo
from ravenproxy.transport.bytestream import (
    READ_LIMIT,
    ByteStream,
    TunnelByteStream,
)
from ravenproxy.transport.idle import drain_taken
from ravenproxy.transport.relay import IDLE_ERROR, IdleTimeout, IdleWatch, RelayResult
from ravenproxy.transport.socket_stream import SocketReader, SocketStream, SocketWriter
from ravenproxy.transport.tunnel_stream import StreamClosedError, TunnelStream

log = logging.getLogger(__name__)

KEEPALIVE_TIMEOUT = 300.0
"""A kept-alive client connection with no byte of a next request for this long is closed (once
a head has begun, --header-timeout bounds it). Checked as :class:`IdleWatch` checks: while other
connections are busy, up to an eighth of it later."""


class CallbackPath(KeptUpstream):
    """The callback mode of one client connection (a base of the connection, whose slots hold
    what it names below); :meth:`_by_callbacks` is the task's side of it."""

    __slots__ = (
        "_calls",
        "_exit",
        "_write",
        "routed",
        "waiting",
    )

    # The connection's own (see http_proxy._Connection).
    ex: Exchange
    ctx: FrontContext
    proxy: Front
    reader: SocketReader
    writer: SocketWriter
    upstream: ByteStream | None
    pump: asyncio.Task[None] | None
    watch: IdleWatch
    peer: object

    def __init__(self) -> None:
        self.routed: RouteMemo | None = None
        """The last request's route, reused for the next one when nothing it depends on
        changed."""
        self._exit: asyncio.Future[list[Action]] | None = None
        """Set while in callback mode: its result, what is left for the task to carry out."""
        self._hooked: TunnelStream | None = None
        """The target's tunnel stream, while it calls back."""
        self._hooked_direct: SocketStream | None = None
        """A direct route's kept connection (no agent), hooked between requests as
        :attr:`_hooked` is (:mod:`~ravenproxy.server.kept_upstream`)."""
        self._unread = True
        """The hooked stream may hold a chunk nobody read: one that came while no read followed
        its callback (between requests, from inside a callback, before the hook). False once a
        read found it empty, and while every chunk since was read as it came: a request that
        goes out then is not followed by a read (its answer calls back when it comes)."""
        self._calls: IdleWatch | None = None
        self._write: Callable[[bytes], object] | None = None
        """In callback mode, the client socket's transport's write (SocketStream.write's one
        line, without the Python call: once a request)."""
        self._busy = False
        self.waiting = False
        """Waiting for a next request, served by callbacks or by the task (closed if the server
        drains: :class:`~ravenproxy.server.front.Drain` follows the connection for its life
        and reads this)."""

    def _close_upstream(self) -> None:
        raise NotImplementedError

    def _callbacks_fit(self) -> bool:
        """Between requests, nothing of the next one at hand, a tunnel stream (or none) as the
        target connection: the next request can be served by callbacks."""
        ex, upstream = self.ex, self.upstream
        return (
            ex.phase == "head"
            and not ex.first
            and not ex.head_begun
            and self.pump is None
            and (upstream is None or type(upstream) is TunnelByteStream)
            and type(self.reader) is SocketStream
            and self.reader is self.writer
            and not self.ctx.drain.draining
        )

    async def _by_callbacks(self) -> list[Action]:
        """Serve requests by callbacks until an action has to wait (returned, with those after
        it, for the task to carry out) or the connection needs its task."""
        sock = self.reader
        assert isinstance(sock, SocketStream)
        watch = self._calls_watch()
        done: asyncio.Future[list[Action]] = asyncio.get_running_loop().create_future()
        self._exit = done
        self._write = sock.transport.write
        self._hook_kept()
        # _advance as a callback: called without a chunk, what it returns is not looked at.
        advance = cast("Callable[[], None]", self._advance)
        if self._hooked is not None:
            # In callback mode the stream calls _advance itself, as the socket does (not
            # _on_upstream, a call more per answer): _advance tells the kept stream's news
            # between requests from a request's end by ``waiting``. An answer's chunk that
            # finds the stream holding none is handed to it as it comes (``take``): not
            # queued in the stream for _advance to read back (a call and a queue's round
            # trip per answer).
            self._hooked.on_readable(advance, self._advance)
        # A next request's bytes that find the socket holding none are handed to _advance as
        # they come (``take``, the read its call back would make at once): not buffered,
        # called back and read back (a round a request). A partial, not a method calling
        # _advance: no Python frame between the socket and _advance.
        sock.on_data(advance, partial(self._advance, None))
        try:
            try:
                async with watch:
                    self._advance()  # what the socket holds already
                    self._kept_ended()
                    rest = await done
            except IdleTimeout as exc:
                if self.ex.phase != "forwarding":
                    return [Close(f"no next request for {exc.timeout:g}s")]
                assert self.ex.route is not None
                self._count_idle(sock.get_extra_info("peername"))
                return self.ex.upstream_idle(exc.timeout)
        finally:
            self._exit = self._write = None
            sock.on_data(None)
            self._unhook()
            self.waiting = False
        if sock.write_paused:
            # A slow client: the task goes on once it took the bytes. Mid-answer, as a rule;
            # between requests only once a drain has begun (it is why the callbacks left):
            # then the exchange is done and its answer not yet taken, which the drain lets the
            # client take (bounded by --drain-timeout), as it lets any exchange finish.
            await self._drain_client()
        return rest

    def _calls_watch(self) -> IdleWatch:
        """The callbacks' watch (made once a connection), in the sweep of the shorter of its
        turns' timeouts (the limits' as they are now)."""
        limits = self.ctx.limits
        watch = self._calls
        if watch is None:
            watch = self._calls = IdleWatch(KEEPALIVE_TIMEOUT, _turns(self.ex, self.ctx))
        watch.timeout = min(KEEPALIVE_TIMEOUT, limits.idle_timeout)
        return watch

    async def _drain_client(self, *, relayed: bool = True) -> None:
        """Wait until the client took what was written. Idle means no progress (HAProxy's
        ``timeout client``, Envoy's ``idle_timeout``): bytes the client took restart
        --idle-timeout (:func:`~ravenproxy.transport.idle.drain_taken`), so a
        client that reads steadily, however slowly, gets its answer whole; one that takes
        nothing for that long is idle as a silent target is and is aborted (its answer cannot
        end whole), as a relay's client is; the task path and the callbacks alike.

        ``relayed``: the bytes are the target's answer (or a 101's head): the request ends as
        an idle ``request`` relay (counted, logged). Not a refusal's: the server's own answer,
        counted by its status when made; its client is reset, logged at debug, routed or not
        (so a 504's idle, counted once, is not counted again)."""
        writer = self.writer
        if type(writer) is SocketStream and not writer.write_paused:
            await writer.drain()  # nothing to wait for (its loss raised): the watch not entered
            return
        try:
            async with self.watch:
                await drain_taken(writer, self.watch)
        except IdleTimeout as exc:
            if not relayed:
                why = "the client took none of its refusal"
                log.debug(f"{self.proxy.front} front: {why}", extra=kv(peer=self.peer))
            elif self.ex.route is not None:
                self._count_idle(self.peer)
            writer.transport.abort()
            raise ConnectionAbortedError(f"the client took nothing for {exc.timeout:g}s") from None

    def _count_idle(self, peer: object) -> None:
        """The routed request ended for --idle-timeout: counted and logged as an idle
        ``request`` relay (the task's wait for the answer, the callbacks', a client's drain)."""
        route = self.ex.route
        assert route is not None
        idle = RelayResult(error=IDLE_ERROR, idle=True)
        self.ctx.relay_done(self.proxy.front, "request", idle, peer=peer, node=route.node.name)

    def _route_again(self, action: RouteRequest) -> list[Action]:
        """A kept-alive connection's next request routed (the memo reused while the model and
        the agents did not change), and what the exchange does next; the task path and the
        callbacks alike."""
        try:
            self.routed = self.ctx.router.route_again(action.dest, self.proxy.over_tls, self.routed)
        except RoutingError as exc:
            return list(self.ex.refused(exc.status, exc.node, exc.reason))
        return self.ex.routed(self.routed.route)  # a new list: extended by the caller

    def _leave(self, rest: list[Action]) -> None:
        """Hand ``rest`` to the task; the watch stamped (what came last, an answer's chunk say,
        was not: :meth:`_advance`), so that it does not fire before the task leaves it."""
        done = self._exit
        if done is not None and not done.done():
            if self._calls is not None:
                self._calls.touch()
            done.set_result(rest)

    # -- callbacks ------------------------------------------------------------------------------
    def _on_upstream(self) -> None:
        phase = self.ex.phase
        if phase == "forwarding":
            self._advance()
        else:  # what came is read once a request went out
            self._unread = True
            if phase == "head":
                self._kept_news(self._hooked)

    def _advance(self, came: bytes | memoryview | None = None, took: bytes | None = None) -> bool:
        """Move the exchange on as far as it goes without waiting: the client socket's callback
        (and the stream's, above). Runs in a callback (the socket's, the session reader's):
        nothing may escape; what fails goes to the task. One function, not a guard calling the
        loop: it runs twice a request.

        ``came``: an answer's chunk as the stream got it (the stream's ``take``: it holds no
        other), taken as the forwarding step's read would have read it; returns whether it
        was (False: not forwarding, or the client cannot take it now: the stream holds it and
        calls back, which sees why).

        ``took``: the client's bytes as the socket got them, while it buffers none (its
        ``take``): taken as this call's read would take them if they were buffered, and only
        where that read is the first thing it does — the exchange waits for a next request's
        head, nothing of one parsed or begun, no drain, in callback mode, not from inside one,
        no more than a read takes. Whether they were (False: not touched, they are buffered and
        the call back does as before: a pipelined request during an answer, a head in pieces,
        a body, the drain's end of the connection)."""
        done = self._exit
        if (
            done is None
            or done.done()
            or self._busy
            or (came is not None and self.ex.phase != "forwarding")
            or (took is not None and (self.ex.phase != "head" or len(took) > READ_LIMIT))
        ):
            # Out of callback mode, or called back from inside (the loop below sees what
            # changed); a chunk between requests is the kept stream's news (read by the call
            # back that follows). The client's bytes: buffered, and called back.
            if took is None:
                self._unread = True
            return False
        self._busy = True
        ex, sock, watch = self.ex, self.reader, self._calls
        try:
            assert type(sock) is SocketStream and watch is not None
            client = ex.client
            while True:  # left by a return, or once an action left to the task (at the end)
                phase = ex.phase
                if phase == "head":
                    # Exchange.poll and .head_begun inlined for their common case, nothing of
                    # a next request parsed or begun (a call each, twice a request): poll
                    # would answer [] (or a 431 past the head bound), head_begun False.
                    if client.events or client.in_head or client.fed > ex.max_head:
                        if took is not None:  # not the first thing: buffered, called back
                            return False
                        if self.upstream is not None:  # a pipelined request (no wait before it)
                            self._let_go_ended()
                        actions = ex.poll()
                        if not actions:
                            if ex.head_begun:  # a head in pieces: the task reads it (its clock)
                                self._leave([])
                                return True
                    else:
                        actions = []
                    if not actions:
                        if self.ctx.drain.draining:  # no next request on this connection
                            if took is not None:  # buffered for the task, called back
                                return False
                            self._leave([])
                            return True
                        # Nothing came since a read took all (an answer's end, as a rule):
                        # no read that would find nothing.
                        if took is not None:  # the socket's take: this read's bytes
                            data: bytes | None = took
                            took = None
                        elif sock.pending:
                            data = sock.read_nowait(READ_LIMIT)
                        else:
                            data = None
                        if data is None:
                            if self.waiting:
                                # The kept stream called between requests (the socket's calls
                                # bring bytes, its end or loss): _on_upstream's rule, busy
                                # already (_kept_news's); the keep-alive clock goes on.
                                self._unread = True
                                hooked = self._hooked
                                if hooked is not None and (got := news(hooked.read_nowait)):
                                    self._let_go(got)
                                return True
                            self.waiting = True  # the drain closes it (Drain.start)
                            # The keep-alive turn (_turns) from now: touch() written out (a
                            # call a request; IdleWatch.clock is the loop's time).
                            watch.last = watch.clock()
                            return True
                        if not self.waiting and self.upstream is not None:
                            # The bytes were there when the last answer ended (pipelined): no
                            # hook looked for the kept stream's end since.
                            self._let_go_ended()
                        self.waiting = False
                        actions = ex.receive_client(data)
                        if not actions:
                            continue  # nothing was carried out: still ours
                    self._run(actions)
                    if ex.phase == "forwarding":
                        watch.last = watch.clock()  # the answer's turn (_turns) from now
                        if not self._unread:  # no read that would find nothing (once a request)
                            return True
                elif phase == "forwarding":
                    stream = self._hooked
                    if stream is None or sock.write_paused or sock.transport.is_closing():
                        if came is not None:  # not taken: held, and the call back leaves
                            self._unread = True
                            return False
                        self._leave([])  # the task waits for the client, or sees it gone
                        return True
                    chunk, came = came, None
                    taken = chunk is not None
                    if taken:  # the stream holds no other (its take's rule)
                        self._unread = False
                    try:
                        if chunk is None:
                            chunk = stream.read_nowait()
                    except StreamClosedError:
                        actions = ex.upstream_lost()
                    else:
                        if chunk is None:
                            self._unread = False
                            return True
                        # A view of a tunnel message as bytes (a small one is bytes already).
                        if type(chunk) is not bytes:
                            chunk = bytes(chunk)
                        actions = ex.receive_upstream(chunk)
                    self._run(actions)
                    # A chunk came: the watch is stamped before this callback returns (no timer
                    # fires before), whichever way it does — here while the answer goes on; by
                    # the stamp that waits for the next request or sends it; by _leave (the
                    # task's, a pipelined request's included: it must not find the connection
                    # idle). Not twice a request: an answer's end is stamped by that stamp.
                    if ex.phase == "forwarding":
                        watch.touch()
                        if taken and not self._unread:
                            # None came since (one from inside would have marked it): no
                            # read that would find nothing (a chunk of a long answer).
                            return True
                else:
                    self._leave([])
                    return True
                if done.done():  # an action was left to the task (not before: checked above)
                    return True
        except Exception as exc:
            if not done.done():
                if watch is not None:
                    watch.touch()
                done.set_exception(exc)
        finally:
            self._busy = False
        return True

    def _run(self, actions: list[Action]) -> None:
        """Carry out the actions that need no waiting, in order; from the first that does,
        leave them to the task."""
        # A list's iterator takes what is appended while it runs (a route's actions). Counted
        # by hand, not by enumerate (an object made per call, twice a request).
        done = -1
        for action in actions:
            done += 1
            # By exact type (no action class is subclassed): a comparison each, not a call.
            if type(action) is WriteClient:
                if action.status:  # an answer's head: counted
                    self.proxy.count(action.status)
                write = self._write
                if write is not None:
                    write(action.data)
                else:  # between requests, in the task's time (a kept connection's end)
                    self.writer.write(action.data)
            elif type(action) is WriteUpstream:
                stream, data = self._hooked, action.data
                sent = stream.try_write(data) if stream is not None else 0
                if sent < len(data):
                    rest = WriteUpstream(data[sent:]) if sent else action
                    return self._leave([rest, *actions[done + 1 :]])
            elif type(action) is RouteRequest and self.proxy.egress is None:
                actions.extend(self._route_again(action))
            elif type(action) is CloseUpstream:
                if action.stray:
                    self._count_stray()
                self._unhook()
                self._close_upstream()
            elif type(action) is Looped:
                self.ctx.metrics.loops.labels(kind="via").inc()
            else:
                return self._leave(actions[done:])
        return None


def _turns(ex: Exchange, ctx: FrontContext) -> Callable[[], float]:
    """The callbacks' watch's timeout by turns: --idle-timeout while the target's answer is
    awaited, :data:`KEEPALIVE_TIMEOUT` otherwise (a next request). A closure, not a method of
    the connection: the connection holds the watch, which would hold it back (a cycle)."""

    def timeout() -> float:
        return ctx.limits.idle_timeout if ex.phase == "forwarding" else KEEPALIVE_TIMEOUT

    return timeout
