"""response_framing's shortcut: a length-framed final answer without a hop-by-hop field goes on
as parsed (``Head.wire``), byte for byte what the general path writes (the status line and every
field re-serialised, ``Connection: close`` added when the client's connection ends), and with
the same body framing and keep-alive decisions; every other answer takes the general path."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ravenproxy.server.http_heads import Head, PlainHead, keeps_alive
from ravenproxy.server.http_messages import ERROR, HEAD, Parsed
from ravenproxy.server.http_rewrite import Framing, fields, response_framing
from ravenproxy.server.podroutes import HOP_BY_HOP, forwardable
from tests.helpers import examples

SCRAPE = (
    b"HTTP/1.1 200 OK\r\nDate: Fri, 04 Dec 2026 18:50:19 GMT\r\n"
    b"Content-Type: text/plain; version=0.0.4\r\nContent-Length: 5\r\n\r\n"
)


def parse(data: bytes) -> Head:
    parsed = Parsed(response=True)
    parsed.feed(data)
    kind, head = parsed.events.popleft()
    assert kind == HEAD and isinstance(head, Head)
    return head


def general(
    response: Head, *, bodiless: bool, request_version: str, client_keep: bool, upstream: bool
) -> Framing:
    """response_framing's general path alone, as it was before the shortcut."""
    headers, lower = response.headers, response.lower
    kept = forwardable(headers, names=lower)
    te = lower.get("transfer-encoding", "").lower()
    if te:
        kept = [(k, v) for k, v in kept if k.lower() != "content-length"]
    up_keep = keeps_alive(response) and upstream and not bodiless
    until_close = False
    if bodiless or response.status in (204, 304):
        body_out = "none"
        if te.endswith("chunked"):
            kept.append(("Transfer-Encoding", "chunked"))
    elif te.endswith("chunked"):
        body_out = "chunked"
        kept.append(("Transfer-Encoding", "chunked"))
    elif te or "content-length" not in lower:
        until_close, up_keep = True, False
        if request_version == "1.1":
            body_out = "chunked"
            kept.append(("Transfer-Encoding", "chunked"))
        else:
            body_out = "length"
            client_keep = False
    else:
        body_out = "length"
    if not client_keep:
        kept.append(("Connection", "close"))
    head = f"HTTP/1.1 {response.status} {response.start}\r\n".encode("latin-1")
    return Framing(head + fields(kept) + b"\r\n", body_out, until_close, up_keep, client_keep)


def test_a_plain_answer_goes_on_as_it_came() -> None:
    framing = response_framing(
        parse(SCRAPE), bodiless=False, request_version="1.1", client_keep=True, upstream=True
    )
    assert framing == Framing(SCRAPE, "length", False, True, True)


def test_a_plain_answer_to_a_closing_client_says_so() -> None:
    framing = response_framing(
        parse(SCRAPE), bodiless=False, request_version="1.1", client_keep=False, upstream=True
    )
    assert framing.head == SCRAPE[:-2] + b"Connection: close\r\n\r\n"
    assert (framing.client_keep, framing.up_keep) == (False, True)


