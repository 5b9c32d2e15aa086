"""The least a Python relay can do: latency.py's ``floor`` row (``--floor``).

Two of these, chained over mTLS on loopback, stand where the tunnel's server and agent stand:
client → relay A (plain in, ``--tls-out``) → relay B (``--tls-in``, plain out) → target, one
TLS connection per client connection. Each is asyncio + uvloop, one ``Protocol`` per side,
every chunk written straight to the other side (uvloop's own TLS, a memory BIO), with no
framing, no multiplexing, no flow control beyond the transports' pause/resume. Its CPU per
request is a floor for two Python processes relaying with TLS between them; what the tunnel
costs above it is our protocol's (WebSocket framing, streams, windows, the HTTP front).

    python floor_relay.py PORTFILE TO_PORT --tls-out CA CERT KEY   # relay A (dials relay B)
    python floor_relay.py PORTFILE TO_PORT --tls-in CA CERT KEY    # relay B (accepts relay A)
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import ssl
from pathlib import Path
from typing import cast

import uvloop


class _Side(asyncio.Protocol):
    """One connection of a relayed pair; ``peer`` is the other one."""

    def __init__(self) -> None:
        self.peer: _Side | None = None
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []  # what arrived for us before we were connected
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.peer is not None and self.peer.lost:  # it left while we were dialled
            self.transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for chunk in self.early:
            self.transport.write(chunk)
        self.early.clear()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None:
            return
        if peer.transport is None:
            peer.early.append(data)
        else:
            peer.transport.write(data)

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()


async def _main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    ca, cert, key = args.tls_in or args.tls_out
    accept_tls: ssl.SSLContext | None = None
    dial_tls: ssl.SSLContext | None = None
    if args.tls_in:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(ca)
        accept_tls = context
    else:
        context = dial_tls = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)

    def accepted() -> _Side:
        near, far = _Side(), _Side()
        near.peer, far.peer = far, near

        async def dial() -> None:
            try:
                await loop.create_connection(
                    lambda: far,
                    "127.0.0.1",
                    args.to_port,
                    ssl=dial_tls,
                    server_hostname="localhost" if dial_tls else None,
                )
            except OSError:
                if near.transport is not None:
                    near.transport.close()

        dialing.add(task := loop.create_task(dial()))
        task.add_done_callback(dialing.discard)
        return near

    dialing: set[asyncio.Task[None]] = set()
    server = await loop.create_server(accepted, "127.0.0.1", 0, ssl=accept_tls, backlog=1024)
    args.port_file.write_text(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("port_file", type=Path, help="the listening port is written here")
    parser.add_argument("to_port", type=int, help="the loopback port every connection goes to")
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--tls-in", nargs=3, metavar=("CA", "CERT", "KEY"), help="accept mTLS")
    tls.add_argument("--tls-out", nargs=3, metavar=("CA", "CERT", "KEY"), help="dial mTLS")
    uvloop.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
