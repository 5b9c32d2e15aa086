"""Review of branch anspath (issue 15): the callback path's answer side against e115ebc's,
differentially.

anspath hands an answer's chunk to :meth:`CallbackPath._advance` as the tunnel stream gets it
(the stream's ``take``), not queued for ``_advance`` to read back, and skips the read that
would find nothing after a taken chunk; and its watch no longer retimes twice a request: it
is stamped at each turn and asks its timeout (``_turns``: --idle-timeout while forwarding,
:data:`KEEPALIVE_TIMEOUT` else) when its sweep looks and at its expiry.

e115ebc's ``CallbackPath`` is kept below VERBATIM (only renamed ``_OldCallbackPath``; its
module's imports, none of whose targets anspath changed but relay's re-export of IdleWatch,
which keeps ``retime``). Two like connections — each entered into callback mode by its own
``_by_callbacks`` (the hooks it sets: the branch's with ``take``), a real
:class:`SocketStream` for the client and a stand-in tunnel stream that offers chunks as
:meth:`TunnelStream._feed` does (to ``take`` first while it holds none, else held and called
back) — are fed the same generated events: the target's answers (Content-Length, chunked with
trailers, 204, 304, 1xx before the final answer, a HEAD's, until-close, ``Connection: close``,
101, bytes past the answer's end), cut anywhere, its end or its reset; the client's requests
(kept on the stream, pipelined two at once, sent elsewhere, ``close``, a HEAD, a POST with a
body, a head in pieces, garbage) and a client that stops reading (``pause_writing``) or goes
away. After each event both wrote the same bytes to the client and the target, counted the
same statuses, credited the same bytes, hold the same chunks, let the stream go alike, wait
alike, have stamped their clocks alike with the same timeout in force, and left the task the
same actions (or the same failure). And the clocks themselves, in real time with short
timeouts: the keep-alive turn, the answer's, either the longer, fire when and as e115ebc's.
Nothing is imported from a baseline checkout.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as tally
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from ravenproxy.errors import RoutingError
from ravenproxy.metrics import ServerMetrics
from ravenproxy.server import http_callbacks
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    CloseUpstream,
    Looped,
    OpenUpstream,
    RouteRequest,
    WriteClient,
    WriteUpstream,
)
from ravenproxy.server.front import Front, FrontContext
from ravenproxy.server.http_callbacks import CallbackPath
from ravenproxy.server.kept_upstream import KeptUpstream, news
from ravenproxy.server.router import RouteMemo
from ravenproxy.transport.bytestream import (
    READ_LIMIT,
    ByteStream,
    TunnelByteStream,
)
from ravenproxy.transport.relay import IDLE_ERROR, IdleTimeout, IdleWatch, RelayResult
from ravenproxy.transport.socket_stream import SocketReader, SocketStream, SocketWriter
from ravenproxy.transport.tunnel_stream import StreamClosedError, TunnelStream
from ravenproxy.wire.codes import ErrorCode
from tests.helpers import examples

from .test_exchange import VIA, route

# -- e115ebc's http_callbacks from KEEPALIVE_TIMEOUT on, verbatim (CallbackPath renamed) ---------

KEEPALIVE_TIMEOUT = 300.0
"""A kept-alive client connection with no byte of a next request for this long is closed (once
a head has begun, --header-timeout bounds it). Checked as :class:`IdleWatch` checks: while other
connections are busy, up to an eighth of it later."""


class _OldCallbackPath(KeptUpstream):
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
        watch = self._calls
        if watch is None:
            watch = self._calls = IdleWatch(KEEPALIVE_TIMEOUT)
        done: asyncio.Future[list[Action]] = asyncio.get_running_loop().create_future()
        self._exit = done
        self._write = sock.transport.write
        self._hook_kept()
        if self._hooked is not None:
            # In callback mode the stream calls _advance itself, as the socket does (not
            # _on_upstream, a call more per answer): _advance tells the kept stream's news
            # between requests from a request's end by ``waiting``.
            self._hooked.on_readable(self._advance)
        sock.on_data(self._advance)
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

    async def _drain_client(self) -> None:
        """Wait until the client took what was written, for at most --idle-timeout: a client
        that takes nothing for that long (its answer held back, the target waiting for credit)
        is idle as a silent target is — no byte moves either way — and is aborted (its answer
        cannot end whole), as a relay's client is; the task path and the callbacks alike."""
        writer = self.writer
        if type(writer) is SocketStream and not writer.write_paused:
            await writer.drain()  # nothing to wait for (its loss raised): the watch not entered
            return
        try:
            async with self.watch:
                await writer.drain()
        except IdleTimeout as exc:
            if self.ex.route is not None:
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

    def _advance(self) -> None:
        """Move the exchange on as far as it goes without waiting: the client socket's callback
        (and the stream's, above). Runs in a callback (the socket's, the session reader's):
        nothing may escape; what fails goes to the task. One function, not a guard calling the
        loop: it runs twice a request."""
        done = self._exit
        if done is None or done.done() or self._busy:
            # Out of callback mode, or called back from inside (the loop below sees what
            # changed).
            self._unread = True
            return
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
                        if self.upstream is not None:  # a pipelined request (no wait before it)
                            self._let_go_ended()
                        actions = ex.poll()
                        if not actions:
                            if ex.head_begun:  # a head in pieces: the task reads it (its clock)
                                return self._leave([])
                    else:
                        actions = []
                    if not actions:
                        if self.ctx.drain.draining:  # no next request on this connection
                            return self._leave([])
                        data = sock.read_nowait(READ_LIMIT)
                        if data is None:
                            if self.waiting:
                                # The kept stream called between requests (the socket's calls
                                # bring bytes, its end or loss): _on_upstream's rule, busy
                                # already (_kept_news's); the keep-alive clock goes on.
                                self._unread = True
                                hooked = self._hooked
                                if hooked is not None and (got := news(hooked.read_nowait)):
                                    self._let_go(got)
                                return None
                            self.waiting = True  # the drain closes it (Drain.start)
                            watch.retime(KEEPALIVE_TIMEOUT)
                            return None
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
                        watch.retime(self.ctx.limits.idle_timeout)
                        if not self._unread:  # no read that would find nothing (once a request)
                            return None
                elif phase == "forwarding":
                    stream = self._hooked
                    if stream is None or sock.write_paused or sock.transport.is_closing():
                        return self._leave([])  # the task waits for the client, or sees it gone
                    try:
                        chunk = stream.read_nowait()
                    except StreamClosedError:
                        actions = ex.upstream_lost()
                    else:
                        if chunk is None:
                            self._unread = False
                            return None
                        # A view of a tunnel message as bytes (a small one is bytes already).
                        if type(chunk) is not bytes:
                            chunk = bytes(chunk)
                        actions = ex.receive_upstream(chunk)
                    self._run(actions)
                    # A chunk came: the watch is stamped before this callback returns (no timer
                    # fires before), whichever way it does — here while the answer goes on; by
                    # the retime that waits for the next request or sends it; by _leave (the
                    # task's, a pipelined request's included: it must not find the connection
                    # idle). Not twice a request: an answer's end is stamped by the retime.
                    if ex.phase == "forwarding":
                        watch.touch()
                else:
                    return self._leave([])
                if done.done():  # an action was left to the task (not before: checked above)
                    return None
        except Exception as exc:
            if not done.done():
                if watch is not None:
                    watch.touch()
                done.set_exception(exc)
        finally:
            self._busy = False
        return None

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
                status = action.status
                if status:  # an answer's head: counted (HttpProxy.count's common case inline)
                    counters = self.proxy.counters.get(status)
                    if counters is None:
                        self.proxy.count(status)
                    else:
                        for counter in counters:
                            counter.n += 1
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
                # _route_again inline (a call a request).
                try:
                    self.routed = memo = self.ctx.router.route_again(
                        action.dest, self.proxy.over_tls, self.routed
                    )
                except RoutingError as exc:
                    actions.extend(self.ex.refused(exc.status, exc.node, exc.reason))
                else:
                    actions.extend(self.ex.routed(memo.route))
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


