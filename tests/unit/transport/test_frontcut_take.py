"""frontcut: the front's splice takes a client's small read as it comes
(:meth:`SocketStream.on_data`'s ``take``, :meth:`FrontSplice._offer`), not buffered, called back
and read back by ``_pull`` (whose second ``read_chunk_nowait`` a request found nothing); and
the splice's per-chunk idle stamp is ``touch`` written out (``watch.last = watch.clock()``).

- :class:`SocketStream` alone: what a take is offered, and what it is not (bytes buffered
  before it: they go first; ``on_data(None)`` ends it; a large read still starts lending).
- :class:`FrontSplice` against f667209's (``_F667209FrontSplice`` below, verbatim but for its
  name, on test_splice3_sink's ``_Ebcf73bSplice``, which is f667209's ``Splice`` verbatim) on
  real front sockets, over generated traffic: small and bulk uploads, a target that stops
  reading (the upload waits for credit, the client's next reads wait in the socket's buffer
  and must go up after it, in order), answers, the client's EOF and reset. The target gets
  the same bytes in the same order, the results agree.
- A small request and its answer make no ``read_chunk_nowait`` on the new splice.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.transport import front_splice as front_splice_module
from ravenproxy.transport import relay as relay_module
from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.front_splice import FrontSplice
from ravenproxy.transport.idle import IdleWatch
from ravenproxy.transport.lender import LEND_FROM, LEND_IDLE, Lender
from ravenproxy.transport.relay import CREDIT_PROBE, client_gone, tune
from ravenproxy.transport.session import SessionConfig, StreamClosedError, TunnelStream
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.wire.config import WireConfig
from tests.unit.transport.test_relay import accepting
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_splice3_sink import _Ebcf73bSplice

# -- SocketStream's take -----------------------------------------------------------------------


class _Noted:
    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.offered: list[bytes] = []
        self.called = 0

    def take(self, data: bytes) -> bool:
        self.offered.append(data)
        return self.answer

    def callback(self) -> None:
        self.called += 1


def test_a_taken_read_is_not_buffered_and_not_called_back() -> None:
    sock, noted = SocketStream(READ_LIMIT), _Noted(True)
    sock.on_data(noted.callback, noted.take)
    sock.data_received(b"abc")
    assert noted.offered == [b"abc"]
    assert noted.called == 0
    assert not sock.pending
    assert sock.read_nowait() is None


def test_a_refused_read_is_buffered_and_called_back_as_without_a_take() -> None:
    sock, noted = SocketStream(READ_LIMIT), _Noted(False)
    sock.on_data(noted.callback, noted.take)
    sock.data_received(b"abc")
    assert noted.offered == [b"abc"]
    assert noted.called == 1
    assert sock.pending
    # Buffered bytes go first: the next read is not offered, it waits behind them.
    noted.answer = True
    sock.data_received(b"def")
    assert noted.offered == [b"abc"]
    assert noted.called == 2
    assert sock.read_nowait() == b"abcdef"
    sock.data_received(b"g")
    assert noted.offered == [b"abc", b"g"]
    assert noted.called == 2


def test_no_take_after_on_data_none_or_without_one() -> None:
    sock, noted = SocketStream(READ_LIMIT), _Noted(True)
    sock.on_data(noted.callback, noted.take)
    sock.on_data(None)
    sock.data_received(b"abc")
    sock.on_data(noted.callback)
    sock.data_received(b"def")
    assert noted.offered == []
    assert noted.called == 1
    assert sock.read_nowait() == b"abcdef"


def test_the_watchs_clock_is_the_loops() -> None:
    async def run() -> None:
        watch = IdleWatch(5.0)
        assert watch.clock == asyncio.get_running_loop().time
        before = watch.last
        await asyncio.sleep(0.002)
        watch.touch()
        assert watch.last > before

    asyncio.run(run())


# -- FrontSplice against f667209's ---------------------------------------------------------------


class _F667209FrontSplice(_Ebcf73bSplice):
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
        # _over, not _done.done() (a method call a request: a client's read): the same here,
        # where only _finish completes _done (_until_done never awaits it, so its cancelling
        # does not cancel _done).
        if stream is None or self._over:
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


PROBE = 0.2
"""The splices' CREDIT_PROBE in the generated test (patched in both, old and new)."""

WINDOW = 64 * 1024
"""The target's stream window: a stalled target stops the client's upload soon."""

