"""The agent's :class:`Splice` against ebcf73b's (``_Ebcf73bSplice`` below, verbatim but for its
name), and the server's :class:`FrontSplice` on it against ebcf73b's (``_Ebcf73bFrontSplice``,
on ``_Ebcf73bSplice``). splice3 had :meth:`Splice._take` ask one derived state (``_sink``) for
the four flags and the transport; it saved ~45 instructions a chunk for an invariant kept by
hand in eight places, and was taken out again. These checks stay as the behaviour's oracle.

Differentially, on real sessions over a loopback WebSocket: the same generated traffic (chunks
the cloud side writes, its end, its reset; the socket's write buffer passing its high mark and
draining; a socket write that fails; the socket lost, cleanly or not; its EOF; the splice's wait
cancelled) goes to both splices. After each step the socket was written the same chunks with
the same EOF and the splices agree on their state; at the end the result, the stream's count of
bytes read and what it holds, and the credit the cloud side got back are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any, cast

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.log import kv
from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.front_splice import FrontSplice
from ravenproxy.transport.lender import LEND_FROM, LEND_IDLE
from ravenproxy.transport.readiness import quiet, watch
from ravenproxy.transport.relay import (
    CREDIT_PROBE,
    IDLE_ERROR,
    IdleTimeout,
    IdleWatch,
    RelayResult,
    client_gone,
    tune,
)
from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.transport.splice import Splice
from ravenproxy.wire.codes import ErrorCode
from tests.unit.transport.test_relay import accepting
from tests.unit.transport.test_review22_take import _Socket
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import settle

log = logging.getLogger(__name__)


class _Ebcf73bSplice(asyncio.Protocol):
    """One dialled socket (this is its protocol) spliced to one tunnel stream
    (:meth:`start`). Await :meth:`wait` for the end; it closes both."""

    __slots__ = (
        "_done",
        "_down_done",
        "_eof_sent",
        "_lost",
        "_over",
        "_pending",
        "_sender",
        "_up_done",
        "_up_eof",
        "_wake",
        "_watch",
        "_write_paused",
        "result",
        "stream",
        "transport",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.stream: TunnelStream | None = None
        self.result = RelayResult()
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._over = False
        """``_done.done()`` as an attribute, for :meth:`_readable` (a chunk a request): set
        where ``_done`` is set (:meth:`_finish`) or cancelled (:meth:`wait` cancelled). A
        Future's ``done()`` is a method call its load is not specialized for (~350
        instructions)."""
        self._pending: list[bytes | memoryview] = []
        """Socket bytes the stream did not take at once: :attr:`_sender` sends them."""
        self._sender: asyncio.Task[None] | None = None
        self._write_paused = False
        self._up_eof = False
        """The socket sent its EOF (or went away)."""
        self._up_done = False
        """The stream got our EOF: nothing more goes up."""
        self._down_done = False
        """The stream ended and the socket got its EOF."""
        self._lost = False
        self._eof_sent = False
        """The socket got our EOF."""
        self._watch: IdleWatch | None = None
        """The idle clock (the front's; the agent has none): each byte moved touches it."""
        self._wake: asyncio.Future[None] | None = None
        """What the front's :meth:`wait` waits on while it need not look at the client."""

    # -- the socket (asyncio.Protocol) ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        tune(self.transport)
        watch(self.transport)  # a target's answer queues tunnel output: readiness.py

    def data_received(self, data: bytes) -> None:
        stream = self.stream
        if stream is None or self._pending or self._sender is not None:
            self._queue(data)
            return
        # _give, written out: a read a request on the agent.
        sent = stream.try_write(data)
        self.result.bytes_up += sent
        if self._watch is not None:
            self._watch.touch()
        if sent < len(data):
            self._queue(memoryview(data)[sent:])

    def _give(self, stream: TunnelStream, data: bytes | memoryview) -> None:
        """Up with ``data``: what has credit at hand goes now, the rest to the sender."""
        sent = stream.try_write(data)
        self.result.bytes_up += sent
        if self._watch is not None:
            self._watch.touch()
        if sent < len(data):
            self._queue(memoryview(data)[sent:])

    def eof_received(self) -> bool:
        self._up_eof = True
        if self.transport is not None:  # half-closed: readable for ever (readiness.py)
            quiet(self.transport)
        self._send_eof()
        return True  # keep the transport open for our half (plain TCP can half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if exc is not None:
            self._fail_socket(exc)
            return
        self._up_eof = True
        self._send_eof()
        self._check()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._readable(drain=True)

    # -- the stream ----------------------------------------------------------------------------
    def start(self, stream: TunnelStream) -> None:
        """Splice ``stream`` (accepted) to the socket: what the socket sent meanwhile goes up."""
        self.stream = stream
        stream.on_readable(self._readable, self._take)
        if self._pending and self._sender is None and not self._done.done():
            self._send_pending()
        self._send_eof()
        self._readable(drain=True)

    def _take(self, chunk: bytes | memoryview) -> bool:
        """A chunk as it arrives, to the socket as :meth:`_readable` would (False: it would not)."""
        transport = self.transport
        if self._write_paused or self._down_done or self._lost or self._over or transport is None:
            return False
        try:  # as in _readable: in the session's reader, nothing may escape
            transport.write(chunk)
            self.result.bytes_down += len(chunk)
            if self._watch is not None:
                self._watch.touch()
        except Exception as exc:
            log.exception("splice failed", extra=kv(stream=self.stream and self.stream.id))
            self._fail_socket(exc)
        return True  # (read, as _readable had read it)

    def _readable(self, drain: bool = False) -> None:
        """A chunk, the end or an error arrived on the stream (called by it, for each one):
        pass it on. ``drain``: pass on everything the stream holds while the socket takes it
        (what arrived while the socket took nothing or before :meth:`start`). Called by the
        stream, the stream holds nothing else: whatever arrived before it was passed on when
        it arrived, or is held back and drained when the socket takes bytes again; so it reads
        once, not a second time to find nothing (a call a request on the agent). Runs in the
        session's reader: nothing may escape."""
        stream, transport = self.stream, self.transport
        if stream is None or transport is None or self._over:
            return
        try:
            # A reset (or the tunnel gone) ends the splice even while the socket takes nothing
            # or after the stream's end (a target that reads nothing, or sends nothing back,
            # would otherwise hold both ends): read_nowait raises. Whether it was reset is asked
            # only then (a property: twice a request on the agent, where the socket takes all).
            while True:
                if (self._write_paused or self._down_done) and not stream.closed:
                    return
                chunk = stream.read_nowait()
                if chunk is None:
                    return
                if not chunk:
                    self._down_done = True
                    if not self._lost and transport.can_write_eof() and not transport.is_closing():
                        transport.write_eof()
                        self._eof_sent = True
                    self._check()
                    return
                if self._lost:
                    self._fail_socket(ConnectionResetError("Connection lost"))
                    return
                transport.write(chunk)
                self.result.bytes_down += len(chunk)
                if self._watch is not None:
                    self._watch.touch()
                if not drain:
                    return
        except StreamClosedError as exc:
            self._finish(str(exc))
        except Exception as exc:
            log.exception("splice failed", extra=kv(stream=stream.id))
            self._fail_socket(exc)

    # -- socket → stream -----------------------------------------------------------------------
    def _queue(self, data: bytes | memoryview) -> None:
        self._pending.append(data)
        if self.stream is None or self._sender is not None or self._done.done():
            return
        self._send_pending()

    def _send_pending(self) -> None:
        assert self.transport is not None and self.stream is not None
        self._hold()
        self._sender = asyncio.create_task(self._send(), name=f"splice-up:{self.stream.id}")

    async def _send(self) -> None:
        stream, transport = self.stream, self.transport
        assert stream is not None and transport is not None
        try:
            while self._pending:
                data = self._pending.pop(0)
                sent = stream.bytes_out
                try:
                    await stream.write(data)
                finally:  # what went, also of a write cut short
                    self.result.bytes_up += stream.bytes_out - sent
                if self._watch is not None:
                    self._watch.touch()
        except StreamClosedError as exc:
            self._finish(str(exc))
            return
        finally:
            self._sender = None
        if not self._done.done():
            self._release()
        self._send_eof()

    def _hold(self) -> None:
        """Bytes wait to go up (for credit): take no more from the socket meanwhile."""
        assert self.transport is not None
        self.transport.pause_reading()

    def _release(self) -> None:
        """They went: take the socket's bytes again."""
        assert self.transport is not None
        if not self._lost:
            self.transport.resume_reading()

    def _send_eof(self) -> None:
        stream = self.stream
        if (
            stream is None
            or not self._up_eof
            or self._up_done
            or self._pending
            or self._sender is not None
            or self._done.done()
        ):
            return
        self._up_done = True
        stream.write_eof()
        self._check()

    # -- the end -------------------------------------------------------------------------------
    def _check(self) -> None:
        transport = self.transport
        if self._down_done and (
            self._up_done or transport is None or not transport.can_write_eof()
        ):
            self._finish("")

    def _fail_socket(self, exc: BaseException) -> None:
        if self._done.done():
            return
        self._finish(f"socket: {exc!r}")
        if self.stream is not None:
            self.stream.reset(ErrorCode.CANCEL, "socket error")

    def _finish(self, error: str) -> None:
        if self._done.done():
            return
        self.result.error = error
        self._over = True
        self._done.set_result(None)
        self._nudge()

    def _nudge(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def wait(self) -> RelayResult:
        """Until the splice ends (the caller cancelled: it is aborted); closes both ends."""
        try:
            await self._until_done()
        except IdleTimeout:
            self._finish(IDLE_ERROR)  # first: the reset below calls back
            self.result.idle = True
            if self.stream is not None:
                self.stream.reset(ErrorCode.CANCEL, IDLE_ERROR)
        except asyncio.CancelledError:
            self._over = self._done.done()  # cancelled with the wait (Splice's)
            if self.stream is not None:
                self.stream.reset(ErrorCode.CANCEL, "relay cancelled")
            self.result.error = self.result.error or "cancelled"
            raise
        finally:
            await self._close()
        return self.result

    async def _until_done(self) -> None:
        await self._done

    async def _close(self) -> None:
        sender = self._sender
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        if self.stream is not None:
            self.stream.on_readable(None)
            self.stream.close()
        if self.transport is not None:
            if self.result.error:
                self.transport.abort()
            else:
                self.transport.close()


class _Ebcf73bFrontSplice(_Ebcf73bSplice):
    """A server front's client socket (its :class:`SocketStream`, which calls back) spliced
    to a tunnel stream (:meth:`splice`), with the relay's idle timeout and client checks.
    Await :meth:`wait` for the end; it closes both."""

    __slots__ = ("_sock",)

    def __init__(self, sock: SocketStream, idle_timeout: float | None) -> None:
        super().__init__()
        self._sock = sock
        self._watch = IdleWatch(idle_timeout)
        self.transport = sock.transport
        tune(sock.transport)
        self._write_paused = sock.write_paused

    def splice(
        self, stream: TunnelStream, initial_up: bytes = b"", initial_down: bytes = b""
    ) -> None:
        """Start: ``initial_down`` (read from the target already) to the socket, ``initial_up``
        (read from the socket already) and whatever the socket holds up the stream."""
        sock = self._sock
        sock.on_writing(self)  # first: initial_down may fill the socket's buffer past its mark
        if initial_down:
            sock.transport.write(initial_down)
            self.result.bytes_down += len(initial_down)
        sock.lend_reads()
        sock.on_data(self._pull)
        self.start(stream)
        if initial_up:
            self.data_received(initial_up)
        self._pull()

    def _pull(self) -> None:
        """The socket's callback (bytes, its EOF, its loss), and the sender's end: take what it
        holds while nothing waits to go up. Runs in a callback: nothing may escape."""
        sock, stream = self._sock, self.stream
        if stream is None or self._done.done():
            return
        if sock.lost:
            self._lost = True
            error = sock.exception()
            if error is not None:
                if self._sender is not None:  # as the relay says it of an upload that waits
                    error = ConnectionResetError(client_gone(sock, sock))
                self._fail_socket(error)
                return
        try:
            while not self._pending and self._sender is None and not self._up_eof:
                data = sock.read_chunk_nowait(READ_LIMIT)
                if data is None:
                    return
                if not data:
                    self._up_eof = True
                    self._nudge()  # wait() looks at the client from now on
                    self._send_eof()
                    self._check()
                    return
                if len(data) < LEND_FROM:
                    self._give(stream, data)
                else:
                    # Bulk: by the sender, whose write sends each credit in one frame, as the
                    # relay's (try_write would cut it at the session's output room, and the rest
                    # make a second frame, a second write on the agent's side). No look at the
                    # credit per small read: 6 % of the server's instructions per request.
                    self._queue(data)
        except Exception as exc:
            self._fail_socket(exc)

    def _hold(self) -> None:
        # Nothing is taken from the socket meanwhile (see _pull): its stream buffers, and stops
        # reading past its bound. wait() looks at the client while the upload waits.
        self._nudge()

    def _release(self) -> None:
        # Also once the socket is lost: what it read before (a TLS client's close closes the
        # transport), and its EOF, still go up.
        self._pull()

    async def _until_done(self) -> None:
        """Until the end, or no byte either way for the idle timeout (:class:`IdleTimeout`);
        while an upload waits for credit, or the client half-closed and the target has not
        finished, the client's socket is looked at every :data:`CREDIT_PROBE` seconds (the
        relay's :meth:`watching_client`): reset, it ends the splice."""
        done, sock, watch = self._done, self._sock, self._watch
        assert watch is not None
        async with watch:
            while not done.done():
                if not self._watching_client():
                    self._wake = wake = done.get_loop().create_future()
                    try:
                        if sock.read_buffer_size:  # as a relay's reader: let them go if idle
                            up = self.result.bytes_up
                            await asyncio.wait((wake,), timeout=LEND_IDLE)
                            if not wake.done() and self.result.bytes_up == up:
                                sock.let_go_reads()
                        else:
                            await wake
                    finally:
                        self._wake = None
                    continue
                await asyncio.wait((done,), timeout=CREDIT_PROBE)
                if done.done():
                    return
                if self._watching_client():
                    gone = client_gone(sock, sock, eof_sent=self._eof_sent)
                    if gone:
                        self._fail_socket(ConnectionResetError(gone))

    def _watching_client(self) -> bool:
        """An upload waits for credit, or the client half-closed and the target has not
        finished: the client's socket is looked at for a reset (nothing else would notice)."""
        return self._sender is not None or (self._up_eof and not self._down_done)

    async def _close(self) -> None:
        self._sock.on_data(None)
        self._sock.on_writing(None)
        await super()._close()


class _Transport(_Socket):
    """test_review22_take's socket, with what ``connection_made`` and the upload ask of it."""

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


Op = tuple[Any, ...]
_OPS = st.one_of(
    st.tuples(st.just("send"), st.binary(min_size=1, max_size=3000)),
    st.tuples(st.just("send"), st.binary(min_size=1, max_size=40)),
    st.tuples(
        st.sampled_from(["drain", "fail", "eof", "reset", "lost", "broken", "upeof", "cancel"])
    ),
)


def _state(splice: Any) -> tuple[Any, ...]:
    return (
        splice.result.bytes_down,
        splice.result.error,
        splice._over,
        splice._down_done,
        splice._write_paused,
        splice._lost,
        splice._up_done,
        splice._eof_sent,
    )


async def _run(cls: type[Any], ops: list[Op], high: int) -> list[Any]:
    seen: list[Any] = []
    ready: asyncio.Future[tuple[Any, TunnelStream, _Transport]] = (
        asyncio.get_running_loop().create_future()
    )

    async def on_open(stream: TunnelStream) -> None:
        stream.accept()
        splice, sock = cls(), _Transport(high)
        sock.protocol = splice
        splice.connection_made(cast(Any, sock))  # as the agent's dial makes it: before start
        splice.start(stream)
        ready.set_result((splice, stream, sock))
        await asyncio.sleep(WAIT * 4)

    async with tunnel(on_open) as t:
        cloud = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        splice, edge, sock = await asyncio.wait_for(ready, WAIT)
        waiter = asyncio.create_task(splice.wait())
        ended = False
        for op in ops:
            kind = op[0]
            if kind == "send" and not ended:
                with contextlib.suppress(StreamClosedError):
                    await asyncio.wait_for(cloud.write(op[1]), 0.5)
            elif kind == "eof" and not ended:
                cloud.write_eof()
                ended = True
            elif kind == "reset" and not ended:
                cloud.reset()
                ended = True
            elif kind == "drain":
                sock.drain()
            elif kind == "fail":
                sock.fail_next = True
            elif kind == "lost" and not splice._lost:
                splice.connection_lost(None)
            elif kind == "broken" and not splice._lost:
                splice.connection_lost(ConnectionResetError("peer"))
            elif kind == "upeof" and not splice._lost:
                splice.eof_received()
            elif kind == "cancel":
                waiter.cancel()
            await settle(t.cloud)
            await asyncio.sleep(0.003)
            seen.append((kind, list(sock.written), sock.eof, sock.closing, _state(splice)))
        await asyncio.sleep(0.03)
        sid = cloud.id
        window = t.cloud.conn.send_window(sid) if sid in t.cloud.conn.streams else None
        held = t.edge.conn.streams.get(edge.id)
        recv = (held.recv.available, held.recv.unacked) if held is not None else None
        edge_conn = (t.edge.conn._conn_recv.available, t.edge.conn._conn_recv.unacked)
        seen.append((edge.bytes_in, edge.buffered, window, recv, edge_conn))
        if not ended:
            cloud.reset()
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    return seen


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_OPS, min_size=1, max_size=12), st.sampled_from([10, 2000, 1 << 20]))
@example([("send", b"a" * 50), ("send", b"b"), ("drain",), ("send", b"c"), ("eof",)], 10)
@example([("fail",), ("send", b"a"), ("send", b"b")], 1 << 20)
@example([("send", b"a" * 50), ("send", b"b"), ("reset",), ("drain",)], 10)
@example([("lost",), ("send", b"a"), ("send", b"b")], 1 << 20)
@example([("broken",), ("send", b"a")], 1 << 20)
@example([("send", b"a"), ("cancel",), ("send", b"b")], 1 << 20)
@example([("upeof",), ("send", b"a"), ("eof",), ("send", b"b")], 1 << 20)
def test_the_splice_passes_on_as_ebcf73bs_did(ops: list[Op], high: int) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        return await _run(_Ebcf73bSplice, ops, high), await _run(Splice, ops, high)

    old, new = asyncio.run(both())
    assert new == old


