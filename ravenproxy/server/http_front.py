"""The HTTP front (``--http-addr``, default :10264): ``CONNECT nodename:port`` through the tunnel.

Every refusal answers with a status, a one-line body naming the node and the reason, a log line
and a count in ``ravenproxy_server_front_requests{front="http",status=...}``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.server.http1 import (
    BadRequest,
    error_response,
    parse_head,
    read_head,
    split_authority,
)
from ravenproxy.server.routing import route
from ravenproxy.transport.relay import relay

if TYPE_CHECKING:
    from ravenproxy.server.app import ProxyServer

log = logging.getLogger(__name__)


class HttpFront:
    name = "http"

    def __init__(self, server: ProxyServer) -> None:
        self.server = server

    def _count(self, status: int) -> None:
        self.server.metrics.requests.labels(front=self.name, status=str(status)).inc()

    async def _refuse(self, writer: asyncio.StreamWriter, status: int, body: str) -> None:
        self._count(status)
        writer.write(error_response(status, body))
        try:
            await writer.drain()
        except ConnectionError:
            pass
        writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            raw = await read_head(reader)
            if raw is None:
                writer.close()
                return
            head = parse_head(raw)
            if head.method != "CONNECT":
                raise BadRequest(405, f"method {head.method} is not served here; use CONNECT")
            host, port = split_authority(head.target)
        except BadRequest as exc:
            log.info(
                "http front: bad request", extra=kv(peer=peer, status=exc.status, reason=exc.reason)
            )
            await self._refuse(writer, exc.status, exc.reason)
            return
        try:
            r = route(self.server.store.model, self.server.registry, host, port)
            stream = await self.server.open(r)
        except RoutingError as exc:
            log.info(
                "http front: refused",
                extra=kv(peer=peer, node=exc.node, port=port, status=exc.status, reason=exc.reason),
            )
            await self._refuse(writer, exc.status, f"{exc.node}: {exc.reason}")
            return
        self._count(200)
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        result = await relay(stream, reader, writer)
        log.debug(
            "http front: CONNECT done",
            extra=kv(
                node=r.node.name,
                port=port,
                up=result.bytes_up,
                down=result.bytes_down,
                error=result.error,
            ),
        )
