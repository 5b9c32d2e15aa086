"""A parsed HTTP/1.1 head as :mod:`ravenproxy.server.http_messages` makes it: the fields as
llhttp gave them, decoded for what routes or rewrites it — not for a response that goes on as
parsed (:class:`PlainHead`), and for a request only those routing reads unless more is asked
(:class:`RequestHead`)."""

from __future__ import annotations

from ravenproxy.server.podroutes import HOP_BY_HOP

Headers = list[tuple[str, str]]


class Head:
    """A parsed request or response head. ``start``: the method (request) or the reason phrase
    (response); ``target``: the request-target; ``status``: 0 for a request. (Slots, not a
    named tuple: :class:`PlainHead` decodes its fields only when asked.)"""

    __slots__ = (
        "fields",
        "headers",
        "lower",
        "routing",
        "size",
        "start",
        "status",
        "target",
        "version",
        "wire",
    )

    plain = False
    """A response with a Content-Length and no hop-by-hop field (:data:`HOP_BY_HOP`): nothing
    of it is dropped or added, it goes on as :attr:`wire`. True for a :class:`PlainHead` only
    (the class says it: no flag kept per head)."""
    line: bytes | None = None
    """A request's line as it came (:attr:`RequestHead.line`); None for any other head."""
    headers: Headers
    """The fields decoded (latin-1), in order."""
    lower: dict[str, str]
    """The fields by lower-cased name (repeated ones joined with ", ")."""
    routing: dict[str, str]
    """:attr:`lower`'s fields named in :data:`ROUTING_NAMES` (hop-by-hop, framing, Host, Via):
    all that routing, the hop-by-hop rules and keep-alive read (:attr:`lower` itself for a
    head decoded whole)."""

    def __init__(
        self,
        start: str,
        target: str,
        status: int,
        version: str,
        fields: list[tuple[bytes, bytes]],
        size: int,
        wire: bytes = b"",
    ) -> None:
        self.start, self.target, self.status, self.version = start, target, status, version
        self.fields = fields
        """The fields as parsed (name, value), in order."""
        self.size = size
        """Bytes of the head on the wire."""
        self.wire = wire
        """A response's head as :func:`~ravenproxy.server.http_rewrite.response_framing`
        writes it when it drops and adds no field: ``HTTP/1.1``, the status and reason, each
        field as parsed on a ``name: value`` line. A request's: its fields as parsed on their
        ``name: value`` lines joined by CRLF (no request line, no end): what
        :func:`~ravenproxy.server.http_rewrite.request_head` sends on when it drops none."""
        # A response that is not plain is rewritten by its fields.
        self.headers, self.lower = _decoded(fields)
        self.routing = self.lower


class _DecodedWhenAsked(Head):
    """A head whose :attr:`headers` and :attr:`lower` are decoded when first asked for."""

    __slots__ = ("_decoded",)

    _decoded: tuple[Headers, dict[str, str]]
    """Set when first asked for."""

    @property
    def headers(self) -> Headers:  # type: ignore[override]  # read-only: decoded on demand
        return self._forms()[0]

    @property
    def lower(self) -> dict[str, str]:  # type: ignore[override]
        return self._forms()[1]

    def _forms(self) -> tuple[Headers, dict[str, str]]:
        try:
            return self._decoded
        except AttributeError:
            self._decoded = _decoded(self.fields)
            return self._decoded


class PlainHead(_DecodedWhenAsked):
    """A plain response's head (:attr:`Head.plain`): it goes on as parsed, so neither its
    fields nor its reason phrase are decoded unless something asks for them."""

    __slots__ = ("reason",)

    plain = True
    target = ""  # a response's (Head's slot left unset)
    reason: bytes
    """The reason phrase as parsed (:attr:`start` decoded from it when asked)."""

    def __init__(  # not Head's: nothing decoded (the parse makes its heads without this call)
        self,
        reason: bytes,
        status: int,
        version: str,
        fields: list[tuple[bytes, bytes]],
        size: int,
        wire: bytes,
    ) -> None:
        self.reason, self.status, self.version = reason, status, version
        self.fields, self.size, self.wire = fields, size, wire

    @property
    def start(self) -> str:  # type: ignore[override]  # read-only: decoded on demand
        return self.reason.decode("latin-1")

    @property
    def routing(self) -> dict[str, str]:  # type: ignore[override]
        return self._forms()[1]


