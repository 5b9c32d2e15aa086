"""answerparse: the rules :mod:`ravenproxy.server.near_answers` reads a value and a
Content-Length by, asked of llhttp itself (through httptools, as the server's parser uses it):
a value whose bytes are of the kinds the path takes is reported by llhttp as it came, and a
Content-Length of ASCII digits frames the body as ``int`` reads them."""

from __future__ import annotations

from httptools import HttpParserError, HttpResponseParser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.near_answers import _KINDS
from tests.helpers import examples

_SETTINGS = settings(
    max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class _Seen:
    def __init__(self) -> None:
        self.fields: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.ended = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.ended += 1


def _parsed(data: bytes) -> _Seen | None:
    seen = _Seen()
    parser = HttpResponseParser(seen)
    parser.set_dangerous_leniencies(lenient_chunked_length=True)  # as Parsed's
    try:
        parser.feed_data(data)
    except HttpParserError:
        return None
    return seen


def _taken(value: bytes) -> bool:
    """Whether a value of these bytes could be the last head's (the kinds llhttp reported as
    they came: no control but HTAB, no DEL, not beginning with SP or HTAB): the path takes a
    value only of the kinds of such a one, place by place."""
    kinds = value.translate(_KINDS)
    return not any((k < 0x20 and k != 9) or k == 0x7F for k in kinds) and value[:1] not in (
        b" ",
        b"\t",
    )


_BYTES = st.one_of(
    st.sampled_from([b" ", b"\t", b"a", b"\x80", b"\xff", b":", b"%", b'"', b"\x7f", b"\x00"]),
    st.binary(min_size=1, max_size=3),
)


@_SETTINGS
@given(st.lists(_BYTES, max_size=8).map(b"".join))
def test_a_value_of_the_kinds_taken_is_llhttps_as_it_came(value: bytes) -> None:
    answer = b"HTTP/1.1 200 OK\r\nX-A: " + value + b"\r\nContent-Length: 1\r\n\r\nx"
    seen = _parsed(answer)
    if not _taken(value) or b"\r" in value or b"\n" in value:
        return  # the path does not take it (llhttp's, whatever it does)
    assert seen is not None, value
    assert seen.fields[0] == (b"X-A", value)
    assert seen.body == [b"x"] and seen.ended == 1


def test_every_byte_alone_and_inside_a_value_is_as_the_kinds_say() -> None:
    # llhttp's own verdict byte by byte: taken as it came where the kinds take it (anything
    # else is never taken, so whatever llhttp does with it is llhttp's).
    for byte in range(256):
        one = bytes([byte])
        for value in (one, b"a" + one, one + b"a", b"a" + one + b"a"):
            if _taken(value) and byte not in (10, 13):
                seen = _parsed(
                    b"HTTP/1.1 200 OK\r\nX-A: " + value + b"\r\nContent-Length: 0\r\n\r\n"
                )
                assert seen is not None and seen.fields[0] == (b"X-A", value), value


@_SETTINGS
@given(st.integers(0, 3), st.integers(0, 999), st.integers(0, 3))
def test_a_content_length_of_digits_frames_the_body_as_int_reads_them(
    zeros: int, length: int, after: int
) -> None:
    digits = b"0" * zeros + b"%d" % length
    body = b"b" * length
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: " + digits + b"\r\n\r\n" + body
    seen = _parsed(answer + b"HTTP/1.1 204 No\r\n\r\n" * after)
    assert seen is not None
    assert b"".join(seen.body) == body and int(digits) == length
    assert seen.ended == 1 + after
