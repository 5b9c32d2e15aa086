"""Lingering close: end a connection whose peer may still be sending without losing what was
written to it last.

A socket closed while it holds unread bytes, or that receives bytes after it was closed, is
reset (RST) by the kernel instead of closed (FIN). The reset reaches a peer that is still
writing — a client uploading a body the front refused, or whose answer came before the body
was through — as a failed write, and a peer's kernel drops what it had received but the peer
had not yet read: the answer that said why is lost. So, as nginx's ``lingering_close``, Apache
and HAProxy do, the connection is half-closed first (plain TCP: the peer reads the answer, then
EOF), and what the peer still sends is read and dropped until it closes its side too, stays
silent for :data:`LINGER_TIMEOUT`, has lingered :data:`LINGER_TIME` in all, or has sent
:data:`LINGER_BYTES`; then the connection is closed. TLS has no half-close: the answer carries
``Connection: close`` and a length, which tells an HTTP client it is over. Nor is a peer that
has sent all it meant to (its request is through) waited for: ``through`` says when, and a
client over TLS that reads to EOF gets it then, not after :data:`LINGER_TIMEOUT` of silence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ravenproxy.transport.socket_stream import SocketReader, SocketWriter

LINGER_TIMEOUT = 5.0
"""Seconds without a byte from the peer after which a lingering connection is closed (nginx's
``lingering_timeout``)."""

LINGER_TIME = 30.0
"""Seconds a connection lingers at most, however steadily the peer sends (nginx's
``lingering_time``)."""

LINGER_BYTES = 256 * 1024 * 1024
"""Bytes a lingering connection reads and drops at most: a peer that sends more is reset, as
it would have been at once (reading costs CPU; the bound keeps one client from spending it)."""

_READ = 256 * 1024


async def lingering_close(
    reader: SocketReader,
    writer: SocketWriter,
    *,
    timeout: float = LINGER_TIMEOUT,
    total: float = LINGER_TIME,
    budget: int = LINGER_BYTES,
    through: Callable[[bytes], bool] | None = None,
) -> int:
    """Half-close ``writer`` when the transport can, drop what ``reader`` still gets until
    the peer is done or a bound is reached (see the module's doc), then close. ``through``:
    given each chunk dropped, True once the peer has sent all it meant to (no more is waited
    for). Returns the bytes dropped. Errors of the connection end it quietly: it is being
    closed anyway."""
    dropped = 0
    try:
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(total):
            while dropped < budget:
                async with asyncio.timeout(timeout):
                    data = await reader.read(_READ)
                if not data:
                    break
                dropped += len(data)
                if through is not None and through(data):
                    break
    except (TimeoutError, ConnectionError, OSError):
        pass
    finally:
        writer.close()
    return dropped
