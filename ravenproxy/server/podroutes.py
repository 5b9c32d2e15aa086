"""Where an HTTP request wants to go, and which headers travel on: pure functions, no I/O.

A request names its destination in one of these ways, tried in this order:

1. an absolute URI (``GET http://edge-1:9100/metrics``: a forward-proxy request, what Prometheus
   sends with ``proxy_url``);
2. ``X-Tunnel-Proxy-Host: node[:port]``;
3. ``?nodeName=node[:port]`` in the query;
4. a kubelet pod path (``/containerLogs/NS/POD/…``, ``/exec/…``, ``/attach/…``,
   ``/portForward/…``, ``/run/…``): the pod's node, from the model;
5. ``Host: node[:port]``.

Without a port the node's kubelet port is meant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

from ravenproxy.server.http1 import BadRequest, split_authority

TUNNEL_HOST_HEADER = "x-tunnel-proxy-host"
NODE_NAME_PARAM = "nodeName"

POD_PATH_PREFIXES = ("containerLogs", "exec", "attach", "portForward", "run")
"""Kubelet endpoints whose path is ``/<prefix>/<namespace>/<pod>/…``."""
_POD_PATH_STARTS = tuple(f"/{prefix}/" for prefix in POD_PATH_PREFIXES)
"""How a pod path begins: a target that begins otherwise names no pod (one C call asks)."""
_POD_PATH_HEADS = frozenset(start[1:5] for start in _POD_PATH_STARTS)
"""The four characters after the ``/`` of each :data:`_POD_PATH_STARTS`."""
_POD_PATH_FOURTHS = "".join(sorted({head[3] for head in _POD_PATH_HEADS}))
"""The fourth character of each of :data:`_POD_PATH_HEADS` (``/act``): a target whose fifth is
none of them begins with none of them."""

# RFC 9110 §7.6.1: hop-by-hop fields, never forwarded; plus the framing fields the exchange sets
# itself and the proxy's own routing header.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "proxy-connection",
        "keep-alive",
        "te",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        TUNNEL_HOST_HEADER,
    }
)


# Slotted, not frozen: one is made per request that names another node than the last, and a
# frozen dataclass's __init__ sets each of its 7 fields through object.__setattr__. No one
# hashes a destination; only its target changes (same_node).
@dataclass(slots=True)
class Destination:
    via: str
    """How the request named it: absolute-uri, tunnel-header, node-name-query, pod-path, host."""
    host: str = ""
    """A node name or an IP; empty for a pod path."""
    port: int | None = None
    """None: the node's kubelet port."""
    pod: tuple[str, str] | None = None
    """(namespace, name) for a pod path."""
    target: str = "/"
    """The request-target to send on, in origin form. The one field that changes: set to a
    keep-alive connection's next request's target when :func:`same_node` says the rest stands
    for it too (routing never reads it: the router's memo of this object stays true)."""
    authority: str | None = None
    """A Host value to send instead of the client's (absolute-URI requests)."""
    scheme: str | None = None
    """The absolute URI's scheme, when it had one."""


def pod_of_path(path: str) -> tuple[str, str] | None:
    """``/exec/ns/pod/container?…`` → ``("ns", "pod")``; None for any other path."""
    parts = path.split("?", 1)[0].split("/")
    # "", prefix, namespace, pod, ...
    if len(parts) >= 4 and parts[0] == "" and parts[1] in POD_PATH_PREFIXES:
        namespace, pod = parts[2], parts[3]
        if namespace and pod:
            return namespace, pod
    return None


_AUTHORITIES: dict[str, tuple[str, int | None]] = {}
""":func:`_authority` by the text it was given (a Host or X-Tunnel-Proxy-Host value, a
nodeName): a client sends the same one with each request, and the same few come from every
client. Bounded: emptied when full; a value longer than a host and port can be is not kept."""
_AUTHORITIES_MAX = 1024
_known_authority = _AUTHORITIES.get


def _authority(text: str) -> tuple[str, int | None]:
    """``node[:port]`` → (host, port or None); a :class:`BadRequest` 400 for anything else.
    Callers ask :data:`_AUTHORITIES` first (``_known_authority``)."""
    stripped = text.strip()
    try:
        host, port = split_authority(stripped, default_port=0)
    except BadRequest:
        raise BadRequest(400, f"bad node address {stripped[:80]!r}") from None
    parsed = host, (port or None)
    if len(text) <= 300:  # a DNS name is at most 253 characters, a port 6 more
        if len(_AUTHORITIES) >= _AUTHORITIES_MAX:
            _AUTHORITIES.clear()
        _AUTHORITIES[text] = parsed
    return parsed


def _node_name(query: str) -> str | None:
    """The first non-empty ``nodeName`` of a query, as ``parse_qsl`` decodes it. Asked only for
    a query in which a key can decode to it (the name spelled out, or some of it
    percent-encoded; ``+`` decodes to a space, which it has none of): most queries (kubectl's
    ``?follow=true``, a scrape's) name no node, and parse_qsl splits and unquotes each pair."""
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == NODE_NAME_PARAM and value:
            return value
    return None


def _absolute(target: str) -> Destination:
    """An absolute-URI request's destination (a forward proxy's request: ``GET http://…``)."""
    try:
        url = urlsplit(target)
    except ValueError:  # e.g. an unclosed "[" of an IPv6 literal
        raise BadRequest(400, f"bad absolute URI {target[:80]!r}") from None
    if not url.netloc or "@" in url.netloc:
        raise BadRequest(400, f"bad absolute URI {target[:80]!r}")
    default = 443 if url.scheme == "https" else 80
    uhost, uport = split_authority(url.netloc, default_port=default)
    path = url.path or "/"
    origin = path + (f"?{url.query}" if url.query else "")
    return Destination(
        "absolute-uri", uhost, uport, target=origin, authority=url.netloc, scheme=url.scheme
    )


