"""The exchange's own copy of response_framing's plain case (a plain answer to a client that keeps
its connection goes on as parsed, without response_framing: written out in
``AnswerSide.receive_upstream`` since server90, before it in ``_response_head``): for any head,
whatever the request, the target connection, the client's wish and the request body's state, the
head it writes and the decisions it keeps are response_framing's. Held through
``receive_upstream`` (the head's bytes parsed there) where a target connection is held, through
``_response_head`` where none is."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import WriteClient
from ravenproxy.server.http_heads import Head, PlainHead
from ravenproxy.server.http_messages import HEAD, Parsed
from ravenproxy.server.http_rewrite import response_framing
from tests.helpers import examples

from .test_exchange import OK, VIA, route
from .test_response_framing import SCRAPE, answer_heads


def _head(data: bytes) -> Head | None:
    """The head parsed, or None if llhttp refused it (a repeated Content-Length, a bad value)."""
    parsed = Parsed(response=True)
    parsed.feed(data)
    kind, head = parsed.events.popleft()
    return head if kind == HEAD and isinstance(head, Head) else None


def _request(version: str) -> Head:
    return Head("GET", "/", 0, version, [(b"Host", b"edge-1:9100")], 40)


def _decided(
    head: Head,
    *,
    bodiless: bool,
    version: str,
    keep: bool,
    body_done: bool,
    upstream: bool,
    data: bytes,
) -> tuple[bytes, str, bool, bool, bool]:
    ex = Exchange(via=VIA, max_head=4096)
    ex._request, ex._client_keep, ex.body_done = _request(version), keep, body_done
    if not upstream:
        wire = ex._response_head(head, bodiless=bodiless)
        return wire, ex._body_out, ex._until_close, ex._up_keep, ex._client_keep
    # As the exchange meets an answer: forwarding, the target connection held, its bytes
    # parsed by the exchange's own parser (its head equal to ``head``).
    ex.phase, ex.route = "forwarding", route("edge-1")
    ex._up = Parsed(response=True)
    ex._up.bodiless = bodiless
    head_only = data[: data.index(b"\r\n\r\n") + 4]  # the body (if any) not written after it
    writes = [a for a in ex.receive_upstream(head_only) if isinstance(a, WriteClient)]
    wire = writes[0].data
    return wire, ex._body_out, ex._until_close, ex._up_keep, ex._client_keep


@settings(max_examples=examples(400), suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        answer_heads(),
        st.sampled_from([SCRAPE, OK, b"HTTP/1.1 204 No\r\nContent-Length: 0\r\n\r\n"]),
    ),
    st.booleans(),
    st.sampled_from(["1.1", "1.0"]),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_the_exchange_frames_every_answer_as_response_framing_does(
    data: bytes, bodiless: bool, version: str, keep: bool, body_done: bool, upstream: bool
) -> None:
    head = _head(data)
    assume(head is not None)
    assert head is not None
    decided = _decided(
        head,
        bodiless=bodiless,
        version=version,
        keep=keep,
        body_done=body_done,
        upstream=upstream,
        data=data,
    )
    framing = response_framing(
        head,
        bodiless=bodiless,
        request_version=version,
        client_keep=keep and body_done,
        upstream=upstream,
    )
    assert decided == tuple(framing)


def test_a_plain_answer_to_a_kept_client_is_its_wire() -> None:
    """The usual case the copy serves: the head as parsed, nothing added, both kept."""
    head = _head(SCRAPE)
    assert head is not None
    wire, body_out, until_close, up_keep, client_keep = _decided(
        head, bodiless=False, version="1.1", keep=True, body_done=True, upstream=True, data=SCRAPE
    )
    assert wire == head.wire == SCRAPE
    assert (body_out, until_close, up_keep, client_keep) == ("length", False, True, True)


def test_a_plain_head_decodes_its_reason_when_asked() -> None:
    """A PlainHead keeps its reason phrase as parsed: read, it is a Head's (latin-1, as the
    101 handover and any log take it), and reading it decodes no field."""
    head = _head(b"HTTP/1.1 200 Caf\xe9 ok\r\nContent-Length: 0\r\n\r\n")
    assert isinstance(head, PlainHead)
    assert (head.start, head.target, head.status, head.version) == ("Caf\xe9 ok", "", 200, "1.1")
    assert not hasattr(head, "_decoded")
    other = _head(b"HTTP/1.0 404 \r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert type(other) is Head and (other.start, other.target) == ("", "")
    assert _head(b"HTTP/1.0 404 \r\nContent-Length: 0\r\n\r\n").start == ""  # type: ignore[union-attr]


def test_a_status_under_100_begins_its_wire_as_llhttp_gave_it() -> None:
    """The status line's start is made per status as the format made it (``%d``): 099 is 99."""
    head = _head(b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n")
    assert head is not None and head.wire == b"HTTP/1.1 99 Odd\r\nContent-Length: 0\r\n\r\n"