@pytest.mark.parametrize("data", [SCRAPE, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"])
def test_either_path_makes_a_framing(data: bytes) -> None:
    """Both paths make their tuple as a Framing (by tuple's constructor): its fields by name."""
    framing = response_framing(
        parse(data), bodiless=False, request_version="1.1", client_keep=True, upstream=True
    )
    assert type(framing) is Framing
    assert (framing.until_close, framing.up_keep, framing.client_keep) == (False, True, True)


def test_a_second_content_length_is_refused_not_plain() -> None:
    """A head is plain when its only framing field is one Content-Length: llhttp refuses a
    second (so FRAMING_KIND adding up to 1 is the whole rule)."""
    parsed = Parsed(response=True)
    parsed.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok")
    assert [kind for kind, _ in parsed.events] == [ERROR]


@pytest.mark.parametrize("count", [0, 1, 3])
def test_the_wire_is_the_status_line_and_each_field_on_its_line(count: int) -> None:
    """Head.wire for no field, one, several: the status line, each field as ``name: value``,
    the empty line (no field: the status line's end, then the empty line alone)."""
    lines = b"".join(b"X-%d: v%d\r\n" % (n, n) for n in range(count))
    data = b"HTTP/1.1 204 No Content\r\n" + lines + b"\r\n"
    head = parse(data)
    assert head.wire == data
    assert head.size == len(data)


def test_the_head_as_parsed_is_its_fields_re_serialised_not_its_bytes() -> None:
    odd = b"HTTP/1.1 200 OK\r\nDate:Fri, 04 Dec 2026 18:50:19 GMT  \r\nContent-Length:   5\r\n\r\n"
    head = parse(odd)
    framing = response_framing(
        head, bodiless=False, request_version="1.1", client_keep=True, upstream=True
    )
    # llhttp drops the whitespace before a value, not after it.
    assert framing.head == (
        b"HTTP/1.1 200 OK\r\nDate: Fri, 04 Dec 2026 18:50:19 GMT  \r\nContent-Length: 5\r\n\r\n"
    )
    assert head.size == len(framing.head)


ANSWERS = [
    SCRAPE,
    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
    b"HTTP/1.1 200 \r\nContent-Length: 2\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: X-Secret\r\nX-Secret: 1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nProxy-Authenticate: Basic\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nUpgrade: h2c\r\n\r\n",
    # Names found by their lines in the head (Head.plain), not by text anywhere in it:
    b"HTTP/1.1 200 OK\r\nX-Note: content-length: 5\r\nConnection-Id: 7\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: 2\r\nX-Connection: close\r\nTel: 1\r\n\r\n",
    b"HTTP/1.1 200 Content-Length: 2\r\nX-A: 1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTE: trailers\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Tunnel-Proxy-Host: edge-1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nproxy-connection: keep-alive\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length:2\r\nKEEP-ALIVE: timeout=5\r\nX-B:\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Empty: \r\nContent-Length: 2\r\n\r\n",
]


@pytest.mark.parametrize("data", ANSWERS)
def test_plain_is_a_content_length_and_no_hop_by_hop_field(data: bytes) -> None:
    """Head.plain (each name lower-cased and looked up) is the rule on its decoded fields."""
    head = parse(data)
    lower = head.lower
    assert head.plain == ("content-length" in lower and HOP_BY_HOP.isdisjoint(lower))


@pytest.mark.parametrize("data", ANSWERS)
@pytest.mark.parametrize("bodiless", [False, True])
@pytest.mark.parametrize("request_version", ["1.1", "1.0"])
@pytest.mark.parametrize("client_keep", [True, False])
@pytest.mark.parametrize("upstream", [True, False])
def test_every_answer_is_framed_as_the_general_path_frames_it(
    data: bytes, bodiless: bool, request_version: str, client_keep: bool, upstream: bool
) -> None:
    head = parse(data)
    kwargs = {
        "bodiless": bodiless,
        "request_version": request_version,
        "client_keep": client_keep,
        "upstream": upstream,
    }
    assert response_framing(head, **kwargs) == general(head, **kwargs)  # type: ignore[arg-type]


def test_a_plain_answer_goes_on_without_its_fields_decoded() -> None:
    """The shortcut reads the head's bytes and flags only: the decoded forms (what the general
    path needs) are never made for it, and are made, equal to the parsed fields, when asked."""
    head = parse(SCRAPE)
    response_framing(head, bodiless=False, request_version="1.1", client_keep=False, upstream=True)
    assert isinstance(head, PlainHead) and not hasattr(head, "_decoded")
    assert head.headers == [
        ("Date", "Fri, 04 Dec 2026 18:50:19 GMT"),
        ("Content-Type", "text/plain; version=0.0.4"),
        ("Content-Length", "5"),
    ]
    assert head.lower["content-type"] == "text/plain; version=0.0.4"


_NAMES = [*sorted(HOP_BY_HOP), "content-length", "date", "x-a"]
_token = st.sampled_from(["", "", "x-", "-", "s", "-id"])


def _any_case(draw: st.DrawFn, name: str) -> bytes:
    return "".join(c.upper() if draw(st.booleans()) else c for c in name).encode()


@st.composite
def answer_heads(draw: st.DrawFn) -> bytes:
    """Response heads, mostly with a Content-Length, whose other names are the hop-by-hop ones
    (and Content-Length) in any case, as they are or inside longer names; whose values and
    reason phrase hold such a name and its colon (and latin-1 bytes); in any order."""
    reason = draw(st.sampled_from([b"OK", b"", b"content-length: 5", b"Te: x", b"\xe9"]))
    status = draw(st.sampled_from([200, 201, 204, 304, 404, 500]))
    version = draw(st.sampled_from([b"1.1", b"1.0"]))
    lines = []
    for _ in range(draw(st.integers(0, 3))):
        name = draw(_token) + draw(st.sampled_from(_NAMES)) + draw(_token)
        if name == "content-length":
            continue  # one at most, below: llhttp refuses a second
        value = draw(st.sampled_from([b"close", b"chunked", b"x: connection: te:", b"\xe9 te:"]))
        lines.append(
            b"%b:%b%b\r\n" % (_any_case(draw, name), draw(st.sampled_from([b"", b" "])), value)
        )
    if draw(st.integers(0, 3)):
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, b"%b: 5\r\n" % _any_case(draw, "content-length"))
    return b"HTTP/%b %d %b\r\n%b\r\n" % (version, status, reason, b"".join(lines))


@settings(max_examples=examples(500), suppress_health_check=[HealthCheck.too_slow])
@given(answer_heads(), st.booleans(), st.booleans(), st.booleans())
def test_plain_and_the_framing_agree_with_the_decoded_rule_on_any_head(
    data: bytes, bodiless: bool, client_keep: bool, upstream: bool
) -> None:
    """Head.plain (each name lower-cased and looked up) is the rule on the decoded fields, for
    names hidden in values, in the reason phrase, or in longer names; a PlainHead's decoded
    forms are a Head's; its size is the old count; and the framing is the general path's."""
    parsed = Parsed(response=True)
    parsed.feed(data)
    kind, head = parsed.events.popleft()
    assume(kind == HEAD)  # llhttp refused it (a repeated Content-Length, a bad value)
    assert isinstance(head, Head)
    decoded = Head(head.start, "", head.status, head.version, head.fields, head.size)
    lower = decoded.lower
    assert head.plain == ("content-length" in lower and HOP_BY_HOP.isdisjoint(lower))
    assert isinstance(head, PlainHead) == head.plain
    assert (head.headers, head.lower) == (decoded.headers, lower)
    fields_size = sum(len(k) + len(v) + 4 for k, v in decoded.headers)
    assert head.size == len(head.start.encode("latin-1")) + 2 + fields_size + 15
    kwargs = {
        "bodiless": bodiless,
        "request_version": "1.1",
        "client_keep": client_keep,
        "upstream": upstream,
    }
    assert response_framing(head, **kwargs) == general(head, **kwargs)  # type: ignore[arg-type]


_FRAMING_NAMES = ["content-length", "transfer-encoding", "connection", "keep-alive", "te"]
_OTHER_NAMES = ["trailer", "date", "x-te", "content-lengths", "upgrade-insecure", "proxy-auth"]
_TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@st.composite
def repeated_framing_heads(draw: st.DrawFn) -> bytes:
    """Response heads whose fields may repeat any framing name (two Content-Lengths, one of
    each framing, a hop-by-hop one twice) in any case, among names of any token characters,
    with values of any visible latin-1 bytes (empty ones too), with or without a reason."""
    reason = draw(st.sampled_from([b"OK", b"", b"Not Found", b"\xe9t\xe9 OK"]))
    lines = []
    for _ in range(draw(st.integers(0, 5))):
        name = draw(
            st.one_of(
                st.sampled_from([*_FRAMING_NAMES, *sorted(HOP_BY_HOP), *_OTHER_NAMES]),
                st.text(_TCHAR, min_size=1, max_size=12),
            )
        )
        if name.lower() == "content-length":
            value = draw(st.sampled_from([b"0", b"5", b"12"]))
        else:
            value = draw(st.binary(max_size=12).map(lambda b: bytes(c for c in b if c > 31)))
        lines.append(b"%b: %b\r\n" % (_any_case(draw, name), value))
    return b"HTTP/1.1 200 %b\r\n%b\r\n" % (reason, b"".join(lines))


@settings(max_examples=examples(500), suppress_health_check=[HealthCheck.too_slow])
@given(repeated_framing_heads())
def test_plain_counts_framing_names_as_the_decoded_rule_does_for_any_accepted_head(
    data: bytes,
) -> None:
    """Head.plain adds one per Content-Length and two per hop-by-hop field: that is "a
    Content-Length and no hop-by-hop field" only because llhttp refuses a second Content-Length
    (in any case). Any head it accepts is plain by the decoded rule, and its wire is the status
    line and each field as parsed on its ``name: value`` line (as fields() writes it)."""
    parsed = Parsed(response=True)
    parsed.feed(data)
    kind, head = parsed.events.popleft()
    lengths = [
        line for line in data.split(b"\r\n")[1:] if line.lower().startswith(b"content-length:")
    ]
    if len(lengths) > 1:
        assert kind == ERROR  # what the count relies on
        return
    assume(kind == HEAD)  # refused for another reason (a value llhttp does not take)
    assert isinstance(head, Head)
    decoded = Head(head.start, "", head.status, head.version, head.fields, head.size)
    lower = decoded.lower
    assert head.plain == ("content-length" in lower and HOP_BY_HOP.isdisjoint(lower))
    status_line = f"HTTP/1.1 {head.status} {head.start}\r\n".encode("latin-1")
    assert head.wire == status_line + fields(decoded.headers) + b"\r\n"
