"""A prototype memory-BIO TLS transport for bulk (benchmarks/tls_layer.py's ``membio`` rows): one
big ``recv_into`` (``recv_size``) into a reused buffer, ``MemoryBIO.write``, then
``SSLObject.read`` per record into the protocol's buffer; the way out, per ``recv_size`` bytes
written, ``SSLObject.write`` per record (OpenSSL's partial-write mode: one record per call, no
syscall), ``outgoing.read()``, one ``send``. Only what the benchmark needs: bulk one way,
BufferedProtocol reading, write flow control, the peer's close_notify, an abrupt close (no
close_notify of its own). Not the tunnel's transport (measured not to pay: benchmarks/README.md)."""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from typing import Any

RECV = 256 * 1024


async def handshake_bio(
    sock: socket.socket, ctx: ssl.SSLContext, *, server_side: bool, server_hostname: str | None
) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    loop = asyncio.get_running_loop()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=server_side, server_hostname=server_hostname)
    while True:
        try:
            obj.do_handshake()
            done = True
        except ssl.SSLWantReadError:
            done = False
        out = outgoing.read()
        if out:
            await loop.sock_sendall(sock, out)
        if done:
            return obj, incoming, outgoing
        data = await loop.sock_recv(sock, 65536)
        if not data:
            raise ConnectionResetError("EOF in handshake")
        incoming.write(data)


class MemBIOTransport(asyncio.Transport):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        obj: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        protocol: asyncio.BufferedProtocol,
        recv_size: int = RECV,
    ) -> None:
        super().__init__()
        self._loop, self._sock, self._fd = loop, sock, sock.fileno()
        self._obj = obj
        self._raw: Any = obj._sslobj  # type: ignore[attr-defined]
        self._in, self._out = incoming, outgoing
        self._protocol = protocol
        self._chunk = recv_size  # bytes received, or encrypted, per syscall at most
        self._rbuf = bytearray(recv_size)
        self._rview = memoryview(self._rbuf)
        self._cipher: collections.deque[memoryview] = collections.deque()
        self._queued = 0
        self._high, self._low = 64 * 1024, 16 * 1024
        self._paused = False
        self._writer = False
        self._closed = False
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._on_readable)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = high if high is not None else 64 * 1024
        self._low = low if low is not None else self._high // 4

    def get_write_buffer_size(self) -> int:
        return self._queued

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        for at in range(0, len(view), self._chunk):
            self._write_piece(view[at : at + self._chunk])
        if self._queued > self._high and not self._paused:
            self._paused = True
            self._protocol.pause_writing()

    def _write_piece(self, view: memoryview) -> None:
        write = self._raw.write
        while view:
            n = write(view)
            view = view[n:]
        out = self._out.read()
        if self._cipher:
            self._cipher.append(memoryview(out))
            self._queued += len(out)
            return
        try:
            sent = self._sock.send(out)
        except BlockingIOError:
            sent = 0
        if sent < len(out):
            self._cipher.append(memoryview(out)[sent:])
            self._queued += len(out) - sent
            if not self._writer:
                self._writer = True
                self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        queue, send = self._cipher, self._sock.send
        while queue:
            piece = queue[0]
            try:
                sent = send(piece)
            except BlockingIOError:
                break
            self._queued -= sent
            if sent < len(piece):
                queue[0] = piece[sent:]
                break
            queue.popleft()
        if not queue:
            self._writer = False
            self._loop.remove_writer(self._fd)
        if self._paused and self._queued <= self._low:
            self._paused = False
            self._protocol.resume_writing()

    def _on_readable(self) -> None:
        try:
            n = self._sock.recv_into(self._rbuf)
        except BlockingIOError:
            return
        if not n:
            self.close()
            return
        self._in.write(self._rview[:n])
        read, protocol = self._raw.read, self._protocol
        while True:
            view = memoryview(protocol.get_buffer(-1))
            size, got = len(view), 0
            try:
                while got < size:
                    n = read(size - got, view[got:] if got else view)
                    if not n:  # the peer's close_notify
                        size = -1
                        break
                    got += n
            except ssl.SSLWantReadError:
                pass
            finally:
                view.release()
            if got:
                protocol.buffer_updated(got)
            if size < 0:
                self.close()
                return
            if got < size:
                return

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        if self._writer:
            self._loop.remove_writer(self._fd)
        self._sock.close()
        self._loop.call_soon(self._protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self._closed