def test_a_chunk_is_taken_as_it_arrives_once_the_socket_drains() -> None:
    """Paused, then drained, a chunk is taken again (written as it arrives, not held for the
    callback)."""

    async def run() -> tuple[list[bytes], int]:
        taken: list[bool] = []
        ready: asyncio.Future[tuple[Splice, _Transport]] = (
            asyncio.get_running_loop().create_future()
        )

        async def on_open(stream: TunnelStream) -> None:
            stream.accept()
            splice, sock = Splice(), _Transport(10)
            sock.protocol = splice
            splice.connection_made(cast(Any, sock))
            splice.start(stream)
            take = splice._take

            def spy(chunk: bytes | memoryview) -> bool:
                taken.append(take(chunk))
                return taken[-1]

            stream.on_readable(splice._readable, spy)
            ready.set_result((splice, sock))
            await asyncio.sleep(WAIT * 4)

        async with tunnel(on_open) as t:
            cloud = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
            splice, sock = await asyncio.wait_for(ready, WAIT)
            await cloud.write(b"x" * 20)  # past the high mark: paused
            await asyncio.sleep(0.02)
            assert splice._write_paused
            sock.drain()
            assert not splice._write_paused
            await cloud.write(b"y")
            await asyncio.sleep(0.02)
            cloud.reset()
            return sock.written, taken.count(True)

    written, took = asyncio.run(run())
    assert written == [b"x" * 20, b"y"]
    assert took == 2


