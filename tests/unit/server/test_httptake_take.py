"""httptake: the HTTP front's callback mode takes a client's bytes as they come
(:meth:`SocketStream.on_data`'s ``take``, ``CallbackPath._advance``'s ``took``): handed to
``_advance`` as the read its call back would make at once (the exchange waiting for a next
request's head, nothing of one parsed or begun, no drain), not buffered, called back and read
back.

f194fe2's ``CallbackPath`` and ``_turns`` are kept below VERBATIM (the class only renamed
``_F194CallbackPath``; its module's imports, none of whose targets httptake changed). Two like
connections — each entered into callback mode by its own ``_by_callbacks`` over a real
:class:`SocketStream` (its buffer, its bound, its pause of reading) and test_review24's
stand-in tunnel stream — are fed the same generated events: test_review24's (requests kept on
the stream, pipelined, elsewhere, refused, a POST's body, a head in pieces, garbage, answers cut
anywhere, a client that stops reading or goes away, a drain, credit that runs out) and the
client's bytes cut anywhere, its EOF, a head past the bound and a body past the socket's bound.
After each event both wrote the same bytes to the client and the target, hold the same bytes
in the socket (read paused alike), wait alike, and left the task the same actions. And on real
front sockets (loopback): keep-alive requests, pipelined, in pieces, a body, answered alike, no
read a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from hypothesis import HealthCheck, example, given, settings
from hypothesis import event as tally
from hypothesis import strategies as st

from ravenproxy.errors import RoutingError
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
from tests.helpers import examples
from tests.unit.server.test_callbacks_take import _socket_reads
from tests.unit.server.test_exchange import VIA
from tests.unit.server.test_review24_callbacks import (
    _EDGE1,
    _REQUESTS,
    _connection,
    _events,
    _get,
    _outcome,
    _tally,
    _TStream,
    _World,
)

KEEPALIVE_TIMEOUT = 300.0

# -- f194fe2's CallbackPath, verbatim (renamed) ----------------------------------------------------


class _F194CallbackPath(KeptUpstream):
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
        sock.on_data(advance)
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

    def _advance(self, came: bytes | memoryview | None = None) -> bool:
        """Move the exchange on as far as it goes without waiting: the client socket's callback
        (and the stream's, above). Runs in a callback (the socket's, the session reader's):
        nothing may escape; what fails goes to the task. One function, not a guard calling the
        loop: it runs twice a request.

        ``came``: an answer's chunk as the stream got it (the stream's ``take``: it holds no
        other), taken as the forwarding step's read would have read it; returns whether it
        was (False: not forwarding, or the client cannot take it now: the stream holds it and
        calls back, which sees why)."""
        done = self._exit
        if (
            done is None
            or done.done()
            or self._busy
            or (came is not None and self.ex.phase != "forwarding")
        ):
            # Out of callback mode, or called back from inside (the loop below sees what
            # changed); a chunk between requests is the kept stream's news (read by the call
            # back that follows).
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
                            self._leave([])
                            return True
                        # Nothing came since a read took all (an answer's end, as a rule):
                        # no read that would find nothing.
                        data = sock.read_nowait(READ_LIMIT) if sock.pending else None
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
                            watch.touch()  # the keep-alive turn (_turns) from now
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
                        watch.touch()  # the answer's turn (_turns) from now
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


def _turns(ex: Exchange, ctx: FrontContext) -> Callable[[], float]:
    """The callbacks' watch's timeout by turns: --idle-timeout while the target's answer is
    awaited, :data:`KEEPALIVE_TIMEOUT` otherwise (a next request). A closure, not a method of
    the connection: the connection holds the watch, which would hold it back (a cycle)."""

    def timeout() -> float:
        return ctx.limits.idle_timeout if ex.phase == "forwarding" else KEEPALIVE_TIMEOUT

    return timeout


# -- the driver -------------------------------------------------------------------------------

_New = _connection(CallbackPath)
_Old = _connection(_F194CallbackPath)

_BIG = b"POST /b HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: %d\r\n\r\n"
_LONG_HEAD = _get("/l", "edge-1:9100", "X-Long: " + "y" * 5000)  # past max_head (4096)

_Event = tuple[str, object]


class _Client(_World):
    """test_review24's world, the client's bytes also as they come on the wire: cut anywhere,
    its EOF, a body past the socket's bound."""

    def __init__(self, cls: type) -> None:
        super().__init__(cls)
        self.new = cls is _New

    def step(self, event: _Event, *, age: bool = True) -> None:
        kind, arg = event
        if kind == "bytes":
            watch = self.conn._calls
            if watch is not None and age:
                watch.last = asyncio.get_running_loop().time() - 10
            with _socket_reads() as reads:
                self.sock.data_received(cast(bytes, arg))
            if self.new and not reads:
                _tally("client bytes taken" if not self.sock._buffer else "client bytes held")
        elif kind == "client_eof":
            self.sock.eof_received()
        else:
            super().step(event, age=age)

    def state(self) -> tuple[object, ...]:
        sock = self.sock
        return (*super().state(), bytes(sock._buffer), sock._read_paused, sock.ended)