Op = tuple[Any, ...]
_OPS = st.one_of(
    st.tuples(st.just("up"), st.integers(1, 3000)),
    st.tuples(st.just("up"), st.integers(1, 40)),
    st.tuples(st.just("bulk"), st.integers(LEND_FROM, 3 * LEND_FROM)),
    st.tuples(st.just("down"), st.integers(1, 2000)),
    st.tuples(st.sampled_from(["stall", "go", "wait", "upeof", "reset"])),
)


async def _front(cls: type[Any], ops: list[Op]) -> tuple[Any, ...]:
    """A real client at a front (its :class:`SocketStream`) spliced by ``cls`` to a tunnel
    stream whose target reads what comes up unless stalled, and answers when told."""
    got: list[TunnelStream] = []
    up = bytearray()
    reading = asyncio.Event()
    reading.set()

    async def on_open(stream: TunnelStream) -> None:
        stream.accept()
        got.append(stream)
        with contextlib.suppress(StreamClosedError):
            while True:
                await reading.wait()
                data = await stream.read()
                if not data:
                    break
                up.extend(data)
            await asyncio.sleep(WAIT * 4)  # open for what goes down after the client's EOF

    config = SessionConfig(wire=WireConfig(initial_stream_window=WINDOW, max_stream_window=WINDOW))
    loop = asyncio.get_running_loop()
    async with (
        tunnel(on_open, edge_config=config, cloud_config=config) as t,
        accepting("socketstream") as (port, accepted),
    ):
        client = socket.socket()
        client.connect(("127.0.0.1", port))
        client.setblocking(False)
        sock, _ = await asyncio.wait_for(accepted.get(), WAIT)
        assert type(sock) is SocketStream
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        splice = cls(sock, None)
        splice.splice(stream, b"", b"")
        waiter = asyncio.create_task(splice.wait())
        while not got:
            await asyncio.sleep(0.001)
        target = got[0]
        sent = bytearray()
        down = bytearray()
        received = bytearray()
        writes: list[asyncio.Task[None]] = []
        shut = reset = False

        def read() -> None:
            with contextlib.suppress(BlockingIOError):
                while data := client.recv(1 << 16):
                    received.extend(data)

        for op in ops:
            kind = op[0]
            if kind in ("up", "bulk") and not shut and not reset:
                data = bytes([len(sent) % 251]) * op[1]
                sent.extend(data)
                await asyncio.wait_for(loop.sock_sendall(client, data), WAIT)
            elif kind == "down" and not reset:
                chunk = bytes([len(down) % 251]) * op[1]
                down.extend(chunk)
                with contextlib.suppress(StreamClosedError):
                    writes.append(asyncio.create_task(target.write(chunk)))
            elif kind == "stall":
                reading.clear()
            elif kind == "go":
                reading.set()
            elif kind == "upeof" and not shut and not reset:
                client.shutdown(socket.SHUT_WR)
                shut = True
            elif kind == "reset" and not reset:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                reset = True
            read() if not reset else None
            await asyncio.sleep(0.003 if kind != "wait" else CREDIT_PROBE * 1.5)
        reading.set()
        if not reset:
            async with asyncio.timeout(WAIT):
                while len(up) < len(sent) or len(received) < len(down):
                    read()
                    await asyncio.sleep(0.002)
            if not shut:
                client.shutdown(socket.SHUT_WR)
            with contextlib.suppress(StreamClosedError):
                await asyncio.wait_for(asyncio.gather(*writes), WAIT)
                target.write_eof()
        result = await asyncio.wait_for(waiter, WAIT)
        await asyncio.gather(*writes, return_exceptions=True)
        if not reset:
            client.close()
        return (
            bytes(up) == bytes(sent) if not reset else bytes(up) == bytes(sent[: len(up)]),
            len(up) if not reset else None,
            bytes(received) == bytes(down) if not reset else None,
            result.bytes_up if not reset else None,
            result.bytes_down if not reset else None,
            bool(result.error),
            result.idle,
        )


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_OPS, min_size=1, max_size=10))
@example([("up", 100), ("down", 50), ("up", 7), ("down", 9)])
@example([("stall",), ("bulk", 3 * LEND_FROM), ("up", 5), ("up", 6), ("wait",), ("go",)])
@example([("stall",), ("bulk", 2 * LEND_FROM), ("up", 5), ("reset",)])
@example([("up", 3), ("upeof",), ("down", 4)])
@example([("stall",), ("up", 3000)] + [("up", 3000)] * 25 + [("go",), ("up", 1)])
def test_the_fronts_splice_passes_on_as_f667209s_did(ops: list[Op]) -> None:
    async def both() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return await _front(_F667209FrontSplice, ops), await _front(FrontSplice, ops)

    # Both splices look at the client's socket every PROBE seconds, not CREDIT_PROBE's 2, and a
    # "wait" op is 1.5 probes: the same interleavings, each "wait" 0.3 s instead of 3 s.
    with pytest.MonkeyPatch.context() as patch:
        for module in (relay_module, front_splice_module, sys.modules[__name__]):
            patch.setattr(module, "CREDIT_PROBE", PROBE)
        old, new = asyncio.run(both())
    assert new == old
    assert new[0] is True


