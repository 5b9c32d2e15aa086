"""request_head's shortcut: a request without a hop-by-hop field, with its Host and no absolute
URI goes on as its fields were parsed, with Via added: byte for byte (and with the same upgrade
and chunking answers) what the general rule writes from the decoded fields."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.server.http1 import BadRequest
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import HEAD, Parsed
from ravenproxy.server.http_rewrite import Outbound, fields, request_head
from ravenproxy.server.podroutes import Destination, find_destination, forwardable, wants_upgrade
from ravenproxy.server.router import Route
from tests.helpers import examples

from .test_exchange import VIA, route


def _general(request: Head, dest: Destination, route: Route, via: str) -> Outbound:
    """The rule request_head had for every request (before its shortcut)."""
    headers, lower = request.headers, request.lower
    upgrade = wants_upgrade(headers) if "connection" in lower else None
    out = forwardable(headers, upgrade=upgrade, names=lower)
    if dest.authority is not None:
        out = [(k, v) for k, v in out if k.lower() != "host"]
        out.insert(0, ("Host", dest.authority))
    elif "host" not in lower:
        out.insert(0, ("Host", f"{dest.host or route.node.name}:{route.target.port}"))
    chunked = "chunked" in lower.get("transfer-encoding", "").lower()
    if chunked:
        out.append(("Transfer-Encoding", "chunked"))
    out.append(("Via", f"{request.version} {via}"))
    head = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
    return Outbound(head + fields(out) + b"\r\n", upgrade is not None, chunked)


_NAMES = st.sampled_from(
    [
        b"Host",
        b"host",
        b"Accept",
        b"User-Agent",
        b"X-Trace",
        b"Connection",
        b"Keep-Alive",
        b"Upgrade",
        b"Proxy-Connection",
        b"TE",
        b"Transfer-Encoding",
        b"X-Tunnel-Proxy-Host",
        b"Content-Length",
    ]
)
_VALUES = st.sampled_from(
    [b"edge-1:10250", b"edge-1", b"*/*", b"close", b"upgrade", b"chunked", b"0", b"\xe9t\xe9", b""]
)


@settings(max_examples=examples(400), deadline=None)
@given(
    fields_=st.lists(st.tuples(_NAMES, _VALUES), max_size=6),
    target=st.sampled_from(
        [b"/metrics", b"/stats?x=1", b"/m?nodeName=edge-2", b"/exec/ns/p/c", b"http://edge-2/m"]
    ),
    version=st.sampled_from([b"1.1", b"1.0"]),
)
def test_request_head_is_the_general_rule_for_any_request(
    fields_: list[tuple[bytes, bytes]], target: bytes, version: bytes
) -> None:
    data = b"GET " + target + b" HTTP/" + version + b"\r\n"
    data += b"".join(k + b": " + v + b"\r\n" for k, v in fields_) + b"\r\n"
    parsed = Parsed(response=False)
    parsed.feed(data)
    if not parsed.events:
        return
    kind, request = parsed.events.popleft()
    if kind != HEAD:
        return  # llhttp refused it (a bad Content-Length, both framings)
    assert isinstance(request, Head)
    try:
        dest = find_destination(request.start, request.target, request.headers, request.lower)
    except BadRequest:
        return  # refused before a head is built
    edge = route("edge-1", 10250)
    assert request_head(request, dest, edge, VIA) == _general(request, dest, edge, VIA)
