"""A front's listening socket and accept loop, shared by the HTTP and HTTPS fronts.

The loop is ours (not ``asyncio.start_server``) so that the limits hold at the one place every
connection passes: past the connection cap (:class:`~ravenproxy.server.limits.ConnectionGate`,
over all fronts) a new connection is closed at once and counted; an accept that fails for want
of descriptors (EMFILE, ENFILE) is counted and logged at most once a second, and accepting pauses
briefly instead of spinning on a listener that stays readable.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import struct
from collections.abc import Callable, Coroutine
from typing import Any

from ravenproxy.log import kv, peer_text
from ravenproxy.metrics import ServerMetrics
from ravenproxy.server.limits import ConnectionGate, Throttle
from ravenproxy.transport.readiness import watch
from ravenproxy.transport.socket_stream import SocketStream

log = logging.getLogger(__name__)

Handler = Callable[[socket.socket, Any], Coroutine[Any, Any, None]]
"""Serves one accepted (non-blocking) socket and its peer address; it owns the socket: it
closes it, or hands it to a transport that will."""

OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_PAUSE = 0.1
"""Accepting pauses this long after running out of descriptors (the listener stays readable,
so retrying at once would spin the event loop)."""


def listen(host: str | None, port: int) -> socket.socket:
    """A non-blocking listening socket; no host: every interface, IPv6 and IPv4 where the
    system can (one dual-stack socket)."""
    if host is None and socket.has_dualstack_ipv6():
        sock = socket.create_server(
            ("", port), family=socket.AF_INET6, backlog=4096, dualstack_ipv6=True
        )
    else:
        sock = socket.create_server((host or "", port), backlog=4096)
    sock.setblocking(False)
    return sock


def unix_peer(sock: Any) -> str:
    """A Unix-socket client for the logs, which has no address: its process and user
    (``SO_PEERCRED``), ``unix:pid=N,uid=N``."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _gid = struct.unpack("3i", creds)
    except (OSError, AttributeError, struct.error):
        return "unix"
    return f"unix:pid={pid},uid={uid}"


async def streams(
    conn: socket.socket,
    ctx: ssl.SSLContext | None = None,
    *,
    limit: int,
    handshake_timeout: float | None = None,
) -> tuple[SocketStream, SocketStream]:
    """Reader and writer over an accepted socket, optionally with server-side TLS: one
    :class:`~ravenproxy.transport.socket_stream.SocketStream` in both roles (an idle front
    connection holds one slotted object, not asyncio's reader, writer and protocol). The
    transport owns the socket from then on."""
    loop = asyncio.get_running_loop()
    stream = SocketStream(limit)
    await loop.connect_accepted_socket(
        lambda: stream,
        conn,
        ssl=ctx,
        ssl_handshake_timeout=handshake_timeout if ctx is not None else None,
    )
    watch(stream.transport)  # a client's request queues tunnel output: readiness.py
    return stream, stream


class FrontListener:
    """One front's listener: accepts, enforces the connection cap, runs ``handler`` per
    connection in a task that ``track`` owns (collected at shutdown)."""

    def __init__(
        self,
        name: str,
        handler: Handler,
        gate: ConnectionGate,
        metrics: ServerMetrics,
        track: Callable[[asyncio.Task[Any]], None],
    ) -> None:
        self.name = name
        self._handler = handler
        self._gate = gate
        self._metrics = metrics
        self._track = track
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._full_log = Throttle(1.0)
        self._error_log = Throttle(1.0)
        self._refused = metrics.front_refused.labels(front=name)

    async def start(self, host: str | None, port: int) -> int:
        """Bind and start accepting; returns the bound port (``port`` may be 0)."""
        sock = listen(host, port)
        self.serve(sock)
        return int(sock.getsockname()[1])

    def serve(self, sock: socket.socket) -> None:
        """Start accepting on a bound, listening, non-blocking socket (a Unix one too); it is
        closed at :meth:`stop`."""
        self._sock = sock
        self._accepting = asyncio.create_task(
            self._accept_loop(sock), name=f"{self.name}-front-accept"
        )

    def socknames(self) -> list[tuple[object, ...]]:
        """Where it listens (for the server's own-listener check)."""
        return [self._sock.getsockname()] if self._sock is not None else []

    async def stop(self) -> None:
        """Stop accepting (connections being served are the owner's to drain)."""
        if self._accepting is not None:
            self._accepting.cancel()
            await asyncio.gather(self._accepting, return_exceptions=True)
        if self._sock is not None:
            self._sock.close()

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, peer = await loop.sock_accept(sock)
            except OSError as exc:
                self._accept_failed(exc)
                if exc.errno in OUT_OF_DESCRIPTORS:
                    await asyncio.sleep(ACCEPT_PAUSE)
                continue
            if not self._gate.try_enter():
                conn.close()
                self._refused.inc()
                held = self._full_log.allow()
                if held is not None:
                    log.warning(
                        f"{self.name} front: front connection limit reached, closing new "
                        "connections",
                        extra=kv(peer=peer_text(peer), limit=self._gate.limit, also_closed=held),
                    )
                continue
            if not peer:  # a Unix socket's client
                peer = unix_peer(conn)
            conn.setblocking(False)
            # The handler is the task's coroutine and what follows it a done callback (not a
            # wrapping coroutine): a frame less held by every open, idle connection.
            name = f"{self.name}-front:{peer_text(peer)}"  # _served reads the peer back from it
            task = asyncio.create_task(self._handler(conn, peer), name=name)
            task.add_done_callback(self._served)
            self._track(task)

    def _accept_failed(self, exc: OSError) -> None:
        code = errno.errorcode.get(exc.errno or 0, "other").lower()
        self._metrics.accept_errors.labels(front=self.name, error=code).inc()
        held = self._error_log.allow()
        if held is None:
            return
        if exc.errno in OUT_OF_DESCRIPTORS:
            log.error(
                f"{self.name} front: accept failed, out of file descriptors (raise the limit, "
                "or lower --max-front-connections)",
                extra=kv(error=code, also_failed=held, open=self._gate.open),
            )
        else:
            log.warning(
                f"{self.name} front: accept failed",
                extra=kv(error=exc, also_failed=held),
            )

    def _served(self, task: asyncio.Task[None]) -> None:
        self._gate.leave()
        if not task.cancelled() and (exc := task.exception()) is not None:
            # The handler closed its socket; what broke must still be seen.
            peer = task.get_name().partition("-front:")[2]
            log.error(f"{self.name} front: connection failed", exc_info=exc, extra=kv(peer=peer))
