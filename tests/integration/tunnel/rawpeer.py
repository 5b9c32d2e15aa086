"""A tunnel client that speaks the wire protocol by hand, with a real agent certificate.

For tests of how a real server treats a peer at the frame level (prompt PING answers, a peer
that floods and never reads): it sends exactly the frames it is told to, reads only when asked,
and records how the connection ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from ravenproxy.transport import tls
from ravenproxy.wire.codes import SUBPROTOCOL, Setting
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.frames import Frame, Settings, decode_message, encode
from tests.integration.cluster import Cluster

# Large enough for anything the server may batch into one message.
MAX_MESSAGE = 2 * 1024 * 1024


def our_settings() -> Settings:
    c = WireConfig()
    return Settings(
        (
            (Setting.MAX_FRAME_SIZE, c.max_frame_size),
            (Setting.MAX_CONCURRENT_STREAMS, c.max_concurrent_streams),
            (Setting.INITIAL_STREAM_WINDOW, c.initial_stream_window),
            (Setting.CONNECTION_WINDOW, c.connection_window),
        )
    )


@dataclass
class RawPeer:
    ws: ClientConnection
    received: list[Frame] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""

    async def send(self, *frames: Frame) -> None:
        await self.ws.send(b"".join(encode(f) for f in frames))

    async def handshake(self, timeout: float = 10) -> Settings:
        """Send our SETTINGS and wait for the server's (always its first frame)."""
        await self.send(our_settings())
        found = await self.wait_for(lambda f: isinstance(f, Settings), timeout)
        assert isinstance(found, Settings)
        return found

    async def wait_for(self, match: Callable[[Frame], bool], timeout: float) -> Frame:
        """Read messages until a frame matches; raise TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            for frame in self.received:
                if match(frame):
                    self.received.remove(frame)
                    return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no matching frame")
            message = await asyncio.wait_for(self.ws.recv(), remaining)
            assert isinstance(message, bytes), "the server sent a text message"
            self.received.extend(decode_message(message, 16 * 1024 * 1024))

    async def read_until_closed(self, timeout: float) -> list[Frame]:
        """Every frame up to the end of the connection; records the close code and reason."""
        frames: list[Frame] = []
        try:
            async with asyncio.timeout(timeout):
                while True:
                    message = await self.ws.recv()
                    assert isinstance(message, bytes)
                    frames.extend(decode_message(message, 16 * 1024 * 1024))
        except ConnectionClosed as exc:
            if exc.rcvd is not None:
                self.close_code, self.close_reason = exc.rcvd.code, exc.rcvd.reason
        return frames


@contextlib.asynccontextmanager
async def raw_peer(cluster: Cluster, node: str, *, max_queue: int = 16) -> AsyncIterator[RawPeer]:
    """Connect to the cluster's server as ``node`` (its certificate from the cluster's PKI).

    ``max_queue`` is how many messages the client's WebSocket buffers before it stops reading
    the socket: 1 makes a peer that, as long as it is not asked to read, reads next to nothing.
    """
    assert cluster.server is not None
    ctx = tls.client_context(
        cluster.certs / "ca.crt", cluster.certs / f"{node}.crt", cluster.certs / f"{node}.key"
    )
    ws = await connect(
        f"wss://127.0.0.1:{cluster.server.ports['tunnel']}",
        ssl=ctx,
        server_hostname="127.0.0.1",
        subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
        compression=None,
        ping_interval=None,
        max_size=MAX_MESSAGE,
        max_queue=max_queue,
        open_timeout=10,
        close_timeout=2,
        proxy=None,  # type: ignore[arg-type]
    )
    try:
        yield RawPeer(ws)
    finally:
        ws.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.wait_closed(), 5)
