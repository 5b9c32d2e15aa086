"""A server front's client socket spliced to a tunnel stream by callbacks.

The server splices its front's client to a tunnel stream as the agent splices its dialled socket
(:class:`~ravenproxy.transport.splice.Splice`) after a CONNECT, a 101 or an SNI passthrough
(:func:`splice_or_relay`; kube-apiserver's egress: every ``kubectl logs`` and ``exec``):
:class:`FrontSplice`. There the front's
:class:`~ravenproxy.transport.socket_stream.SocketStream` stays the socket's protocol (it holds
what was read before, and lends a bulk upload's reads without a copy) and calls back; the splice
takes its bytes from it while nothing waits to go up (a small read as it comes, unbuffered:
``on_data``'s ``take``; the rest waits in the stream's buffer, which stops reading the socket
past its bound, as under :func:`relay`). It keeps the relay's
clocks too: ``--idle-timeout`` (:class:`~ravenproxy.transport.relay.IdleWatch`; a client that
takes its bytes however slowly is not idle, :class:`~ravenproxy.transport.idle.Taken`), and a client
gone while its upload waits for credit, or after its half-close while the target has not
answered, noticed within :data:`~ravenproxy.transport.relay.CREDIT_PROBE` seconds
(:func:`~ravenproxy.transport.relay.client_gone`). Against :func:`relay`, a small request and
its answer wake no task of their own (the relay's direction tasks were two wake-ups and an event
loop turn per request on the server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from ravenproxy.transport.bytestream import READ_LIMIT, ByteStream, TunnelByteStream
from ravenproxy.transport.idle import Taken
from ravenproxy.transport.lender import LEND_FROM, LEND_IDLE
from ravenproxy.transport.relay import (
    CREDIT_PROBE,
    IdleWatch,
    RelayResult,
    client_gone,
    relay,
    tune,
)
from ravenproxy.transport.socket_stream import SocketReader, SocketStream, SocketWriter
from ravenproxy.transport.splice import Splice
from ravenproxy.transport.tunnel_stream import TunnelStream


class FrontSplice(Splice):
    """A server front's client socket (its :class:`SocketStream`, which calls back) spliced
    to a tunnel stream (:meth:`splice`), with the relay's idle timeout and client checks.
    Await :meth:`wait` for the end; it closes both."""

    __slots__ = ("_sock", "_taken")

    def __init__(self, sock: SocketStream, idle_timeout: float | None) -> None:
        super().__init__()
        self._sock = sock
        self._watch = watch = IdleWatch(idle_timeout)
        self._taken = Taken(sock.transport, watch)
        """What the client takes once its writing paused: however slowly, it is not idle."""
        self.transport = sock.transport
        tune(sock.transport)
        self._write_paused = False
        if sock.write_paused:
            self.pause_writing()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._taken.waiting()  # the client's drain: what it takes is looked at (idle.Taken)

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
        sock.on_data(self._pull, self._offer)
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

    def _offer(self, data: bytes) -> bool:
        """The socket's bytes as they come, while it buffers none (its ``take``): up at once
        as :meth:`_pull` would send them, not buffered and read back (two reads a request,
        the second finding nothing). False where :meth:`_pull` would not send them now
        (nothing started, the end, bytes or a sender waiting to go up) or would queue them
        (bulk): they are buffered and :meth:`_pull` is called, as without it. Runs in a
        callback: nothing may escape."""
        stream = self.stream
        if (
            stream is None
            or self._over
            or self._pending
            or self._sender is not None
            or self._up_eof
            or len(data) >= LEND_FROM
        ):
            return False
        try:
            self._give(stream, data)
        except Exception as exc:
            self._fail_socket(exc)
        return True

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
        self._taken.stop()
        self._sock.on_data(None)
        self._sock.on_writing(None)
        await super()._close()


def splice_or_relay(
    upstream: ByteStream,
    reader: SocketReader,
    writer: SocketWriter,
    *,
    initial_up: bytes = b"",
    initial_down: bytes = b"",
    idle_timeout: float | None = None,
) -> Coroutine[Any, Any, RelayResult]:
    """:func:`relay` a server front's client to ``upstream`` — by callbacks
    (:class:`FrontSplice`) when it is a tunnel stream and the client's socket a
    :class:`SocketStream`. Await it (it closes both ends)."""
    if type(upstream) is TunnelByteStream and type(reader) is SocketStream and reader is writer:
        splice = FrontSplice(reader, idle_timeout)
        splice.splice(upstream.stream, initial_up, initial_down)
        return splice.wait()
    return relay(
        upstream,
        reader,
        writer,
        initial_up=initial_up,
        initial_down=initial_down,
        idle_timeout=idle_timeout,
    )