# -- two like connections, driven alike -----------------------------------------------------------

IDLE = 60.0
_EDGE1 = route("edge-1")
_ROUTES = {"edge-1": _EDGE1, "edge-2": route("edge-2", ip="10.1.0.2")}


class _Transport:
    """The client socket's transport: what it was written; closing once the client left."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def get_write_buffer_size(self) -> int:
        return 0  # (a slow client's drain looks whether it took bytes)


def _tally(what: str) -> None:
    if currently_in_test_context():  # (the clocks' tests are not hypothesis's)
        tally(what)


class _TStream:
    """A tunnel stream as the callbacks see it: chunks offered as :meth:`TunnelStream._feed`
    offers them (to ``take`` first while none is held, credited then; else held and the
    callback called), read back by ``read_nowait`` (credited), its end and its reset called
    back, writes taken up to a credit (None: all)."""

    def __init__(self) -> None:
        self._chunks: collections.deque[bytes | memoryview] = collections.deque()
        self._eof = False
        self._error: StreamClosedError | None = None
        self._on_readable: Callable[[], None] | None = None
        self._on_chunk: Callable[[bytes | memoryview], bool] | None = None
        self.bytes_in = 0
        self.sent: list[bytes] = []
        self.credit: int | None = None
        self.closed = False
        self.inside: list[bytes] = []
        """Chunks that arrive while the next write is made (from inside the callback that
        writes: a tunnel whose write lets its reader run, say)."""

    @property
    def ended(self) -> bool:
        return self._eof or self._error is not None

    def on_readable(
        self,
        callback: Callable[[], None] | None,
        take: Callable[[bytes | memoryview], bool] | None = None,
    ) -> None:
        self._on_readable = callback
        self._on_chunk = take

    def feed(self, data: bytes | memoryview) -> None:
        if self.closed:  # forgotten by its session
            return
        take = self._on_chunk
        if take is not None and not self._chunks:
            if take(data):
                _tally("a chunk taken")
                self.bytes_in += len(data)
                return
            _tally("a chunk offered, not taken")
        self._chunks.append(data)
        if self._on_readable is not None:
            self._on_readable()

    def feed_eof(self) -> None:
        if not self.closed:
            self._eof = True
            if self._on_readable is not None:
                self._on_readable()

    def fail(self) -> None:
        if not self.closed:
            if self._error is None:
                self._error = StreamClosedError(ErrorCode.CANCEL, "reset")
            self._chunks.clear()
            if self._on_readable is not None:
                self._on_readable()

    def read_nowait(self) -> bytes | memoryview | None:
        if not self._chunks:
            if self._error is not None:
                raise self._error.fresh()
            return b"" if self._eof else None
        chunk = self._chunks.popleft()
        self.bytes_in += len(chunk)
        return chunk

    def try_write(self, data: bytes | memoryview) -> int:
        if self._error is not None:
            return 0
        n = len(data) if self.credit is None else min(self.credit, len(data))
        if self.credit is not None:
            self.credit -= n
        self.sent.append(bytes(data[:n]))
        inside, self.inside = self.inside, []
        for chunk in inside:
            self.feed(chunk)
        return n

    def close(self) -> None:
        self.closed = True
        self._on_readable = self._on_chunk = None


class _Router:
    def route_again(self, dest: Any, over_tls: bool, memo: object) -> SimpleNamespace:
        to = _ROUTES.get(dest.host)
        if to is None:
            raise RoutingError(404, dest.host, "no such node")
        return SimpleNamespace(route=to)


def _connection(base: type) -> type:
    """http_proxy._Connection's part the callbacks use, over ``base`` (either CallbackPath)."""

    class _Connection(base):  # type: ignore[valid-type,misc]
        def __init__(
            self, ex: Exchange, sock: SocketStream, upstream: ByteStream, idle: float = IDLE
        ) -> None:
            super().__init__()
            self.ex, self.reader, self.writer = ex, sock, sock
            self.upstream = upstream
            self.pump = None
            self.peer = ("192.0.2.1", 40000)
            self.watch = IdleWatch(IDLE)  # the task's (its drain of a slow client)
            self.idled: list[str] = []
            self.counted: list[int] = []
            self.ctx = SimpleNamespace(
                drain=SimpleNamespace(draining=False),
                limits=SimpleNamespace(idle_timeout=idle),
                router=_Router(),
                metrics=ServerMetrics(),
                relay_done=lambda front, relay, result, **kw: self.idled.append(relay),
            )
            self.proxy = SimpleNamespace(
                front="http", egress=None, over_tls=False, counters={}, count=self.counted.append
            )

        def _close_upstream(self) -> None:
            if self.upstream is not None:
                self.upstream.close()
                self.upstream = None

    return _Connection


