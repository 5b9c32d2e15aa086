"""The HTTP front (``--http-addr``, default :10264): plain HTTP/1.1 routed to nodes.

Requests name their node by ``Host: nodename:port``, ``X-Tunnel-Proxy-Host``, ``?nodeName=``, an
absolute URI (forward proxy: Prometheus ``proxy_url``), ``CONNECT nodename:port``, or a kubelet
pod path (see :mod:`ravenproxy.server.podroutes`); :mod:`ravenproxy.server.http_proxy` carries
them. Every refusal answers with a status, a one-line body naming the node and the reason, a
log line and a count in ``ravenproxy_server_front_requests{front="http",status=...}``.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

from ravenproxy.log import kv
from ravenproxy.server.accept import FrontListener, streams
from ravenproxy.server.front import FrontContext
from ravenproxy.server.http_proxy import HttpProxy

log = logging.getLogger(__name__)

READ_BUFFER = 64 * 1024
"""The client connection's read buffer (a head beyond --max-header-size is refused anyway)."""


class HttpFront:
    name = "http"

    def __init__(self, ctx: FrontContext) -> None:
        self.proxy = HttpProxy(ctx, self.name, over_tls=False)
        self.listener = FrontListener(self.name, self.handle, ctx.gate, ctx.metrics, ctx.track)

    async def start(self, host: str | None, port: int) -> int:
        return await self.listener.start(host, port)

    async def stop(self) -> None:
        await self.listener.stop()

    async def handle(self, conn: socket.socket, peer: Any) -> None:
        try:
            reader, writer = await streams(conn, limit=READ_BUFFER)
        except OSError as exc:  # the client went away already
            conn.close()
            log.debug("http front: connection lost at once", extra=kv(peer=peer, error=exc))
            return
        except BaseException:
            conn.close()
            raise
        try:
            await self.proxy.serve(reader, writer)
        finally:
            if not writer.is_closing():
                writer.transport.abort()