@st.composite
def _traffic(draw: st.DrawFn) -> list[_Event]:
    out: list[_Event] = []
    for event in draw(_events()):
        if event[0] == "client" and draw(st.booleans()):
            data = _REQUESTS[cast(str, event[1])]
            cuts = sorted(set(draw(st.lists(st.integers(1, len(data) - 1), max_size=2))))
            parts = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
            out += [("bytes", p) for p in parts]
        else:
            out.append(event)
        if draw(st.integers(0, 7)) == 0:
            out.append(
                draw(
                    st.sampled_from(
                        [
                            ("client_eof", None),
                            ("bytes", _get("/t") + _get("/u")),  # two at once
                            ("bytes", _LONG_HEAD),
                            ("bytes", _BIG % 70_000 + b"z" * 70_000),  # >= LEND_FROM
                            ("bytes", _BIG % 300_000 + b"z" * 140_000),  # past the bound
                            ("bytes", b"z" * 140_000),
                            ("bytes", b"\r\n"),
                        ]
                    )
                )
            )
    return out


async def _both(events: list[_Event]) -> None:
    worlds = [_Client(_Old), _Client(_New)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    old, new = worlds
    assert old.state() == new.state()
    for i, event in enumerate(events):
        tally(event[0])
        for world in worlds:
            world.step(event)
        for _ in range(3):
            await asyncio.sleep(0)
        assert new.state() == old.state(), (i, event)
        if old.task.done() or old.conn._exit is None:
            old.sock.resume_writing()
            new.sock.resume_writing()
            assert await _outcome(new.task) == await _outcome(old.task)
            return
    for world in worlds:
        world.sock.resume_writing()
        world.conn._leave([])
        await world.task


_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@settings(max_examples=examples(1000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_traffic())
@example([("bytes", _get("/c")), ("chunk", _OK), ("bytes", _get("/d")), ("chunk", _OK)])
@example([("bytes", _get("/c")[:7]), ("bytes", _get("/c")[7:]), ("chunk", _OK)])
@example([("bytes", _get("/c") + _get("/d")), ("chunk", _OK), ("chunk", _OK)])
@example([("bytes", _get("/c")), ("bytes", _get("/d")), ("chunk", _OK), ("chunk", _OK)])
@example([("client_eof", None)])
@example([("bytes", _LONG_HEAD)])
@example([("bytes", _BIG % 300_000 + b"z" * 140_000), ("tight", None), ("bytes", b"z" * 9)])
@example([("drain", None), ("bytes", _get("/c"))])
@example([("bytes", _BIG % 1_100_000 + b"z" * 1_100_000)])  # past a read (READ_LIMIT)
@example([("bytes", _get("/n", "ghost:9100")), ("bytes", _get("/c"))])
def test_the_callbacks_take_client_bytes_as_f194fes(events: list[_Event]) -> None:
    asyncio.run(_both(events))


async def test_a_next_request_is_taken_as_it_comes_not_read_back() -> None:
    for cls, reads in ((_Old, 1), (_New, 0)):
        world = _Client(cls)
        await asyncio.sleep(0)
        with _socket_reads() as counted:
            world.step(("bytes", _get("/c")))
            assert b"".join(world.stream.sent).startswith(b"GET /c HTTP/1.1\r\n")
            assert world.conn.ex.phase == "forwarding"
            world.step(("chunk", _OK))
            assert world.conn.waiting and b"".join(world.transport.out) == _OK
        assert len([n for n in counted if n]) == reads and not world.sock._buffer
        world.conn._leave([])
        await world.task


# -- on real front sockets ------------------------------------------------------------------


async def _until(check: Callable[[], bool]) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("not in time")


async def _real(cls: type, turns: list[tuple[list[bytes], int]]) -> tuple[object, ...]:
    """A client on loopback sends each turn's pieces (a request, two pipelined, a body...),
    the target answers as many :data:`_OK` once it got them; what the client and the target
    got, what the task was left, and the socket's reads that found bytes."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[SocketStream] = loop.create_future()

    def factory() -> SocketStream:
        sock = SocketStream(64 * 1024)
        accepted.set_result(sock)
        return sock

    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sock = await accepted
    ex = Exchange(via=VIA, max_head=4096)
    ex.receive_client(_get("/a"))
    ex.routed(_EDGE1)
    ex.upstream_opened()
    ex.receive_upstream(_OK)
    stream = _TStream()
    conn: Any = cls(ex, sock, TunnelByteStream(cast(TunnelStream, stream)))
    got = b""
    with _socket_reads() as reads:
        task = asyncio.ensure_future(conn._by_callbacks())
        await asyncio.sleep(0)
        for pieces, answers in turns:
            sent = b"".join(stream.sent)
            before, want = sent.count(_ASKED), len(sent) + sum(map(len, pieces))
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.002)
            for k in range(answers):  # a pipelined request goes once the last is answered
                need, size = before + k + 1, want if answers == 1 else 0
                await _until(
                    lambda need=need, size=size: (
                        task.done()
                        or (
                            b"".join(stream.sent).count(_ASKED) >= need
                            and len(b"".join(stream.sent)) >= size
                        )
                    )
                )
                if task.done():
                    break
                stream.feed(_OK)
                got += await asyncio.wait_for(reader.readexactly(len(_OK)), 2)
        if not task.done():
            conn._leave([])
        left = await _outcome(task)
    writer.close()
    sock.transport.close()
    server.close()
    await server.wait_closed()
    return got, b"".join(stream.sent), left, len([n for n in reads if n])


_ASKED = b" HTTP/1.1\r\nHost: "
_POST = b"POST /p HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 3\r\n\r\n"
_TURN = st.sampled_from(
    [
        ([_get("/c")], 1),
        ([_get("/c") + _get("/d")], 2),  # pipelined
        ([_POST + b"abc"], 1),
        ([_POST, b"abc"], 1),  # the body after the head
        ([_get("/c")[:5], _get("/c")[5:]], 1),  # a head in pieces: the task reads it
    ]
)


async def _real_both(turns: list[tuple[list[bytes], int]]) -> None:
    old = await _real(_Old, turns)
    new = await _real(_New, turns)
    assert new[:3] == old[:3]
    assert cast(int, new[3]) <= cast(int, old[3])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_TURN, min_size=1, max_size=5))
@example([([_get("/c")], 1)] * 4)
def test_real_sockets_answer_as_f194fes(turns: list[tuple[list[bytes], int]]) -> None:
    asyncio.run(_real_both(turns))


async def test_real_keepalive_requests_make_no_read() -> None:
    turns = [([_get(f"/r{i}")], 1) for i in range(5)]
    old = await _real(_Old, turns)
    new = await _real(_New, turns)
    assert new[:3] == old[:3] and old[3] == 5 and new[3] == 0
