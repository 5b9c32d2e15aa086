"""A small Kubernetes REST client: HTTP/1.1 and JSON on asyncio streams, nothing else.

Everything ravenproxy asks the API reads raw JSON (the model parsers take Kubernetes JSON), so
the client is a request → (status, JSON object) call, a streamed answer read as JSON lines (a
watch), and a pool of kept-alive connections. Responses are parsed by httptools (llhttp, the
parser uvicorn uses; chunked bodies are decoded there). Where it goes and who it is comes from
:mod:`ravenproxy.kube.kubeconfig`: a bearer token (a token file is re-read as the kubelet
rotates it) or a client certificate (its files loaded again for a new connection once they
change), and the CA to trust.

Connection failures raise ``OSError`` (timeouts are ``TimeoutError``, an ``OSError``); a server
that does not speak HTTP is a :class:`KubeError` with status 0. HTTP error statuses are not
raised: the caller decides what a 404 or a 409 means.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import httptools

from ravenproxy.errors import RavenProxyError
from ravenproxy.kube.kubeconfig import ClusterAccess, KubeConfigError, load
from ravenproxy.log import kv

log = logging.getLogger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
USER_AGENT = "ravenproxy"
_READ_SIZE = 65536
_CLOSE_WAIT = 5.0
_TEXT_MESSAGE = 200
"""How much of an error answered in plain text becomes its message."""
_REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods sent again when a kept-alive connection breaks before their answer."""

MAX_HEAD = 1024 * 1024
"""Bytes an answer's status line and headers may take, at most (kube-apiserver's are a few
hundred; Go's client allows 10 MB, nginx's proxy 4 to 8 KiB a header line)."""

MAX_BODY = 256 * 1024 * 1024
"""Bytes of an answer read whole (a list, a get) held at once, at most: a LIST of 10 000 Nodes
is ~150 MB of JSON. A larger one is dropped with a :class:`KubeError`, not read until memory
runs out."""

MAX_LINE = 16 * 1024 * 1024
"""Bytes of one line of a streamed answer (a watch event: one object, which etcd keeps under
1.5 MiB and kube-apiserver accepts up to 3 MiB), at most."""


