"""A client connection's kept target connection between its requests (:class:`KeptUpstream`, a
base of :class:`~ravenproxy.server.http_callbacks.CallbackPath`).

While no request is outstanding, the kept connection — a tunnel stream, a direct route's socket,
TLS over either — calls back, and whatever it got lets it go at once, with the client's stream
slot (--max-streams-per-client): its end (the target closed an idle connection, as targets do),
or any byte but empty lines. A target that sends while nothing was asked, or more than its
answer's framing said, answers nothing: those bytes would begin the next request's answer (a
response desync, another client's bytes). As Envoy and HAProxy do, that connection is not used
again — logged, counted (``ravenproxy_server_upstream_stray_total``) — and the next request goes
on a fresh one. A ``408 Request Timeout`` is the exception: a target that closes an idle
kept connection may say so first (nginx and Apache do), and that is the connection's normal end,
as Go's net/http transport takes it — let go, logged at debug, not counted as stray.
Under re-originated TLS the bytes are records, taken into TLS at once: a
close_notify is the end, application data the stray case (a session ticket is neither). What
came past an answer's end in the read that ended it is
:class:`~ravenproxy.server.exchange.Exchange`'s to see (``CloseUpstream(stray=True)``); what
came in a later read, before the next request, is seen here: by the hook's callback, when the
hook is set (:meth:`KeptUpstream._kept_ended`), or before a pipelined request goes out
(:meth:`KeptUpstream._let_go_ended`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ravenproxy.log import kv
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import Action
from ravenproxy.server.front import Front, FrontContext
from ravenproxy.transport.bytestream import (
    ByteStream,
    SocketByteStream,
    TlsByteStream,
    TunnelByteStream,
)
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.transport.tunnel_stream import StreamClosedError, TunnelStream

log = logging.getLogger(__name__)

QUIET, ENDED, STRAY, TIMED_OUT = 0, 1, 2, 3
"""What a kept connection got between requests (:func:`news`): nothing, its end, bytes, a
``408 Request Timeout`` (:func:`closes_idle`)."""


def closes_idle(data: bytes) -> bool:
    """``data`` begins a ``408 Request Timeout`` answer: the target's notice that it closes an
    idle kept connection (nginx, Apache and others send one), not an answer nobody asked for —
    the connection's normal end, as Go's net/http transport takes it (its ``is408Message``:
    the same test, on the bytes that came first)."""
    return len(data) >= 12 and data[:7] == b"HTTP/1." and data[8:12] == b" 408"


def news(read: Callable[[], bytes | memoryview | None]) -> int:
    """What a kept connection got between requests, by its ``read_nowait``: a chunk is taken
    (and dropped: the connection is let go for it, unless it is empty lines)."""
    try:
        data = read()
    except (StreamClosedError, OSError):  # the carrier's loss, raised by its read
        return ENDED
    if data is None:
        return QUIET
    if not data:
        return ENDED
    data = bytes(data)
    if closes_idle(data):
        return TIMED_OUT
    # Empty lines answer nothing and begin no answer (llhttp skips them before a message, as in
    # the answer's own read: the exchange keeps the connection for them there): dropped.
    return STRAY if data.strip(b"\r\n") else QUIET


class KeptUpstream:
    """The kept connection's hooks between requests; the connection's slots hold what it
    names below (:class:`~ravenproxy.server.http_callbacks.CallbackPath` declares them)."""

    __slots__ = ("_busy", "_hooked", "_hooked_direct", "_unread")

    ex: Exchange
    ctx: FrontContext
    proxy: Front
    peer: object
    upstream: ByteStream | None
    waiting: bool
    _busy: bool
    _hooked: TunnelStream | None
    _hooked_direct: SocketStream | None
    _unread: bool

    def _on_upstream(self) -> None:
        raise NotImplementedError

    def _run(self, actions: list[Action]) -> None:
        raise NotImplementedError

    def _hook_kept(self) -> None:
        """The kept tunnel stream calls back (:meth:`_on_upstream`; :meth:`_by_callbacks`
        hooks :meth:`_advance` instead): in callback mode, and
        while the task waits for a next request — a stream under re-originated TLS too, whose
        connection the callbacks do not serve — so that its news between requests is noticed
        either way. What came before the hook: :meth:`_kept_ended`, once ``waiting``. A direct
        route's connection (the task waits for the next request) calls :meth:`_on_direct`."""
        upstream = self.upstream
        if type(upstream) is TlsByteStream:
            upstream = upstream.inner
        if type(upstream) is TunnelByteStream:
            stream = self._hooked = upstream.stream
            stream.on_readable(self._on_upstream)
        elif type(upstream) is SocketByteStream and type(upstream.reader) is SocketStream:
            sock = self._hooked_direct = upstream.reader
            sock.on_data(self._on_direct)

    def _kept_ended(self) -> None:
        """What the hooked connection got before its hook, since the last answer (its end, a
        chunk past the answer's, under TLS records TLS took in with the answer): looked at
        now, as its callback would."""
        stream = self._hooked
        if stream is not None and (stream.ended or self.ex.phase == "head"):
            self._on_upstream()
        if self._hooked_direct is not None:
            self._on_direct()

    def _let_go_ended(self) -> None:
        """A next request came with no wait for it since the last answer (pipelined: parsed
        already, or in the socket, or its head in pieces), so no hook looked at the kept
        connection meanwhile: if it ended or got bytes, let it go now, before the request goes
        out on it. Nothing of the request was sent, so it goes on a fresh one whatever its
        method (sent on the dead one, a POST would be answered 502)."""
        upstream = self.upstream
        if type(upstream) is TlsByteStream:
            inner = upstream.inner
            if type(inner) is TunnelByteStream:
                got = self._tls_news(inner.stream.read_nowait)
            elif type(inner) is SocketByteStream and type(inner.reader) is SocketStream:
                got = self._tls_news(inner.reader.read_nowait)
            else:
                return
        elif type(upstream) is TunnelByteStream:
            got = news(upstream.stream.read_nowait)
        elif type(upstream) is SocketByteStream and type(upstream.reader) is SocketStream:
            got = news(upstream.reader.read_nowait)
        else:
            return
        if got:
            self._let_go(got)

    def _unhook(self) -> None:
        self._unread = True  # the next hook's stream may hold what came meanwhile
        stream, self._hooked = self._hooked, None
        if stream is not None:
            stream.on_readable(None)
        sock, self._hooked_direct = self._hooked_direct, None
        if sock is not None:
            sock.on_data(None)

    def _on_direct(self) -> None:
        """The direct connection's callback between requests: data, its end or its loss."""
        if self.ex.phase == "head":
            self._kept_news(self._hooked_direct)

    def _kept_news(self, kept: TunnelStream | SocketStream | None) -> None:
        """Between requests (by callbacks or in the task), the kept connection (a tunnel
        stream, a direct socket) got bytes or ended: what came is taken (under TLS into it);
        anything but a session ticket lets it go now, and with it the client's stream slot
        (--max-streams-per-client), not at the next request (which would go out on the dead
        connection — one with a body is then refused, 502 — or have its answer begin with
        the bytes) or the keep-alive timeout."""
        if kept is None or not self.waiting or self._busy:
            return
        if type(self.upstream) is TlsByteStream:
            got = self._tls_news(kept.read_nowait)
        else:
            got = news(kept.read_nowait)
        if got:
            self._busy = True
            try:
                self._let_go(got)
            finally:
                self._busy = False

    def _tls_news(self, read: Callable[[], bytes | memoryview | None]) -> int:
        """:func:`news` of a kept TLS connection: what its carrier holds (``read``) taken into
        TLS (:meth:`_tls_ended`); application data in it, or in what TLS held already (it
        came with the last answer), is stray, unless it is empty lines (``held``) or a 408
        (:func:`closes_idle`)."""
        upstream = self.upstream
        assert type(upstream) is TlsByteStream
        ended = self._tls_ended(read)
        held = upstream.held
        if held:
            return TIMED_OUT if closes_idle(held) else STRAY
        return ENDED if ended else QUIET

    def _tls_ended(self, read: Callable[[], bytes | memoryview | None]) -> bool:
        """What a kept TLS connection's carrier holds (``read``) taken into TLS; whether the
        carrier ended or TLS did — a close_notify, maybe with the TCP side still open
        (asyncio's waits for ours): the next request would go out on a dead session — there
        or in what TLS held already."""
        upstream = self.upstream
        assert type(upstream) is TlsByteStream
        try:
            while (data := read()) is not None:
                if not data or upstream.absorb(data):
                    return True
        except (StreamClosedError, OSError):  # the carrier's loss, raised by its read
            return True
        return upstream.absorb(b"")

    def _let_go(self, got: int) -> None:
        """Let the kept connection go for what it got (:data:`ENDED`, :data:`STRAY`,
        :data:`TIMED_OUT`: its end, logged at debug only — targets close idle connections all
        the time)."""
        if got == TIMED_OUT:
            route = self.ex.route
            log.debug(
                f"{self.proxy.front} front: the target closed its idle connection (408)",
                extra=kv(peer=self.peer, node=route.node.name if route is not None else ""),
            )
        self._run(self.ex.upstream_ended(stray=got == STRAY))

    def _count_stray(self) -> None:
        """The kept connection is let go for bytes it was not asked for: logged (once: the
        connection goes with them) and counted."""
        route = self.ex.route
        node = route.node.name if route is not None else ""
        front = self.proxy.front
        why = "the target sent bytes nobody asked for: its connection is let go"
        log.info(f"{front} front: {why}", extra=kv(peer=self.peer, node=node))
        self.ctx.metrics.upstream_stray.labels(front=front).inc()
