"""The TLS handshake of a non-blocking :class:`ssl.SSLSocket` without blocking the loop
(:func:`handshake`), and the client's dial that ends in a
:class:`~ravenproxy.transport.tls_socket.TLSSocketTransport` (:func:`open_client`)."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable

from ravenproxy.transport import tls
from ravenproxy.transport.tls_socket import TLSSocketTransport

log = logging.getLogger(__name__)


async def handshake(
    sock: ssl.SSLSocket,
    timeout: float,
    *,
    on_error: tls.HandshakeObserver | None = None,
) -> None:
    """The TLS handshake of a non-blocking ``sock``, waiting for readiness in between; a
    :class:`TimeoutError` after ``timeout`` seconds. ``on_error`` is told of a refused
    handshake (an :class:`ssl.SSLError`), as the listening context's observer is told by the
    event loop's TLS; not of a timeout, a reset, or a peer that closed the connection mid-way
    (a TCP health check)."""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    async with asyncio.timeout(timeout):
        while True:
            try:
                sock.do_handshake()
                return
            except ssl.SSLWantReadError:
                await _ready(loop, fd, loop.add_reader, loop.remove_reader)
            except ssl.SSLWantWriteError:
                await _ready(loop, fd, loop.add_writer, loop.remove_writer)
            except ssl.SSLEOFError:
                raise  # the peer left (a TCP health check, a port probe): not a refusal
            except ssl.SSLError as exc:
                if on_error is not None:
                    try:
                        on_error(exc)
                    except Exception:  # an observer never changes the handshake's outcome
                        log.exception("TLS handshake observer failed")
                raise


async def _ready(
    loop: asyncio.AbstractEventLoop,
    fd: int,
    add: Callable[..., None],
    remove: Callable[[int], object],
) -> None:
    waiter: asyncio.Future[None] = loop.create_future()

    def done() -> None:
        if not waiter.done():
            waiter.set_result(None)

    add(fd, done)
    try:
        await waiter
    finally:
        remove(fd)


async def open_client(
    protocol_factory: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext,
    server_hostname: str | None,
    handshake_timeout: float,
) -> tuple[TLSSocketTransport, asyncio.BaseProtocol]:
    """Dial ``host:port`` (each address it resolves to, in turn), TLS over it, and a
    :class:`TLSSocketTransport` with the protocol ``protocol_factory`` makes: what
    ``loop.create_connection(..., ssl=ssl_context)`` gives, with OpenSSL on the socket."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"getaddrinfo({host!r}) returned empty list")
    errors: list[OSError] = []
    raw: socket.socket | None = None
    for family, type_, proto, _, address in infos:
        sock = socket.socket(family, type_, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        raw = sock
        break
    if raw is None:
        if len(errors) == 1 or len({str(e) for e in errors}) == 1:
            raise errors[0]
        raise OSError(f"Multiple exceptions: {', '.join(str(e) for e in errors)}")
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock_tls = ssl_context.wrap_socket(
            raw,
            server_hostname=server_hostname,
            do_handshake_on_connect=False,
            suppress_ragged_eofs=False,  # tell a FIN without close_notify (see _eof)
        )
    except BaseException:
        raw.close()
        raise
    try:
        await handshake(sock_tls, handshake_timeout)
        protocol = protocol_factory()
        transport = TLSSocketTransport(loop, sock_tls, protocol)
    except BaseException:
        sock_tls.close()
        raise
    return transport, protocol
