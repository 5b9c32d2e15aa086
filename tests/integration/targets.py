"""In-process TCP targets on loopback for the tunnel tests; each closes all it opened."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def tcp_server(handler: Handler, host: str = "127.0.0.1") -> AsyncIterator[int]:
    writers: set[asyncio.StreamWriter] = set()

    async def wrapped(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writers.discard(writer)
            writer.close()

    server = await asyncio.start_server(wrapped, host, 0, limit=256 * 1024, backlog=4096)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for w in list(writers):
            w.transport.abort()
        await server.wait_closed()


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(256 * 1024):
        writer.write(data)
        await writer.drain()
    writer.write_eof()


async def hash_sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read to EOF (the client's half-close), answer ``<sha256> <size>\\n``."""
    digest = hashlib.sha256()
    size = 0
    while data := await reader.read(1 << 20):
        digest.update(data)
        size += len(data)
    writer.write(f"{digest.hexdigest()} {size}\n".encode())
    await writer.drain()


class Firehose:
    """Writes without end; counts what the socket accepted (for the stalled-reader test)."""

    def __init__(self) -> None:
        self.written = 0
        self.block = b"\xab" * 65536

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            writer.write(self.block)
            await writer.drain()
            self.written += len(self.block)