_New = _connection(CallbackPath)
_Old = _connection(_OldCallbackPath)


def _get(path: str, host: str = "edge-1:9100", *fields: str) -> bytes:
    return "\r\n".join([f"GET {path} HTTP/1.1", f"Host: {host}", *fields, "", ""]).encode()


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

_REQUESTS: dict[str, bytes] = {
    "get": _get("/c"),
    "get2": _get("/c2"),
    "head": b"HEAD /h HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
    "close": _get("/g", "edge-1:9100", "Connection: close"),
    "pipelined": _get("/e") + _get("/f"),
    "pipelined_head": b"HEAD /h HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n" + _get("/f"),
    "elsewhere": _get("/d", "edge-2:9100"),
    "ghost": _get("/n", "ghost:9100"),
    "post": b"POST /p HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 3\r\n\r\nabc",
    "post_part": b"POST /p HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 5\r\n\r\nab",
    "expect": b"POST /x HTTP/1.1\r\nHost: edge-1:9100\r\nExpect: 100-continue\r\n"
    b"Content-Length: 2\r\n\r\n",
    "body_rest": b"cd",
    "piece": b"GET /x HTTP/1.1\r\nHo",
    "piece_rest": b"st: edge-1:9100\r\n\r\n",
    "garbage": b"\x01\x02 nonsense\r\n\r\n",
    "upgrade": _get("/w", "edge-1:9100", "Connection: Upgrade", "Upgrade: websocket"),
    "empty_lines": b"\r\n",
}

