"""In-process TCP targets on loopback for the tunnel tests; each closes all it opened."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.helpers import eventually

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def tcp_server(
    handler: Handler,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    tls: ssl.SSLContext | None = None,
) -> AsyncIterator[int]:
    """Serve ``handler`` on ``host:port`` (a free port by default; ``tls``: over TLS) while the
    block runs; yields the port. Each connection is closed when its handler returns (a peer
    gone meanwhile is no error), and those still open are aborted when the block ends, failing
    too."""
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

    server = await asyncio.start_server(
        wrapped, host, port, limit=256 * 1024, backlog=4096, ssl=tls
    )
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


class Pump:
    """A long-running stream through the tunnel: a chunk every 20 ms to an echo target, every
    byte checked on its way back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.echoed = 0
        self.task = asyncio.create_task(self._run(), name="test-pump")

    async def _run(self) -> None:
        n = 0
        while True:
            chunk = (f"{n:08d}" * 128).encode()  # 1 KiB, numbered
            self.writer.write(chunk)
            back = await asyncio.wait_for(self.reader.readexactly(len(chunk)), 10)
            assert back == chunk, f"chunk {n} came back altered"
            self.echoed += len(back)
            n += 1
            await asyncio.sleep(0.02)

    async def flowing(self, what: str) -> None:
        """More bytes come back from now on (and the pump has not failed)."""
        start = self.echoed
        await eventually(
            lambda: self._alive() and self.echoed > start + 10_000, 10, what=f"stream {what}"
        )

    def _alive(self) -> bool:
        if self.task.done():
            self.task.result()  # raises what cut it
            pytest.fail("the stream ended")
        return True

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()