def test_a_small_request_and_its_answer_make_no_read_of_the_socket() -> None:
    """The cut itself: each small request is taken as it comes; ``read_chunk_nowait`` only at
    the client's EOF, not a read (and a second finding nothing) a request."""
    reads: list[int] = []

    class Counting(SocketStream):
        __slots__ = ()

        def read_chunk_nowait(self, n: int = -1) -> bytes | memoryview | None:
            reads.append(n)
            return super().read_chunk_nowait(n)

    assert asyncio.run(_one_by_one(Counting)) == [b"x%d" % i for i in range(20)]
    assert len(reads) <= 2  # the EOF (and a start that found nothing), not 40


async def _one_by_one(sock_class: type[SocketStream]) -> list[bytes]:
    async def echo(stream: TunnelStream) -> None:
        stream.accept()
        with contextlib.suppress(StreamClosedError):
            while data := await stream.read():
                await stream.write(data)
            stream.write_eof()
            await stream.read()

    loop = asyncio.get_running_loop()
    accepted: asyncio.Queue[SocketStream] = asyncio.Queue()

    def made() -> SocketStream:
        sock = sock_class(READ_LIMIT)
        accepted.put_nowait(sock)
        return sock

    server = await loop.create_server(made, "127.0.0.1", 0)
    answers: list[bytes] = []
    try:
        async with tunnel(echo) as t:
            client = socket.create_connection(server.sockets[0].getsockname()[:2])
            client.setblocking(False)
            sock = await asyncio.wait_for(accepted.get(), WAIT)
            stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
            splice = FrontSplice(sock, 30.0)
            splice.splice(stream)
            waiter = asyncio.create_task(splice.wait())
            for i in range(20):
                request = b"x%d" % i
                await loop.sock_sendall(client, request)
                answers.append(await asyncio.wait_for(loop.sock_recv(client, 100), WAIT))
            client.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(loop.sock_recv(client, 100), WAIT) == b""
            result = await asyncio.wait_for(waiter, WAIT)
            assert not result.error
            assert result.bytes_up == result.bytes_down == sum(len(a) for a in answers)
            client.close()
    finally:
        server.close()
        await server.wait_closed()
    return answers


def test_lending_still_starts_at_a_large_read_with_a_take() -> None:
    """A read past LEND_FROM is refused by the splice's take (bulk goes by the sender), so the
    socket switches to lending as before."""

    async def run() -> bool:
        loop = asyncio.get_running_loop()
        accepted: asyncio.Queue[SocketStream] = asyncio.Queue()

        def made() -> SocketStream:
            sock = SocketStream(READ_LIMIT)
            accepted.put_nowait(sock)
            return sock

        server = await loop.create_server(made, "127.0.0.1", 0)
        try:

            async def sink(stream: TunnelStream) -> None:
                stream.accept()
                with contextlib.suppress(StreamClosedError):
                    while await stream.read():
                        pass
                    stream.write_eof()
                    await stream.read()

            async with tunnel(sink) as t:
                client = socket.create_connection(server.sockets[0].getsockname()[:2])
                client.setblocking(False)
                sock = await asyncio.wait_for(accepted.get(), WAIT)
                stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
                splice = FrontSplice(sock, None)
                splice.splice(stream)
                waiter = asyncio.create_task(splice.wait())
                await loop.sock_sendall(client, b"s")
                await loop.sock_sendall(client, b"b" * (4 * LEND_FROM))
                client.shutdown(socket.SHUT_WR)
                result = await asyncio.wait_for(waiter, WAIT)
                client.close()
                assert result.bytes_up == 1 + 4 * LEND_FROM
                return type(sock._lend) is Lender
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(run())