class KubeError(RavenProxyError):
    """The Kubernetes API answered with an error we cannot recover from by relisting."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def resource_version(obj: Any) -> str:
    """``metadata.resourceVersion`` of an API object ("" when it has none)."""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def status_message(body: Mapping[str, Any], status: int) -> str:
    """The message of a ``Status`` answer (what kube-apiserver sends with an error)."""
    return str(body.get("message") or body.get("reason") or f"HTTP {status}")


def as_object(raw: bytes) -> dict[str, Any]:
    """A body as a JSON object; an empty body, or one that is not an object, reads as ``{}``."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class _Parse:
    """httptools' callbacks for one response: status, headers, body pieces, completion."""

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.keep_alive = False
        self.headers_done = False
        self.complete = False
        self.body: list[bytes] = []
        self.size = 0  # bytes in body
        self.chunked = False
        self.length = False

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True
        elif name == b"content-length":
            self.length = True

    def on_headers_complete(self) -> None:
        # Asked here: one feed may hold the whole answer, and llhttp forgets a message's
        # flags once it is complete.
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.size += len(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def abort(self) -> None:
        """Drop a connection whose answer did not end (an error, a timeout, a cancellation):
        no close_notify exchange, which a server that stopped answering (a link cut) would
        make wait :data:`_CLOSE_WAIT` more seconds."""
        self.writer.transport.abort()

    async def close(self) -> None:
        # A TLS close waits for the peer's close_notify: a peer that never sends it is cut.
        self.writer.close()
        try:
            async with asyncio.timeout(_CLOSE_WAIT):
                await self.writer.wait_closed()
        except (OSError, TimeoutError):
            self.writer.transport.abort()
        except asyncio.CancelledError:
            self.writer.transport.abort()
            raise


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much of an answer the client holds, at most (bytes): see :data:`MAX_HEAD`,
    :data:`MAX_BODY`, :data:`MAX_LINE`. Past one, the answer fails with a :class:`KubeError`
    and its connection is dropped."""

    head: int = MAX_HEAD
    body: int = MAX_BODY
    line: int = MAX_LINE


class Response:
    """One answer: :attr:`status`, then the body whole (:meth:`read`, :meth:`json`) or as lines
    (:meth:`lines`), each read waiting at most ``read_timeout`` seconds for the next bytes."""

    def __init__(self, conn: _Connection, read_timeout: float, limits: Limits) -> None:
        self._conn = conn
        self._read_timeout = read_timeout
        self._limits = limits
        self._parse = _Parse()
        self._parser = httptools.HttpResponseParser(self._parse)
        self._parse.parser = self._parser
        self.status = 0
        self.received = 0
        self._framing = 0
        """Bytes read past the head that brought no body byte (trailers, chunk framing)."""

    async def _more(self) -> bool:
        """Feed the parser the next bytes; False once the connection has ended."""
        async with asyncio.timeout(self._read_timeout):
            data = await self._conn.reader.read(_READ_SIZE)
        if not data:
            p = self._parse
            if p.headers_done and not p.chunked and not p.length:
                p.complete = True  # a body delimited by the end of the connection
                return False
            raise ConnectionResetError("the API server closed the connection mid-answer")
        self.received += len(data)
        p = self._parse
        past_head, size = p.headers_done, p.size
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise KubeError(0, f"not an HTTP answer: {exc}") from None
        if not p.headers_done:
            if self.received > self._limits.head:
                raise KubeError(0, f"answer head over {self._limits.head} bytes")
        elif past_head and p.size == size and not p.complete:
            # No body byte: a chunked answer's trailers (httptools joins a field's pieces in
            # memory) or its framing, bounded as a head is.
            self._framing += len(data)
            if self._framing > self._limits.head:
                raise self._over("answer trailers (or framing)", self._limits.head)
        else:
            self._framing = 0
        return True

    def _over(self, what: str, limit: int) -> KubeError:
        """An answer past a limit (the caller drops its connection and logs the error)."""
        return KubeError(self.status, f"{what} over {limit} bytes, dropped")

    async def start(self) -> None:
        while not self._parse.headers_done:
            await self._more()
        self.status = self._parse.status

    @property
    def complete(self) -> bool:
        """The answer was read to its end."""
        return self._parse.complete

    @property
    def reusable(self) -> bool:
        return self._parse.complete and self._parse.keep_alive

    async def read(self) -> bytes:
        while True:
            if self._parse.size > self._limits.body:
                raise self._over("answer body", self._limits.body)
            if self._parse.complete:
                break
            await self._more()
        body = b"".join(self._parse.body)
        self._parse.body.clear()
        self._parse.size = 0
        return body

    async def json(self) -> dict[str, Any]:
        """The body as a JSON object (``{}`` when empty or not an object); an error answered
        in plain text (kube-apiserver's "404 page not found" for an API group it does not
        serve, a proxy's error page) as ``{"message": <its text>}``, for :func:`status_message`."""
        raw = await self.read()
        body = as_object(raw)
        if not body and self.status >= 400 and raw.strip() and not raw.lstrip().startswith(b"{"):
            return {"message": " ".join(raw[:_TEXT_MESSAGE].decode(errors="replace").split())}
        return body

    async def lines(self) -> AsyncIterator[bytes]:
        """Non-empty lines of the body as they arrive (a watch's events), until it ends."""
        # Pieces of a line not yet ended are kept apart and joined once its end arrives: a
        # large object in many pieces is not copied again for every piece.
        partial: list[bytes] = []
        held = 0  # bytes in partial
        while True:
            pieces, self._parse.body, self._parse.size = self._parse.body, [], 0
            for piece in pieces:
                if b"\n" not in piece:
                    partial.append(piece)
                    held += len(piece)
                    continue
                *whole, rest = b"".join([*partial, piece]).split(b"\n")
                partial, held = ([rest], len(rest)) if rest else ([], 0)
                for line in whole:
                    if len(line) > self._limits.line:
                        raise self._over("a line", self._limits.line)
                    if line.strip():
                        yield line
            if held > self._limits.line:
                raise self._over("a line", self._limits.line)
            if self._parse.complete:
                break
            await self._more()
        tail = b"".join(partial)
        if tail.strip():
            yield tail


class RestClient:
    """HTTP/1.1 JSON calls to one API server, over a few kept-alive connections.

    ``connect_timeout`` bounds the TCP connect and TLS handshake; ``read_timeout`` bounds every
    wait for bytes of an answer (a watch passes its own, longer than its server-side timeout).
    """

    def __init__(
        self,
        access: ClusterAccess,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_idle: int = 4,
        user_agent: str = USER_AGENT,
        limits: Limits | None = None,
    ) -> None:
        url = urlsplit(access.server)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise KubeError(0, f"{access.origin}: server: not an http(s) URL: {access.server}")
        self.access = access
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self._prefix = url.path.rstrip("/")
        self._host_header = url.netloc.rsplit("@", 1)[-1]
        self._ssl = access.ssl_context()
        self._pair_stamp = access.pair_stamp()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._max_idle = max_idle
        self._user_agent = user_agent
        self.limits = limits or Limits()
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._closed = False
        self.connects = 0
        """Connections opened so far (kept-alive ones are reused)."""

    async def __aenter__(self) -> RestClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection (streams still open end with a connection error)."""
        self._closed = True
        idle, busy = [*self._idle], [*self._busy]
        self._idle.clear()
        self._busy.clear()
        for conn in busy:
            conn.abort()  # mid-answer: nothing to close gracefully
        for conn in idle:
            await conn.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """One call, answered as (status, JSON object); ``body`` is sent as JSON."""
        async with self.open(
            method, path, query=query, body=body, content_type=content_type, read_timeout=timeout
        ) as resp:
            return resp.status, await resp.json()

    @contextlib.asynccontextmanager
    async def open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        read_timeout: float | None = None,
    ) -> AsyncIterator[Response]:
        """Send a request and yield its :class:`Response` once the headers are in; its
        connection goes back to the pool if the body was read to its end."""
        head = self._head(method, path, query, body, content_type)
        timeout = self.read_timeout if read_timeout is None else read_timeout
        conn, resp = await self._send(head, timeout, replayable=method in _REPLAYABLE)
        self._busy.add(conn)
        try:
            yield resp
        finally:
            self._busy.discard(conn)
            if resp.reusable and not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(conn)
            elif resp.complete:
                await conn.close()
            else:
                conn.abort()

    def _head(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
    ) -> bytes:
        target = self._prefix + quote(path, safe="/:@")
        if query:
            pairs = {k: _query_value(v) for k, v in query.items() if v is not None}
            if pairs:
                target += "?" + urlencode(pairs)
        lines = [
            f"{method} {target} HTTP/1.1",
            f"Host: {self._host_header}",
            f"User-Agent: {self._user_agent}",
            f"Accept: {JSON}",
        ]
        auth = self.access.authorization()
        if auth is not None:
            lines.append(f"Authorization: {auth}")
        payload = b""
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            lines.append(f"Content-Type: {content_type}")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(payload)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload

    async def _send(
        self, head: bytes, timeout: float, *, replayable: bool
    ) -> tuple[_Connection, Response]:
        # A kept-alive connection the server has closed meanwhile is dropped unused. One that
        # fails once the request is written, before any byte of an answer, sends it again on a
        # new connection only if it may be repeated (a read): the server may have acted on a
        # create or a patch before the connection broke. Go's transport decides the same way.
        while self._idle:
            conn = self._idle.pop()
            if conn.writer.is_closing() or conn.reader.at_eof() or conn.reader.exception():
                conn.abort()
                continue
            resp = Response(conn, timeout, self.limits)
            try:
                conn.writer.write(head)
                await conn.writer.drain()
                await resp.start()
            except ConnectionError:
                conn.abort()
                if resp.received or not replayable:
                    raise
                continue
            except BaseException:
                conn.abort()
                raise
            return conn, resp
        conn = await self._connect()
        resp = Response(conn, timeout, self.limits)
        try:
            conn.writer.write(head)
            await conn.writer.drain()
            await resp.start()
        except BaseException:
            conn.abort()
            raise
        return conn, resp

    def _reload_pair(self) -> None:
        """A new connection presents the client certificate its files hold now: one that was
        rotated (a kubelet's) is loaded again, as client-go does; one that does not load
        (caught mid-swap) is tried again at the next connection, the loaded one used."""
        stamp = self.access.pair_stamp()
        if stamp is None or stamp == self._pair_stamp:
            return
        try:
            access = self.access.reread_pair()
            ctx = access.ssl_context()
        except KubeConfigError as exc:
            log.warning(
                "kube: client certificate files changed and do not load", extra=kv(reason=exc)
            )
            return
        self.access, self._ssl, self._pair_stamp = access, ctx, stamp
        log.info("kube: client certificate reloaded", extra=kv(origin=access.origin))

    async def _connect(self) -> _Connection:
        if self._closed:
            raise ConnectionError("the Kubernetes client is closed")
        self._reload_pair()
        async with asyncio.timeout(self.connect_timeout):
            reader, writer = await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=(self.access.tls_server_name or self.host)
                if self._ssl is not None
                else None,
                limit=_READ_SIZE,
            )
        self.connects += 1
        log.debug("kube: connected", extra=kv(host=self.host, port=self.port))
        return _Connection(reader, writer)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def connect(kubeconfig: str | os.PathLike[str] | None, **kwargs: Any) -> RestClient:
    """A client from a kubeconfig file, or from the in-cluster service account when None
    (connections are opened on the first call)."""
    return RestClient(load(kubeconfig), **kwargs)
