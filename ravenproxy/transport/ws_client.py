"""The tunnel's WebSocket, client side (the agent's dial): the client connection with our frame
reader (:class:`~ravenproxy.transport.websocket.TunnelConnectionMixin`) and :func:`connect`,
which opens it as ``websockets.asyncio.client.connect`` would, without that module (it imports
``urllib.request`` for proxy detection, and with it ``http.client`` and more, for an agent that
dials no proxy)."""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.connection import Connection
from websockets.client import ClientProtocol
from websockets.http11 import Response
from websockets.protocol import Event, State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from ravenproxy.transport import tls_handshake
from ravenproxy.transport.websocket import TunnelConnectionMixin


class TunnelClientConnection(TunnelConnectionMixin, Connection):
    """The client side, with our frame reader. ``websockets``' sans-I/O
    :class:`~websockets.client.ClientProtocol` makes and checks the opening handshake (key and
    Sec-WebSocket-Accept, subprotocol, status); its asyncio connection runs the closing
    handshake and the control frames. Not ``websockets.asyncio.client``'s connection: that
    module imports ``urllib.request`` (proxy detection) and with it ``http.client`` and more,
    for an agent that dials no proxy. :meth:`handshake` and :meth:`process_event` are that
    class's, so ``websockets.asyncio.client.connect`` takes this one too
    (``create_connection=``, as tests do)."""

    protocol: ClientProtocol

    def __init__(self, protocol: ClientProtocol, **kwargs: Any) -> None:
        Connection.__init__(self, protocol, **kwargs)
        self.response_rcvd: asyncio.Future[None] = self.loop.create_future()
        self._init_reader()

    async def handshake(
        self, additional_headers: Any = None, user_agent_header: str | None = None
    ) -> None:
        """Send the request, wait for the response (or the connection lost), raise what the
        protocol found wrong (InvalidStatus, InvalidMessage, InvalidHandshake...)."""
        self.request = self.protocol.connect()
        if additional_headers is not None:
            self.request.headers.update(additional_headers)
        if user_agent_header is not None:
            self.request.headers.setdefault("User-Agent", user_agent_header)
        async with self.send_context(expected_state=State.CONNECTING):
            self.protocol.send_request(self.request)
        await asyncio.wait(
            [self.response_rcvd, self.connection_lost_waiter],
            return_when=asyncio.FIRST_COMPLETED,
        )
        if self.protocol.handshake_exc is not None:
            raise self.protocol.handshake_exc

    def process_event(self, event: Event) -> None:
        if self.response is None:  # the first event: the handshake's response
            assert isinstance(event, Response)
            self.response = event
            self.response_rcvd.set_result(None)
        else:
            super().process_event(event)


async def connect(
    uri: str,
    *,
    ssl: ssl_module.SSLContext | None,
    open_timeout: float,
    user_agent_header: str,
    logger: logging.Logger,
    subprotocols: Sequence[Subprotocol],
    max_size: int,
    max_queue: int,
    write_limit: int,
    create_connection: type[TunnelClientConnection] = TunnelClientConnection,
    compression: None = None,
    ping_interval: float | None = None,
) -> TunnelClientConnection:
    """A client WebSocket to ``uri`` (``wss://`` with ``ssl``, ``ws://`` without), as
    ``websockets.asyncio.client.connect`` opens one with the same arguments, but with no
    proxy and no redirect followed: TCP, TLS and the opening handshake within
    ``open_timeout`` (else :class:`TimeoutError`); the connection is aborted on any failure."""
    ws_uri = parse_uri(uri)
    if ws_uri.secure != (ssl is not None):
        raise ValueError(f"{uri}: wss:// needs an ssl context, ws:// takes none")

    def factory() -> TunnelClientConnection:
        protocol = ClientProtocol(
            ws_uri, subprotocols=subprotocols, max_size=max_size, logger=logger
        )
        return create_connection(
            protocol, ping_interval=ping_interval, max_queue=max_queue, write_limit=write_limit
        )

    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(open_timeout):
            if ssl is not None:  # OpenSSL on the socket itself (see tls_handshake)
                _, protocol = await tls_handshake.open_client(
                    factory,
                    ws_uri.host,
                    ws_uri.port,
                    ssl_context=ssl,
                    server_hostname=ws_uri.host,
                    handshake_timeout=open_timeout,
                )
                assert isinstance(protocol, TunnelClientConnection)
                connection = protocol
            else:
                _, connection = await loop.create_connection(factory, ws_uri.host, ws_uri.port)
            try:
                await connection.handshake(user_agent_header=user_agent_header)
            except BaseException:
                connection.transport.abort()
                raise
    except TimeoutError as exc:
        raise TimeoutError("timed out during opening handshake") from exc
    connection.start_keepalive()
    return connection
