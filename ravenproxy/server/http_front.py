"""The HTTP front (``--http-addr``, default :10264): plain HTTP/1.1 routed to nodes.

Requests name their node by ``Host: nodename:port``, ``X-Tunnel-Proxy-Host``, ``?nodeName=``, an
absolute URI (forward proxy: Prometheus ``proxy_url``), ``CONNECT nodename:port``, or a kubelet
pod path (see :mod:`ravenproxy.server.podroutes`); :mod:`ravenproxy.server.http_proxy` carries
them. Every refusal answers with a status, a one-line body naming the node and the reason, a
log line and a count in ``ravenproxy_server_front_requests{front="http",status=...}``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ravenproxy.server.http_proxy import HttpProxy

if TYPE_CHECKING:
    from ravenproxy.server.app import ProxyServer


class HttpFront:
    name = "http"

    def __init__(self, server: ProxyServer) -> None:
        self.server = server
        self.proxy = HttpProxy(server, self.name, over_tls=False)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self.proxy.serve(reader, writer)