def find_destination(
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]],
    lower: Mapping[str, str] | None = None,
) -> Destination:
    """Where the request goes (not yet resolved to a node: that needs the model). ``lower``:
    the headers by lower-cased name, when the caller has them already (``headers`` is then
    not read): of them only X-Tunnel-Proxy-Host and Host (a head's ``routing`` has both)."""
    if lower is None:
        lower = {k.lower(): v for k, v in headers}
    if method == "CONNECT":
        chost, cport = split_authority(target)
        return Destination("connect", chost, cport, target=target)
    # Origin form (most requests) told by its first character, asked once: a one-character
    # slice is a cached string, while str.startswith parses its arguments by format (~500
    # instructions).
    if target[:1] != "/":
        if target.startswith(("http://", "https://")):
            return _absolute(target)
        if target == "*" and method == "OPTIONS":
            raise BadRequest(400, "OPTIONS * names no node")
        raise BadRequest(400, f"bad request target {target[:80]!r}")
    tunnel_host = lower.get(TUNNEL_HOST_HEADER)
    if tunnel_host:
        host, port = _known_authority(tunnel_host) or _authority(tunnel_host)
        return Destination("tunnel-header", host, port, None, target)
    # The query's pre-check asked of the whole target first (`in`: no arguments parsed, no
    # partition made): most targets hold neither, and one that does is looked at as before.
    if NODE_NAME_PARAM in target or "%" in target:
        query = target.partition("?")[2]
        if query and (NODE_NAME_PARAM in query or "%" in query):  # else no key decodes to it
            node_name = _node_name(query)
            if node_name is not None:
                host, port = _known_authority(node_name) or _authority(node_name)
                return Destination("node-name-query", host, port, None, target)
    # A pod path's start told by its four characters after the "/" first (a set lookup):
    # str.startswith parses its arguments by format, ~500 instructions a request.
    if target[1:5] in _POD_PATH_HEADS and target.startswith(_POD_PATH_STARTS):
        pod = pod_of_path(target)
        if pod is not None:
            return Destination("pod-path", pod=pod, target=target)
    host_header = lower.get("host")
    if not host_header:
        raise BadRequest(400, "the request names no node (no Host, X-Tunnel-Proxy-Host, nodeName)")
    host, port = _known_authority(host_header) or _authority(host_header)
    # Positional: a call with keywords is not specialized (one a request that differs).
    return Destination("host", host, port, None, target)


def same_node(last: Destination, target: str) -> bool:
    """Whether ``last`` (found by :func:`find_destination` for a request with the method,
    version and fields of one whose target is ``target``) is that request's destination too,
    but for its :attr:`~Destination.target`: when the node and port were named by
    X-Tunnel-Proxy-Host (which no target overrides but a non-origin one), or by Host and
    ``target`` names no node itself (no ``nodeName`` nor ``%`` in it, no pod path's start).
    A keep-alive connection's next request then takes ``last`` with its target set
    (:meth:`~ravenproxy.server.exchange.Exchange._on_request`): no destination made, and the
    router's memo made for ``last`` is reused without a field compared."""
    # Indexes, not slices where it can (a slice is an object made and freed: ~300 and ~400
    # more a call); a pod path's head is looked up only when its fourth character after the
    # "/" is one of theirs (:data:`_POD_PATH_FOURTHS`).
    if not target or target[0] != "/":
        return False
    via = last.via
    if via == "host":
        return not (
            NODE_NAME_PARAM in target
            or "%" in target
            or (
                len(target) > 4
                and target[4] in _POD_PATH_FOURTHS
                and target[1:5] in _POD_PATH_HEADS
            )
        )
    return via == "tunnel-header"


def connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    """The lower-cased options listed in every ``Connection`` header."""
    tokens: set[str] = set()
    for key, value in headers:
        if key.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def wants_upgrade(headers: Sequence[tuple[str, str]]) -> str | None:
    """The ``Upgrade`` value when ``Connection`` lists ``upgrade`` (WebSocket, SPDY/3.1)."""
    if "upgrade" not in connection_tokens(headers):
        return None
    for key, value in headers:
        if key.lower() == "upgrade" and value.strip():
            return value.strip()
    return None


def forwardable(
    headers: Sequence[tuple[str, str]],
    *,
    upgrade: str | None = None,
    names: Iterable[str] | None = None,
) -> list[tuple[str, str]]:
    """Drop hop-by-hop fields (RFC 9110 §7.6.1): the fixed set and every field the Connection
    header names. An upgrade keeps ``Connection: Upgrade`` and its ``Upgrade`` field, which the
    next hop needs to switch protocols. ``names``: the lower-cased field names, when the caller
    has them (a head without a hop-by-hop field then goes on as it is)."""
    if upgrade is None and names is not None and HOP_BY_HOP.isdisjoint(names):
        return list(headers)  # no Connection field either: nothing it could name
    # Framing and Host are never hop-by-hop, whatever a Connection header claims.
    named = connection_tokens(headers) - {"content-length", "host"}
    kept = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP and k.lower() not in named]
    if upgrade is not None:
        kept += [("Connection", "Upgrade"), ("Upgrade", upgrade)]
    return kept
