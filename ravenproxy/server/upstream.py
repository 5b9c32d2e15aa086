"""What a front talks to after routing: a byte stream to the target, however it is carried.

Three carriers share one small interface (:class:`ByteStream`): a tunnel stream through an agent,
a TCP connection the server dialled itself (a target in its own gateway), and TLS re-originated
to a kubelet on top of either (an :class:`ssl.SSLObject` over memory BIOs, because a tunnel
stream is not a socket). :func:`splice` copies both ways between a client socket and one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Protocol

from ravenproxy.transport.relay import (
    IDLE_ERROR,
    READ_LIMIT,
    IdleTimeout,
    IdleWatch,
    RelayResult,
    relay,
)
from ravenproxy.transport.session import StreamClosedError, TunnelStream


class ByteStream(Protocol):
    async def read(self) -> bytes:
        """The next bytes; ``b""`` once the peer half-closed."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def write_eof(self) -> None: ...

    def close(self) -> None:
        """Done: release everything. Idempotent."""
        ...


class TunnelByteStream:
    """A :class:`TunnelStream` through an agent."""

    def __init__(self, stream: TunnelStream) -> None:
        self.stream = stream

    async def read(self) -> bytes:
        return await self.stream.read()

    async def write(self, data: bytes) -> None:
        await self.stream.write(data)

    async def write_eof(self) -> None:
        self.stream.write_eof()

    def close(self) -> None:
        self.stream.close()


class SocketByteStream:
    """A TCP connection the server opened itself."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def read(self) -> bytes:
        return await self.reader.read(READ_LIMIT)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def write_eof(self) -> None:
        if self.writer.can_write_eof() and not self.writer.is_closing():
            self.writer.write_eof()

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.transport.abort()


class TlsError(ConnectionError):
    """The TLS handshake with the target failed; the message says why."""


class TlsByteStream:
    """Client-side TLS over another byte stream (re-originated TLS to a kubelet)."""

    def __init__(self, inner: ByteStream, ctx: ssl.SSLContext, server_hostname: str) -> None:
        self.inner = inner
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._tls = ctx.wrap_bio(
            self._in, self._out, server_side=False, server_hostname=server_hostname
        )
        self._eof = False

    async def handshake(self) -> None:
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as exc:
                raise TlsError(f"certificate verify failed: {exc.verify_message}") from None
            except ssl.SSLError as exc:
                raise TlsError(f"TLS handshake failed: {exc.reason or exc}") from None
            await self._flush()
            if not await self._fill():
                raise TlsError("the target closed the connection during the TLS handshake")
        await self._flush()

    async def _flush(self) -> None:
        data = self._out.read()
        if data:
            await self.inner.write(data)

    async def _fill(self) -> bool:
        data = await self.inner.read()
        if not data:
            self._in.write_eof()
            return False
        self._in.write(data)
        return True

    async def read(self) -> bytes:
        while True:
            if self._eof:
                return b""
            try:
                data = self._tls.read(READ_LIMIT)
            except ssl.SSLWantReadError:
                await self._flush()
                await self._fill()
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                # close_notify, or a TCP close without one: either way the peer is done.
                self._eof = True
                return b""
            except ssl.SSLError as exc:
                raise ConnectionError(f"TLS: {exc.reason or exc}") from None
            await self._flush()
            if not data:
                self._eof = True
            return data

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = self._tls.write(view)
            except ssl.SSLError as exc:
                raise ConnectionError(f"TLS: {exc.reason or exc}") from None
            view = view[n:]
        await self._flush()

    async def write_eof(self) -> None:
        # close_notify is TLS's half-close; the TCP side stays open for the peer's answer.
        with contextlib.suppress(ssl.SSLError):
            self._tls.unwrap()
        with contextlib.suppress(ConnectionError, StreamClosedError):
            await self._flush()

    def close(self) -> None:
        self.inner.close()


async def splice(
    upstream: ByteStream,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    initial_up: bytes = b"",
    initial_down: bytes = b"",
    idle_timeout: float | None = None,
) -> RelayResult:
    """Copy client ⇄ upstream until both sides finished (half-close carried) or either failed,
    or no byte moved either way for ``idle_timeout`` seconds (``idle`` set in the result).
    Closes both. The result's ``error`` is "" or what failed."""
    if isinstance(upstream, TunnelByteStream) and not initial_down:
        return await relay(
            upstream.stream, reader, writer, initial=initial_up, idle_timeout=idle_timeout
        )
    result = RelayResult()
    watch = IdleWatch(idle_timeout)

    async def up() -> None:
        if initial_up:
            await upstream.write(initial_up)
        while data := await reader.read(READ_LIMIT):
            watch.touch()
            await upstream.write(data)
            result.bytes_up += len(data)
        await upstream.write_eof()

    async def down() -> None:
        if initial_down:
            writer.write(initial_down)
            await writer.drain()
        while data := await upstream.read():
            watch.touch()
            writer.write(data)
            result.bytes_down += len(data)
            await writer.drain()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()

    # A TLS client connection has no half-close: once the target is done, the relay is.
    half_close = writer.can_write_eof()
    down_task = asyncio.create_task(down(), name="splice-down")
    tasks = {asyncio.create_task(up(), name="splice-up"), down_task}
    try:
        pending = tasks
        async with watch:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = [exc for t in done if (exc := t.exception()) is not None]
                if failed:
                    result.error = repr(failed[0])
                if failed or (down_task in done and not half_close):
                    for t in pending:
                        t.cancel()
                    await asyncio.gather(*pending, return_exceptions=True)
                    break
    except IdleTimeout:
        result.error, result.idle = IDLE_ERROR, True
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        upstream.close()
        if result.error:
            writer.transport.abort()
        else:
            writer.close()
    return result
