"""Socket ⇄ tunnel stream relay with backpressure both ways and half-close carried through.

Socket → stream: read only as much as the stream's credit allows, so a slow tunnel stops reading
the socket (TCP pushes back on the sender) instead of queueing. Stream → socket: the next chunk
is taken (and its credit returned) only after the socket accepted the previous one.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.wire.codes import ErrorCode

log = logging.getLogger(__name__)

READ_LIMIT = 1024 * 1024
"""Largest single read from a socket; also the StreamReader buffer limit we open sockets with."""


@dataclass
class RelayResult:
    bytes_up: int = 0
    """Socket → tunnel."""
    bytes_down: int = 0
    """Tunnel → socket."""
    error: str = ""


async def relay(
    stream: TunnelStream,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    *,
    initial: bytes = b"",
) -> RelayResult:
    """Copy both ways until both sides finished or either failed. Always closes the socket and
    the stream. ``initial`` is data already read from the socket that belongs to the stream."""
    result = RelayResult()
    _tune(writer)

    async def up() -> None:
        if initial:
            await stream.write(initial)
            result.bytes_up += len(initial)
        while True:
            room = await stream.writable()
            data = await reader.read(min(room, READ_LIMIT))
            if not data:
                stream.write_eof()
                return
            await stream.write(data)
            result.bytes_up += len(data)

    async def down() -> None:
        while True:
            chunk = await stream.read()
            if not chunk:
                if writer.can_write_eof() and not writer.is_closing():
                    writer.write_eof()
                return
            writer.write(chunk)
            result.bytes_down += len(chunk)
            await writer.drain()

    up_task = asyncio.create_task(up(), name=f"relay-up:{stream.id}")
    down_task = asyncio.create_task(down(), name=f"relay-down:{stream.id}")
    try:
        pending: set[asyncio.Task[None]] = {up_task, down_task}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failures = [exc for task in done if (exc := task.exception()) is not None]
            if not failures:
                continue
            # One direction failed: the other has nothing sensible left to do.
            exc = failures[0]
            if isinstance(exc, StreamClosedError):
                result.error = str(exc)
            else:
                result.error = f"socket: {exc!r}"
                stream.reset(ErrorCode.CANCEL, "socket error")
            for other in pending:
                other.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            pending = set()
    except asyncio.CancelledError:
        stream.reset(ErrorCode.CANCEL, "relay cancelled")
        up_task.cancel()
        down_task.cancel()
        await asyncio.gather(up_task, down_task, return_exceptions=True)
        raise
    finally:
        if result.error:
            writer.transport.abort()
        else:
            writer.close()
        stream.close()
    return result


def _tune(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    writer.transport.set_write_buffer_limits(high=READ_LIMIT)
