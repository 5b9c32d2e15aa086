"""One byte-stream interface over the carriers a relayed connection can have.

Three carriers share :class:`ByteStream`: a tunnel stream (:class:`TunnelByteStream`), a TCP
connection (:class:`SocketByteStream`), and client-side TLS on top of either
(:class:`TlsByteStream`: an :class:`ssl.SSLObject` over memory BIOs, because a tunnel stream is
not a socket). :func:`ravenproxy.transport.relay.relay` copies between a socket and any of them;
:meth:`ByteStream.writable` is what makes that copy credit-driven for tunnel streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Coroutine
from typing import Any, Protocol

from ravenproxy.errors import RavenProxyError
from ravenproxy.transport.idle import Taken
from ravenproxy.transport.socket_stream import SocketReader, SocketStream, SocketWriter
from ravenproxy.transport.tunnel_stream import StreamClosedError, TunnelStream
from ravenproxy.wire.codes import ErrorCode

READ_LIMIT = 1024 * 1024
"""Largest single read from a socket; also the StreamReader buffer limit we open sockets with."""


async def open_connection(host: str, port: int) -> tuple[SocketStream, SocketStream]:
    """Connect to ``host:port``: the connection's reader and writer, one :class:`SocketStream`
    (READ_LIMIT its buffer limit) rather than asyncio's reader, writer and protocol — fewer
    objects per dialled connection and less work per read and write."""
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(lambda: SocketStream(READ_LIMIT), host, port)
    return stream, stream


class ByteStream(Protocol):
    async def read(self) -> bytes | memoryview:
        """The next bytes; ``b""`` once the peer half-closed."""
        ...

    async def write(self, data: bytes | memoryview) -> None:
        """Write ``data`` (a view may be taken by reference: it must not change meanwhile)."""
        ...

    async def writable(self) -> int:
        """Wait until bytes may be written without queueing; how many (a tunnel stream's
        credit, otherwise :data:`READ_LIMIT`)."""
        ...

    def room(self) -> int:
        """What :meth:`writable` would return now; 0 if it would wait."""
        ...

    async def write_eof(self) -> None: ...

    def abort(self, reason: str) -> None:
        """Give up on the stream (a tunnel stream is reset with ``reason``)."""
        ...

    def close(self) -> None:
        """Done: release everything. Idempotent."""
        ...


class TunnelByteStream:
    """A :class:`TunnelStream` through an agent (or, on the agent, from the server).

    ``read``, ``write`` and ``writable`` hand out the stream's own coroutines rather than
    awaiting them in one of their own: an idle relay waits in ``read``, and a frame less per
    waiting stream is memory an idle connection does not hold."""

    __slots__ = ("stream",)

    def __init__(self, stream: TunnelStream) -> None:
        self.stream = stream

    def read(self) -> Coroutine[Any, Any, bytes | memoryview]:
        return self.stream.read()

    def write(self, data: bytes | memoryview) -> Coroutine[Any, Any, None]:
        return self.stream.write(data)

    def writable(self) -> Coroutine[Any, Any, int]:
        return self.stream.writable()

    def room(self) -> int:
        return self.stream.room()

    async def write_eof(self) -> None:
        self.stream.write_eof()

    def abort(self, reason: str) -> None:
        self.stream.reset(ErrorCode.CANCEL, reason)

    def close(self) -> None:
        self.stream.close()


class SocketByteStream:
    """A TCP connection (one the server or the agent dialled)."""

    __slots__ = ("reader", "taken", "writer")

    def __init__(self, reader: SocketReader, writer: SocketWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.taken: Taken | None = None
        """The relay's look at what the target takes (set by the relay): a target that takes
        the upload however slowly is not idle (:class:`~ravenproxy.transport.idle.Taken`)."""

    async def read(self) -> bytes:
        return await self.reader.read(READ_LIMIT)

    async def write(self, data: bytes | memoryview) -> None:
        self.writer.write(data)
        if self.taken is None:
            await self.writer.drain()
        else:
            await self.taken.drain(self.writer)

    async def writable(self) -> int:
        return READ_LIMIT  # drain() after each write is the backpressure

    def room(self) -> int:
        return READ_LIMIT

    async def write_eof(self) -> None:
        if self.writer.can_write_eof() and not self.writer.is_closing():
            self.writer.write_eof()

    def abort(self, reason: str) -> None:
        self.close()

    def close(self) -> None:
        if self.taken is not None:
            self.taken.stop()
        if not self.writer.is_closing():
            self.writer.transport.abort()


class TlsError(RavenProxyError, ConnectionError):
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
        self._held = b""
        """Plaintext :meth:`absorb` took in, for the next :meth:`read`."""

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
        if self._held:
            data, self._held = self._held, b""
            return data
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

    @property
    def held(self) -> bytes:
        """The plaintext :meth:`absorb` took in that waits for the next :meth:`read`; ``b""``
        when it is empty lines alone (they begin no message: the next answer's parse skips
        them)."""
        return self._held if self._held.strip(b"\r\n") else b""

    def absorb(self, data: bytes | memoryview) -> bool:
        """Bytes the inner stream got while no answer is awaited (a kept connection between
        requests), taken into TLS now: True when TLS ended with them — the peer's close_notify
        (its TCP side may stay open a while: asyncio's waits for ours) or a TLS error. Their
        plaintext, if any, waits for the next :meth:`read`."""
        try:
            self._in.write(data)
            while plain := self._tls.read(READ_LIMIT):
                self._held += plain
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError:  # close_notify (SSLZeroReturnError) or a broken session
            pass
        self._eof = True
        return True

    async def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            try:
                n = self._tls.write(view)
            except ssl.SSLError as exc:
                raise ConnectionError(f"TLS: {exc.reason or exc}") from None
            view = view[n:]
        await self._flush()

    async def writable(self) -> int:
        # The records carry a little more than the plaintext: the inner write waits for that.
        return await self.inner.writable()

    def room(self) -> int:
        return self.inner.room()

    async def write_eof(self) -> None:
        # close_notify is TLS's half-close; the TCP side stays open for the peer's answer.
        with contextlib.suppress(ssl.SSLError):
            self._tls.unwrap()
        with contextlib.suppress(ConnectionError, StreamClosedError):
            await self._flush()

    def abort(self, reason: str) -> None:
        self.inner.abort(reason)

    def close(self) -> None:
        self.inner.close()
