"""The TLS transport's write of a small piece straight to ``SSL_write``
(:mod:`ravenproxy.transport.tls_write`): taken only while nothing is queued or waited for, so
it never overtakes queued bytes; what the socket refuses is queued and sent on readiness, not
lost; a write that fails ends the connection once, without raising; after a close it is
dropped. On loopback with the tunnel's real mutual TLS (test_tls_socket's pair)."""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ravenproxy.transport.tls_socket import TLSSocketTransport
from tests.unit.transport.test_tls_socket import WAIT, blob, connected
from tests.unit.transport.test_tls_socket import pki as pki


async def test_a_small_write_goes_behind_what_is_queued(pki: Path) -> None:
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        server.transport.pause_reading()
        big = blob(1024 * 1024)
        for _ in range(8):  # more than the sockets hold: a queue and a writer in place
            client.transport.write(big)
        await asyncio.sleep(0.1)
        assert client.transport.get_write_buffer_size() > 0
        tail = [b"tail-%d" % i for i in range(50)]
        for piece in tail:
            client.transport.write(piece)
        server.transport.resume_reading()
        whole = big * 8 + b"".join(tail)
        await server.until(len(whole))
        assert server.sha.hexdigest() == hashlib.sha256(whole).hexdigest()
        assert client.transport.get_write_buffer_size() == 0


def _refusing(transport: TLSSocketTransport, times: int, exc: Exception) -> list[int]:
    """The transport's SSL_write raising ``exc`` for its next ``times`` calls, then its own;
    returns the sizes it was called with."""
    real: Callable[[Any], int] = transport._sslwrite
    calls: list[int] = []

    def write(data: Any) -> int:
        calls.append(len(data))
        if len(calls) <= times:
            raise exc
        return real(data)

    transport._sslwrite = write
    return calls


async def test_a_small_write_the_socket_refuses_is_queued_and_sent_on_readiness(
    pki: Path,
) -> None:
    async with connected(pki) as (client, server):
        assert client.transport is not None
        data = blob(100)
        # Refused at once and again by the flush that queues it: it waits for readiness.
        calls = _refusing(client.transport, 2, ssl.SSLWantWriteError())
        client.transport.write(data)
        assert calls == [100, 100]
        assert client.transport.get_write_buffer_size() == 100
        await server.until(100)
        assert calls == [100, 100, 100]  # the same piece again (SSL_write's retry rule)
        assert server.sha.hexdigest() == hashlib.sha256(data).hexdigest()
        assert client.transport.get_write_buffer_size() == 0
        # After it, the next small write goes straight through again.
        client.transport.write(b"next")
        assert calls[-1] == 4
        await server.until(104)


async def test_a_small_write_that_fails_ends_the_connection_once(pki: Path) -> None:
    async with connected(pki) as (client, _server):
        assert client.transport is not None
        _refusing(client.transport, 1, BrokenPipeError(32, "Broken pipe"))
        client.transport.write(b"x" * 10)  # no exception here: connection_lost, from the loop
        exc = await asyncio.wait_for(client.lost, WAIT)
        assert isinstance(exc, BrokenPipeError)
        assert client.transport.is_closing()
        client.transport.write(b"after")  # dropped, as after any close
        await asyncio.sleep(0)
        assert client.lost_calls == 1


async def test_a_small_write_after_close_is_dropped(pki: Path) -> None:
    async with connected(pki) as (client, _server):
        assert client.transport is not None
        calls = _refusing(client.transport, 0, OSError())
        client.transport.close()
        client.transport.write(b"late")
        assert 4 not in calls  # never given to SSL_write (the close_notify may be)
        assert client.transport.get_write_buffer_size() == 0