_FRONT_OPS = st.one_of(
    st.tuples(st.just("down"), st.integers(1, 400_000)),
    st.tuples(st.just("down"), st.integers(1, 100)),
    st.tuples(st.just("up"), st.binary(min_size=1, max_size=2000)),
    st.tuples(st.sampled_from(["read", "wait", "upeof"])),
)


async def _front(cls: type[Any], ops: list[Op]) -> tuple[Any, ...]:
    """A real client socket at a front (its :class:`SocketStream`) spliced by ``cls`` to a
    tunnel stream whose other end (the target's) writes chunks and reads what comes up; the
    client reads only when told (its socket's buffer fills: the front pauses and resumes)."""
    got: list[TunnelStream] = []
    up = bytearray()

    async def on_open(stream: TunnelStream) -> None:
        stream.accept()
        got.append(stream)
        with contextlib.suppress(StreamClosedError):
            while data := await stream.read():
                up.extend(data)
            await asyncio.sleep(WAIT * 4)  # open for what goes down after the client's EOF

    loop = asyncio.get_running_loop()
    async with tunnel(on_open) as t, accepting("socketstream") as (port, accepted):
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # (before connect)
        client.connect(("127.0.0.1", port))
        client.setblocking(False)
        sock, _ = await asyncio.wait_for(accepted.get(), WAIT)
        assert type(sock) is SocketStream
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        sock.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16
        )
        splice = cls(sock, None)
        splice.splice(stream, b"", b"")
        sock.transport.set_write_buffer_limits(high=16384)  # paused soon: the client reads late
        waiter = asyncio.create_task(splice.wait())
        while not got:
            await asyncio.sleep(0.001)
        target = got[0]
        sent = bytearray()
        writes: list[asyncio.Task[None]] = []
        received = bytearray()
        shut = False

        def read() -> None:
            with contextlib.suppress(BlockingIOError):
                while data := client.recv(1 << 16):
                    received.extend(data)

        for op in ops:
            kind = op[0]
            if kind == "down":
                chunk = bytes([len(sent) % 251]) * op[1]
                sent.extend(chunk)
                previous = writes[-1] if writes else None

                async def write(chunk: bytes = chunk, previous: Any = previous) -> None:
                    if previous is not None:
                        await previous
                    await target.write(chunk)

                writes.append(asyncio.create_task(write()))
            elif kind == "up" and not shut:
                await loop.sock_sendall(client, op[1])
            elif kind == "upeof" and not shut:
                client.shutdown(socket.SHUT_WR)
                shut = True
            elif kind == "read":
                read()
            await asyncio.sleep(0.002 if kind != "wait" else 0.02)
        async with asyncio.timeout(WAIT):
            while len(received) < len(sent):  # the client reads all: every write goes
                read()
                await asyncio.sleep(0.002)
        await asyncio.wait_for(asyncio.gather(*writes), WAIT)
        target.write_eof()
        async with asyncio.timeout(WAIT):
            await _until_eof(client, received)
        if not shut:
            client.shutdown(socket.SHUT_WR)
        result = await asyncio.wait_for(waiter, WAIT)
        client.close()
        return (
            bytes(received) == bytes(sent),
            len(received),
            bytes(up),
            result.bytes_up,
            result.bytes_down,
            result.error,
            result.idle,
        )


async def _until_eof(client: socket.socket, received: bytearray) -> None:
    while True:
        try:
            data = client.recv(1 << 16)
        except BlockingIOError:
            await asyncio.sleep(0.002)
            continue
        if not data:
            return
        received.extend(data)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_FRONT_OPS, min_size=1, max_size=8))
@example([("down", 400_000), ("up", b"x"), ("wait",), ("read",), ("down", 5), ("read",)])
@example([("upeof",), ("down", 300_000), ("wait",), ("read",)])
def test_the_fronts_splice_passes_on_as_ebcf73bs_did(ops: list[Op]) -> None:
    async def both() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return await _front(_Ebcf73bFrontSplice, ops), await _front(FrontSplice, ops)

    old, new = asyncio.run(both())
    assert new == old
    assert new[0] is True
