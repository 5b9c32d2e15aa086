"""The agent's splice of a tunnel stream to a dialled socket (real sessions over a loopback
WebSocket, real target sockets): data both ways past the flow-control window, half-close
carried both ways, what the target sent before the stream was accepted, and how a reset on
either side ends the other."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from ravenproxy.transport.relay import RelayResult
from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.transport.splice import Splice
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import Target
from tests.unit.transport.test_session import WAIT, tunnel

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def spliced(handler: Handler) -> AsyncIterator[tuple[TunnelStream, list[RelayResult]]]:
    """A cloud-side stream whose edge end is spliced to a connection to ``handler``'s server
    (as the agent serves one); the splice's results once it ended."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    results: list[RelayResult] = []

    async def on_open(stream: TunnelStream) -> None:
        loop = asyncio.get_running_loop()
        _, splice = await loop.create_connection(Splice, "127.0.0.1", port)
        stream.accept()
        splice.start(stream)
        results.append(await splice.wait())

    try:
        async with tunnel(on_open) as pair:
            stream = await pair.cloud.open_stream(Target("edge-1", "127.0.0.1", port))
            try:
                yield stream, results
            finally:
                stream.close()
    finally:
        server.close()
        await server.wait_closed()


async def read_all(stream: TunnelStream) -> bytes:
    out = bytearray()
    while chunk := await asyncio.wait_for(stream.read(), WAIT):
        out += chunk
    return bytes(out)


async def ended(results: list[RelayResult]) -> RelayResult:
    for _ in range(250):
        if results:
            return results[0]
        await asyncio.sleep(0.02)
    raise AssertionError("the splice did not end")


async def test_bulk_both_ways_past_the_window_with_half_close() -> None:
    """8 MiB up to the target and its digest plus 8 MiB back (more than a stream window each
    way): every byte arrives in order, the client's EOF reaches the target, whose answer after
    it still comes back, and the splice ends cleanly."""
    payload = os.urandom(8 << 20)

    async def digest_then_send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        h = hashlib.sha256()
        while data := await reader.read(1 << 16):
            h.update(data)
        writer.write(h.digest() + payload)
        await writer.drain()
        writer.close()

    async with spliced(digest_then_send) as (stream, results):
        await stream.write(payload)
        stream.write_eof()
        answer = await read_all(stream)
        assert answer[:32] == hashlib.sha256(payload).digest()
        assert answer[32:] == payload
        result = await ended(results)
        assert result.error == ""
        assert (result.bytes_up, result.bytes_down) == (len(payload) + 32, len(payload))