class RequestHead(_DecodedWhenAsked):
    """A parsed request's head: routed by :attr:`routing` (decoded as it is parsed: a name
    lookup per field), its other fields decoded only if something asks
    for :attr:`headers` or :attr:`lower` (a request with a hop-by-hop field, rewritten): most go
    on as parsed (:attr:`Head.wire`), and their User-Agent, Accept or Authorization is read by
    no one."""

    __slots__ = ("line",)

    status = 0  # a request's (Head's slot left unset: a store less a request that differs)
    line: bytes | None
    """The request line as it came (``method SP target SP HTTP/1.1`` CRLF), when the request
    was HTTP/1.1 and the parse saw its line whole at the start of a read: the line sent on when
    the target goes on unchanged (the bytes the line's format makes: the method is ASCII, the
    target latin-1 round-trips). None otherwise."""

    def __init__(
        self,
        method: str,
        target: str,
        version: str,
        fields: list[tuple[bytes, bytes]],
        size: int,
        wire: bytes,
        routing: dict[str, str] | None = None,
        line: bytes | None = None,
    ) -> None:
        """``routing``: the :attr:`routing` of an earlier head with the same ``fields`` (read
        only, so shared), else made here. (The parse makes its heads without this call:
        :func:`~ravenproxy.server.http_messages.Parsed.on_headers_complete`, a request that
        differs.)"""
        self.start, self.target, self.version = method, target, version
        self.fields, self.size, self.wire = fields, size, wire
        self.routing = routing_of(fields) if routing is None else routing
        self.line = line


def routing_of(fields: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """:attr:`Head.routing` of a request's ``fields``: _decoded's by-name form of the fields
    named in ROUTING_NAMES only, no other field decoded (a lower-cased name looked up per
    field)."""
    routing: dict[str, str] = {}
    for k, v in fields:
        key = _routing_name(k.lower())
        if key is not None:
            value = v.decode("latin-1")
            seen = routing.get(key)
            routing[key] = value if seen is None else f"{seen}, {value}"
    return routing


def _decoded(fields: list[tuple[bytes, bytes]]) -> tuple[Headers, dict[str, str]]:
    """``fields`` decoded, in order and by lower-cased name."""
    headers: Headers = []
    lower: dict[str, str] = {}
    for k, v in fields:
        name, value = k.decode("latin-1"), v.decode("latin-1")
        headers.append((name, value))
        key = name.lower()
        seen = lower.get(key)
        lower[key] = value if seen is None else f"{seen}, {value}"
    return headers, lower


ROUTING_NAMES: dict[bytes, str] = {
    n.encode(): n for n in sorted(HOP_BY_HOP | {"host", "via", "content-length"})
}
"""The lower-cased names of :attr:`Head.routing`'s fields (as llhttp gives a name, and
decoded): hop-by-hop (:data:`HOP_BY_HOP`: Connection, Upgrade, Transfer-Encoding,
X-Tunnel-Proxy-Host, ...), Host, Via, Content-Length."""
_routing_name = ROUTING_NAMES.get


FRAMING_KIND: dict[bytes, int] = {b"content-length": 1, **{n.encode(): 2 for n in HOP_BY_HOP}}
"""A lower-cased field name's part in :attr:`Head.plain`: 1 for Content-Length, 2 for a
hop-by-hop field (:data:`HOP_BY_HOP`). A head's parts add up to 1 when it is plain: one
Content-Length (llhttp refuses a second) and no hop-by-hop field."""


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


def keeps_alive(head: Head) -> bool:
    """The sender keeps the connection open after this message (RFC 9112 §9.3). A client's
    ``Proxy-Connection`` (pre-standard, sent to proxies) counts as ``Connection``, as llhttp
    counts it: after a ``close`` in it the parser takes no more on the connection."""
    lower = head.routing
    connection = lower.get("connection")
    proxy = lower.get("proxy-connection")
    if not connection and not proxy:  # most messages: no option listed, the version decides
        return head.version == "1.1"
    tokens = _tokens(connection) if connection else set()
    if proxy:
        tokens |= _tokens(proxy)
    if head.version == "1.1":
        return "close" not in tokens
    return head.version == "1.0" and "keep-alive" in tokens
