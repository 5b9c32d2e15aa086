"""The egress front: kube-apiserver's ``HTTPConnect`` egress (``--egress-selector-config-file``),
served as konnectivity-server serves it, on a Unix socket (``--egress-uds``) or over TLS that
requires a client certificate (``--egress-addr``, ``--egress-client-ca-file``).

The apiserver writes ``CONNECT <ip>:<port> HTTP/1.1`` and a literal ``Host: 127.0.0.1`` whatever
the target (``tunnelHTTPConnect`` in k8s.io/apiserver's egressselector), reads the answer with
``http.ReadResponse`` and refuses any byte after it, then speaks first (TLS to a kubelet or a
pod). So: the request target alone is routed (:meth:`~ravenproxy.server.router.Router.route`:
node InternalIPs, pod IPs by their node's pod CIDRs, node names), ``200`` and nothing more, then
raw bytes both ways. Only CONNECT is served (405 otherwise).

Everything after the accept is the HTTP front's machinery (:class:`HttpProxy`: header timeout,
stream leases, one-line refusals, the relay, counts); this module adds the two listeners: the
socket file (:func:`bind_unix`: mode and owner set before it listens, a stale file replaced, a
live one refused) and the TLS handshake whose refusals are logged and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import socket
import ssl
import stat

from ravenproxy.errors import ConfigError
from ravenproxy.log import kv
from ravenproxy.server.accept import FrontListener, streams
from ravenproxy.server.front import FrontContext
from ravenproxy.server.http_proxy import HttpProxy
from ravenproxy.server.limits import ClientStreams
from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.socket_stream import SocketStream

log = logging.getLogger(__name__)

FLAG = "--egress-uds"


def bind_unix(path: str, mode: int, owner: tuple[int, int] | None = None) -> socket.socket:
    """A listening, non-blocking Unix socket at ``path`` with ``mode`` (and ``owner`` (uid,
    gid), -1 keeping either) set *before* it listens, so no client connects through looser
    permissions. A socket file already there is tried: nobody answering (a stale file left by
    a killed server) → replaced; a live listener → :class:`ConfigError` naming the path, as is a
    file there that is no socket (never removed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(FLAG, f"{path} exists and is not a socket: not replacing it")
        if _answers(path):
            raise ConfigError(FLAG, f"{path}: another process listens on this socket")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        log.info("egress: stale socket file replaced", extra=kv(path=path))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        try:
            os.chmod(path, mode)
            if owner is not None:
                os.chown(path, *owner)
            sock.listen(4096)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def _answers(path: str) -> bool:
    """Whether a process accepts connections on the socket file at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        # EAGAIN: a full backlog is still a live listener; anything else (EACCES…) we cannot
        # tell, and must not delete.
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK) or isinstance(exc, TimeoutError):
            return True
        raise ConfigError(FLAG, f"{path}: cannot tell whether it is in use ({exc})") from None
    finally:
        probe.close()
    return True


FileId = tuple[int, int, int]
"""A file's identity: device, inode and change time (an inode number alone is reused at once
on tmpfs when a file is replaced)."""


def file_id(path: str) -> FileId:
    st = os.lstat(path)
    return st.st_dev, st.st_ino, st.st_ctime_ns


def remove_unix(path: str, bound: FileId) -> None:
    """Remove the socket file at ``path`` if it is still the one bound (``bound``, taken
    after its mode and owner were set): a successor may have replaced it since, and its file
    is not ours to remove."""
    try:
        if file_id(path) != bound:
            return
        os.unlink(path)
    except FileNotFoundError:
        pass


class EgressFront:
    """One egress listener: ``transport`` is ``uds`` or ``tcp`` (its metric label; its front
    name is ``egress-<transport>``)."""

    def __init__(self, ctx: FrontContext, transport: str) -> None:
        # Its one client is kube-apiserver, authenticated (the socket file's mode and owner, or
        # a client certificate), holding every kubectl logs/exec/port-forward of the cluster at
        # once: --max-streams-per-client, a guard against an unauthenticated client of the
        # fronts holding an agent's stream slots, does not apply (konnectivity-server has no
        # such cap either); its streams still count against --max-front-connections.
        ctx = dataclasses.replace(ctx, client_streams=ClientStreams(None))
        self.transport = transport
        self.name = f"egress-{transport}"
        self.kit = ctx
        self.proxy = HttpProxy(ctx, self.name, over_tls=transport == "tcp", egress=transport)
        self.listener = FrontListener(self.name, self._handle, ctx.gate, ctx.metrics, ctx.track)
        self._tls: ssl.SSLContext | None = None
        self._bound: tuple[str, FileId] | None = None
        """The socket file and its identity, removed at stop if still ours."""

    async def start_unix(self, path: str, mode: int, owner: tuple[int, int] | None) -> str:
        """Listen on the socket file ``path``; returns it."""
        sock = bind_unix(path, mode, owner)
        self._bound = (path, file_id(path))
        self.listener.serve(sock)
        return path

    async def start_tls(self, host: str | None, port: int, ctx: ssl.SSLContext) -> int:
        """Listen for TLS on ``host:port`` (``ctx`` requires a client certificate)."""
        self._tls = ctx
        return await self.listener.start(host, port)

    async def stop(self) -> None:
        await self.listener.stop()
        if self._bound is not None:
            remove_unix(*self._bound)
            self._bound = None

    async def _handle(self, conn: socket.socket, peer: object) -> None:
        try:
            reader, writer = await self._streams(conn, peer)
        except BaseException:
            conn.close()
            raise
        if reader is None or writer is None:
            conn.close()
            return
        try:
            await self.proxy.serve(reader, writer)
        finally:
            if not writer.is_closing():
                writer.transport.abort()

    async def _streams(
        self, conn: socket.socket, peer: object
    ) -> tuple[SocketStream, SocketStream] | tuple[None, None]:
        """The connection's streams; over TLS after a handshake within --header-timeout (a
        refusal is logged, counted, and gives None)."""
        if self._tls is None:
            try:
                return await streams(conn, limit=READ_LIMIT)
            except OSError as exc:  # the client went away already
                log.debug(f"{self.name} front: connection lost at once", extra=kv(error=exc))
                return None, None
        timeout = self.kit.limits.header_timeout
        try:
            async with asyncio.timeout(timeout) as budget:
                return await streams(
                    conn, self._tls, limit=READ_LIMIT, handshake_timeout=timeout + 1
                )
        except (TimeoutError, ssl.SSLError, ConnectionError, OSError) as exc:
            self.kit.metrics.egress_tls_refused.inc()
            if isinstance(exc, TimeoutError) and budget.expired():
                self.kit.metrics.header_timeouts.labels(
                    front=self.name, stage="tls_handshake"
                ).inc()
                why: object = f"no TLS handshake within {timeout:g}s"
            else:
                why = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or exc
            log.info(
                f"{self.name} front: TLS handshake refused (a client certificate from "
                "--egress-client-ca-file is required)",
                extra=kv(peer=peer, reason=why),
            )
            return None, None