_ANSWERS: list[bytes] = [
    _OK,
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nT: 1\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nDate: x\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n" + _OK,
    b"HTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n" + _OK,
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",  # a HEAD's (else the body is to come)
    b"HTTP/1.1 200 OK\r\nContent-Type: t\r\n\r\nuntil-close",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
    _OK + b"xyz",  # bytes past the answer's end
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nws",
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789",
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
    b"\r\n",  # empty lines: between requests, no news
    b"xyz",  # bytes nobody asked for (or a broken answer)
]

_OTHER = ["eof", "reset", "pause", "resume", "tight", "loose", "gone", "drain"]

_Event = tuple[str, object]


# A request kept on the stream and the answers that fit it (most turns of a conversation).
_TURNS: list[tuple[str, list[bytes | None]]] = [
    ("get", [_OK]),
    ("get2", [_ANSWERS[1]]),
    ("get", [_ANSWERS[2]]),
    ("get", [_ANSWERS[3]]),
    ("get", [_ANSWERS[4]]),
    ("get2", [_ANSWERS[5]]),
    ("head", [_ANSWERS[6]]),
    ("get", [_ANSWERS[11]]),
    ("get", [_ANSWERS[12]]),
    ("pipelined", [_OK, _ANSWERS[1]]),
    ("pipelined_head", [_ANSWERS[6], _OK]),
    ("post", [_OK]),
    ("expect", [_ANSWERS[4]]),
    ("get", [_ANSWERS[7], None]),  # until-close: the stream's end ends it
    ("get", [_ANSWERS[8]]),  # Connection: close
    ("close", [_OK]),
    ("upgrade", [_ANSWERS[10]]),
]


def _chunks(draw: st.DrawFn, answer: bytes) -> list[_Event]:
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(answer) - 1)), max_size=2))))
    cuts = [c for c in cuts if c < len(answer)]
    parts = [answer[a:b] for a, b in zip([0, *cuts], [*cuts, len(answer)], strict=True)]
    # a view of a tunnel message (bytes once small)
    return [("chunk", memoryview(p) if draw(st.booleans()) else p) for p in parts]