async def test_small_requests_on_a_kept_stream() -> None:
    """Many small request/answer turns on one stream (the keep-alive GET case)."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data.upper())
        writer.close()

    async with spliced(echo) as (stream, _):
        for i in range(200):
            await stream.write(b"ping %d" % i)
            assert await asyncio.wait_for(stream.read(), WAIT) == b"PING %d" % i


async def test_what_the_target_sends_first_arrives() -> None:
    """A target that speaks first (a banner, sent before the stream is accepted) and closes."""

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-banner\r\n")
        writer.close()

    async with spliced(banner) as (stream, results):
        assert await read_all(stream) == b"SSH-2.0-banner\r\n"
        stream.write_eof()
        assert (await ended(results)).error == ""


async def test_target_reset_resets_the_stream() -> None:
    async def resetting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST

    async with spliced(resetting) as (stream, results):
        await stream.write(b"x")
        with pytest.raises(StreamClosedError):
            await read_all(stream)
        assert (await ended(results)).error.startswith("socket: ")


async def test_stream_reset_closes_the_target_connection() -> None:
    closed = asyncio.get_running_loop().create_future()

    async def waiting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            closed.set_result(await reader.read())
        except ConnectionError as exc:
            closed.set_result(exc)
        writer.close()

    async with spliced(waiting) as (stream, results):
        await stream.write(b"")  # nothing: the target waits
        stream.reset()
        assert await asyncio.wait_for(closed, WAIT) in (b"", ConnectionResetError())
        assert (await ended(results)).error != ""


async def test_stream_reset_ends_the_splice_while_the_target_reads_nothing() -> None:
    """The stream is reset while the target reads nothing (the splice's socket writes are
    paused, the stream's window full: a client gave up on an upload to a stuck target). The
    splice must end and close the target connection at once, not when the target reads."""
    release = asyncio.get_running_loop().create_future()
    seen: asyncio.Future[bytes | Exception] = asyncio.get_running_loop().create_future()

    async def stuck(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release  # reads nothing until the test is done
        try:
            while await reader.read(1 << 20):
                pass
            seen.set_result(b"")
        except ConnectionError as exc:
            seen.set_result(exc)
        writer.close()

    async with spliced(stuck) as (stream, results):
        block = b"u" * (1 << 16)
        sent = 0

        async def upload() -> None:
            nonlocal sent
            while True:
                await stream.write(block)
                sent += len(block)

        uploader = asyncio.create_task(upload())
        try:
            # Until every buffer on the way is full: the upload stops moving.
            for _ in range(250):
                before = sent
                await asyncio.sleep(0.1)
                if sent == before and sent:
                    break
            else:
                raise AssertionError("the upload never stalled")
            stream.reset()
            with pytest.raises(StreamClosedError):
                await uploader
            try:
                result = await ended(results)
            finally:
                release.set_result(None)
            assert result.error != ""
            # Closed, not left open: the target, reading now, comes to its end.
            end = await asyncio.wait_for(seen, WAIT)
            assert end == b"" or isinstance(end, ConnectionResetError), end
        finally:
            uploader.cancel()
            await asyncio.gather(uploader, return_exceptions=True)
            if not release.done():
                release.set_result(None)


async def test_stream_reset_after_its_end_ends_the_splice() -> None:
    """The cloud side half-closed (the target got its EOF) and the target answers nothing and
    keeps its half open; then the stream is reset. The splice must end with it, not wait for
    the target to close."""
    got_eof = asyncio.get_running_loop().create_future()
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got_eof.set_result(await reader.read())
        await release.wait()  # sends nothing, closes nothing
        writer.close()

    async with spliced(silent) as (stream, results):
        try:
            await stream.write(b"request")
            stream.write_eof()
            assert await asyncio.wait_for(got_eof, WAIT) == b"request"
            stream.reset()
            assert (await ended(results)).error != ""
        finally:
            release.set()


class _Stream:
    """What a splice asks of its stream, counting reads: chunks fed one by one (each calls
    the splice back, as :meth:`TunnelStream._feed` does), the end, no error."""

    id = 1
    closed = False

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.reads = 0
        self.callback: Callable[[], None] | None = None
        self.take: Callable[[bytes], bool] | None = None

    def on_readable(
        self, callback: Callable[[], None] | None, take: Callable[[bytes], bool] | None = None
    ) -> None:
        self.callback, self.take = callback, take

    def feed(self, chunk: bytes) -> None:
        if chunk and self.take is not None and not self.chunks:
            self.reads += 1  # offered as it comes: a look at it, as a read is
            if self.take(chunk):
                return
        if chunk:
            self.chunks.append(chunk)
        else:
            self.eof = True
        if self.callback is not None:
            self.callback()

    def read_nowait(self) -> bytes | None:
        self.reads += 1
        if self.chunks:
            return self.chunks.pop(0)
        return b"" if self.eof else None


class _Socket:
    """A dialled socket's transport that keeps what is written and can half-close."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.eof = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return False

    def write_eof(self) -> None:
        self.eof = True


async def test_a_chunk_the_stream_calls_back_for_is_read_once_and_a_backlog_is_drained() -> None:
    """Called back by its stream for a chunk, the splice reads it and stops (one read, not a
    second to find nothing); what arrived while the socket took nothing (paused) and before
    ``start``, the end among it, is all passed on when the socket takes bytes again."""
    splice, stream, sock = Splice(), _Stream(), _Socket()
    splice.transport = sock  # type: ignore[assignment]
    stream.feed(b"early")  # before start: held by the stream
    splice.start(stream)  # type: ignore[arg-type]
    assert sock.written == [b"early"]
    stream.reads = 0
    for chunk in (b"GET /a", b"GET /b"):
        stream.feed(chunk)
    assert sock.written == [b"early", b"GET /a", b"GET /b"]
    assert stream.reads == 2  # one a chunk
    splice.pause_writing()
    for chunk in (b"one", b"two", b""):
        stream.feed(chunk)
    assert sock.written[3:] == [] and not sock.eof
    splice.resume_writing()
    assert sock.written[3:] == [b"one", b"two"] and sock.eof


class _FailingStream(_Stream):
    """:class:`_Stream` that can also fail as a reset one does: what it holds is dropped
    (:meth:`TunnelStream._fail`), each later read raises, and it calls back."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False  # type: ignore[misc]

    def fail(self) -> None:
        self.closed = True  # type: ignore[misc]
        self.chunks.clear()
        if self.callback is not None:
            self.callback()

    def read_nowait(self) -> bytes | None:
        if self.closed and not self.chunks:
            self.reads += 1
            raise StreamClosedError(ErrorCode.CANCEL, "reset by the peer")
        return super().read_nowait()


async def test_the_end_or_an_error_right_after_a_chunk_follows_it() -> None:
    """A chunk then the stream's end, called back one after the other while the socket takes
    bytes (one tunnel message carried both): the chunk is written, then the EOF. A chunk then a
    reset: the chunk is written, and the splice ends with the error."""
    splice, stream, sock = Splice(), _FailingStream(), _Socket()
    splice.transport = sock  # type: ignore[assignment]
    splice.start(stream)  # type: ignore[arg-type]
    stream.feed(b"last answer")
    stream.feed(b"")
    assert sock.written == [b"last answer"] and sock.eof
    assert not splice._done.done()  # the target's half goes on

    splice, stream, sock = Splice(), _FailingStream(), _Socket()
    splice.transport = sock  # type: ignore[assignment]
    splice.start(stream)  # type: ignore[arg-type]
    stream.feed(b"partial")
    stream.fail()
    assert sock.written == [b"partial"] and not sock.eof
    assert splice._done.done() and "reset by the peer" in splice.result.error


async def test_a_reset_while_chunks_are_held_ends_the_splice() -> None:
    """Chunks held while the socket takes nothing, then the stream is reset: the splice ends
    at once (the held chunks are the stream's to drop), not when the socket drains."""
    splice, stream, sock = Splice(), _FailingStream(), _Socket()
    splice.transport = sock  # type: ignore[assignment]
    splice.start(stream)  # type: ignore[arg-type]
    splice.pause_writing()
    stream.feed(b"held")
    assert sock.written == []
    stream.fail()
    assert splice._done.done() and "reset by the peer" in splice.result.error
    splice.resume_writing()  # the socket drains later: nothing more is read or written
    assert sock.written == []
