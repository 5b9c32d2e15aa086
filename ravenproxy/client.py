"""A minimal client for the server's HTTP front: ``CONNECT node:port`` and get a raw stream.

Used by ``ravenproxy demo``, the benchmarks and the tests; curl does the same with ``-p -x``.
"""

from __future__ import annotations

import asyncio

from ravenproxy.errors import RavenProxyError


class ConnectRefused(RavenProxyError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body.strip()}")
        self.status = status
        self.body = body


async def open_tunnel(
    proxy_host: str, proxy_port: int, target: str, *, limit: int = 256 * 1024
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """CONNECT ``target`` (``node:port``) through the front; raise :class:`ConnectRefused`
    with the front's status and one-line reason when it says no."""
    reader, writer = await asyncio.open_connection(proxy_host, proxy_port, limit=limit)
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if status != 200:
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                key, _, value = line.partition(":")
                if key.strip().lower() == "content-length":
                    length = int(value.strip() or 0)
            body = (await reader.readexactly(length)).decode() if length else ""
            raise ConnectRefused(status, body)
    except BaseException:
        writer.close()
        raise
    return reader, writer