@st.composite
def _events(draw: st.DrawFn) -> list[_Event]:
    out: list[_Event] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["turn"] * 6 + ["request", "answer", "other", "other"]))
        if kind == "turn":
            request, answers = draw(st.sampled_from(_TURNS))
            turn: list[_Event] = [("client", request)]
            for answer in answers:
                turn += [("eof", None)] if answer is None else _chunks(draw, answer)
            if draw(st.integers(0, 4)) == 0:  # its first chunk comes as the request is written
                turn.insert(0, ("inside", bytes(cast(bytes, turn.pop(1)[1]))))
            # something else meanwhile: the client's next bytes, the target's, a pause...
            if draw(st.integers(0, 3)) == 0:
                extra = draw(
                    st.sampled_from(
                        [("client", r) for r in ("get", "pipelined", "close", "body_rest")]
                        + [(o, None) for o in _OTHER]
                        + [("chunk", b"\r\n"), ("chunk", b"x")]
                    )
                )
                turn.insert(draw(st.integers(1, len(turn))), extra)
            out += turn
        elif kind == "request":
            out.append(("client", draw(st.sampled_from(sorted(_REQUESTS)))))
        elif kind == "other":
            out.append((draw(st.sampled_from(_OTHER)), None))
        else:
            out += _chunks(draw, draw(st.sampled_from(_ANSWERS)))
    return out


class _World:
    """One connection served by its callbacks (``_by_callbacks`` running as its task), after a
    first request answered: waiting for the next."""

    def __init__(self, cls: type, idle: float = IDLE) -> None:
        self.old = cls is _Old
        ex = Exchange(via=VIA, max_head=4096)
        assert [type(a) for a in ex.receive_client(_get("/a"))] == [RouteRequest]
        assert [type(a) for a in ex.routed(_EDGE1)] == [OpenUpstream]
        ex.upstream_opened()
        assert ex.receive_upstream(_OK) and ex.phase == "head"
        self.stream = _TStream()
        self.transport = _Transport()
        self.sock = SocketStream(64 * 1024)
        self.sock.connection_made(cast(asyncio.Transport, self.transport))
        upstream = TunnelByteStream(cast(TunnelStream, self.stream))
        self.conn: Any = cls(ex, self.sock, upstream, idle)
        self.task = asyncio.ensure_future(self.conn._by_callbacks())

    def step(self, event: _Event, *, age: bool = True) -> None:
        kind, arg = event
        watch = self.conn._calls
        if watch is not None and age:
            watch.last = asyncio.get_running_loop().time() - 10  # a stamp 10 s old
        if kind == "client":
            self.sock.data_received(_REQUESTS[cast(str, arg)])
        elif kind == "chunk":
            self.stream.feed(cast(bytes, arg))
        elif kind == "inside":
            self.stream.inside.append(cast(bytes, arg))
        elif kind == "eof":
            self.stream.feed_eof()
        elif kind == "reset":
            self.stream.fail()
        elif kind == "pause":
            self.sock.pause_writing()
        elif kind == "resume":
            self.sock.resume_writing()
        elif kind == "tight":
            self.stream.credit = 5
        elif kind == "loose":
            self.stream.credit = None
        elif kind == "drain":  # the server drains (Drain.start's close is its own)
            self.conn.ctx.drain.draining = True
        elif kind == "gone":
            self.transport.closing = True
            self.sock.connection_lost(None)

    def state(self) -> tuple[object, ...]:
        conn, stream, task = self.conn, self.stream, self.task
        left: object = None
        in_force: object = None
        watch = conn._calls
        if task.done():
            exc = task.exception()
            left = repr(exc) if exc is not None else [repr(a) for a in task.result()]
        elif conn._exit is None:
            left = "draining the client"  # the callbacks left; the task waits for the client
        elif watch is not None:
            # The timeout the block is guarded with now: e115ebc's retimed one, the branch's
            # asked by turns.
            in_force = watch.timeout if self.old else watch.timeout_now()
        now = asyncio.get_running_loop().time()
        return (
            b"".join(self.transport.out),
            b"".join(stream.sent),
            stream.bytes_in,
            [bytes(c) for c in stream._chunks],
            stream.closed,
            stream._on_readable is None,
            conn.upstream is None,
            conn.waiting,
            conn.ex.phase,
            list(conn.counted),
            list(conn.idled),
            _stray(conn),
            in_force,
            watch is not None and now - watch.last < 5,
            left,
        )


def _stray(conn: Any) -> float:
    value = conn.ctx.metrics.registry.get_sample_value(
        "ravenproxy_server_upstream_stray_total", {"front": "http"}
    )
    return value or 0.0


async def _outcome(task: asyncio.Task[list[Action]]) -> object:
    try:
        return [repr(a) for a in await task]
    except Exception as exc:
        return repr(exc)


async def _both(events: list[_Event]) -> None:
    worlds = [_World(_Old), _World(_New)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    old, new = worlds
    assert old.state() == new.state()
    for i, event in enumerate(events):
        tally(event[0] if event[0] != "client" else f"client {event[1]}")
        for world in worlds:
            world.step(event)
        for _ in range(3):  # the task, once the callbacks left: it returns
            await asyncio.sleep(0)
        assert new.state() == old.state(), (i, event)
        if old.task.done() or old.conn._exit is None:
            tally(f"left after {i + 1} events")
            old.sock.resume_writing()
            new.sock.resume_writing()
            assert await _outcome(new.task) == await _outcome(old.task)
            return
    for world in worlds:
        world.sock.resume_writing()
        world.conn._leave([])
        await world.task


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_events())
def test_the_callbacks_answer_as_e115ebcs(events: list[_Event]) -> None:
    asyncio.run(_both(events))


# -- the clocks, in real time --------------------------------------------------------------------

_LONG_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n"


async def _timed(
    cls: type, idle: float, script: list[tuple[float, _Event]]
) -> tuple[float, object]:
    """A connection served by callbacks, given ``script``'s events at their times (seconds
    from its start): when its task ended, and what it left (or how it failed)."""
    loop = asyncio.get_running_loop()
    world = _World(cls, idle)
    start = loop.time()
    for at, event in script:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        assert not world.task.done(), f"ended before {event} at {at}"
        world.step(event, age=False)
    outcome = await asyncio.wait_for(_outcome(world.task), 5.0)
    return loop.time() - start, (outcome, world.conn.idled)


_GET: _Event = ("client", "get")
_KA_CLOSE = "Close(reason='no next request for {:g}s')"

# (keep-alive, --idle-timeout, script, when the watch fires, what the task is left)
_CLOCKS = [
    # waiting for a next request, nothing comes: the keep-alive turn
    (0.3, 0.6, [], 0.3, _KA_CLOSE.format(0.3)),
    (0.6, 0.3, [], 0.6, _KA_CLOSE.format(0.6)),
    # a request sent, no answer: the answer's turn from the request, longer or shorter
    (0.3, 0.6, [(0.1, _GET)], 0.7, "504"),
    (0.6, 0.3, [(0.1, _GET)], 0.4, "504"),
    # the answer ended: the keep-alive turn from its end, not the answer's
    (0.6, 0.3, [(0.1, _GET), (0.2, ("chunk", _OK))], 0.8, _KA_CLOSE.format(0.6)),
    (0.3, 0.6, [(0.1, _GET), (0.2, ("chunk", _OK))], 0.5, _KA_CLOSE.format(0.3)),
    # an answer that goes on, a chunk under the idle timeout apart, then stops midway
    (
        0.6,
        0.3,
        [(0.0, _GET), (0.1, ("chunk", _LONG_ANSWER))]
        + [(0.1 + 0.2 * i, ("chunk", b"x")) for i in range(1, 5)],
        0.9 + 0.3,
        "Close",
    ),
    # the next request a while after an answer: its turn from the request
    (0.3, 0.6, [(0.0, _GET), (0.1, ("chunk", _OK)), (0.3, _GET)], 0.9, "504"),
]


@pytest.mark.parametrize(("keepalive", "idle", "script", "due", "left"), _CLOCKS)
def test_the_clocks_fire_by_their_turn_as_e115ebcs(
    keepalive: float,
    idle: float,
    script: list[tuple[float, _Event]],
    due: float,
    left: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http_callbacks, "KEEPALIVE_TIMEOUT", keepalive)
    monkeypatch.setitem(globals(), "KEEPALIVE_TIMEOUT", keepalive)  # e115ebc's
    outcomes = []
    for cls in (_Old, _New):
        took, outcome = asyncio.run(_timed(cls, idle, script))
        # A sweep looks up to an eighth of its timeout late (and a loop's tick).
        assert due - 0.02 <= took <= due + min(keepalive, idle) / 8 + 0.1, (cls, took, outcome)
        assert left in repr(outcome), outcome
        outcomes.append(outcome)
    assert outcomes[0] == outcomes[1]
