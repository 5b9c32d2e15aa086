"""A response head's wire and plainness by its shape (branch ansside, issue 15): the template
kept per (status, reason, names) in :data:`~ravenproxy.server.answer_shapes.SHAPES`, its values
put in, against 812de76's build of the same head kept verbatim below (the field joins and the
framing loop), over generated answers parsed one after another on one connection (shapes
repeated, changed, shared between connections; names and reasons with ``%``; no fields;
statuses, versions, framings), and at the shapes' bounds."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server import answer_shapes, http_messages
from ravenproxy.server.http_heads import FRAMING_KIND, Head, PlainHead
from ravenproxy.server.http_messages import END, HEAD, ParsedPlainHead

from .flat_events import FlatParsed
from .test_response_framing import answer_heads

# -- 812de76's response head (Parsed.on_headers_complete's response branch), verbatim ----------
_STATUS_LINES: dict[int, bytes] = {}
_status_line = _STATUS_LINES.get
_framing_kind = FRAMING_KIND.get
_name_value = b": ".join


def _old_response_head(self: Any, kind: int, version: str) -> Head:
    """812de76's http_messages.py, Parsed.on_headers_complete's response branch (dedented, its
    result returned)."""
    fields, reason = self._fields, self._start
    line = _status_line(kind) or _STATUS_LINES.setdefault(kind, b"HTTP/1.1 %d " % kind)
    if fields:
        lines = b"\r\n".join(map(_name_value, fields))
        wire = b"".join((line, reason, b"\r\n", lines, b"\r\n\r\n"))
    else:
        wire = b"".join((line, reason, b"\r\n\r\n"))
    # Which framing fields it has: a lookup per name, not a decode (a regular expression
    # over the head cost more; ``bytes in bytes`` makes and drops a TypeError first).
    framing = 0
    for name, _ in fields:
        part = _framing_kind(name.lower())
        if part is not None:
            framing += part
    # llhttp's status is 3 digits: the head's size on the wire is that of ``wire``.
    if framing == 1:  # plain: what PlainHead is
        head = PlainHead(reason, kind, version, fields, len(wire), wire)
    else:
        start = reason.decode("latin-1")
        head = Head(start, "", kind, version, fields, len(wire), wire)
    return head


# ----------------------------------------------------------------------------------------------


class _Recorder(FlatParsed):
    """A parser that also builds each response head as 812de76 did, from the same callbacks."""

    __slots__ = ("old",)

    def __init__(self) -> None:
        super().__init__(response=True)
        self.old: list[Head] = []

    def on_headers_complete(self) -> None:
        self.old.append(_old_response_head(self, self._kind(), self.parser.get_http_version()))
        super().on_headers_complete()

    @property
    def _fields(self) -> list[tuple[bytes, bytes]]:
        """812de76's ``_fields``: the pairs llhttp gave (heads: gathered as names and values)."""
        return list(zip(self._names, self._values, strict=True))

    @property
    def _start(self) -> bytes:
        """812de76's ``_start`` (the reason phrase): the pieces llhttp gave, joined."""
        return b"".join(self._starts)


def _same_head(new: Head, old: Head) -> None:
    # heads: the parse makes a PlainHead as its ParsedPlainHead (fields paired when asked)
    assert type(new) is (ParsedPlainHead if type(old) is PlainHead else type(old))
    assert (new.wire, new.size, new.plain, new.status, new.version, new.fields) == (
        old.wire,
        old.size,
        old.plain,
        old.status,
        old.version,
        old.fields,
    )
    assert (new.start, new.headers, new.lower) == (old.start, old.headers, old.lower)


_odd_heads = st.sampled_from(
    [
        b"HTTP/1.1 200 100%\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-%d: 5%\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 %b%%\r\nA%: %s\r\nB%%b: %%\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 204 \r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nDate: Thu, 04 Dec 2026 10:00:00 GMT\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nDate: Thu, 04 Dec 2026 10:00:01 GMT\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ndate: x\r\nContent-Length: 0\r\n\r\n",
    ]
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(answer_heads(), _odd_heads), min_size=1, max_size=8), st.booleans())
def test_each_head_of_a_connection_is_812de76s(heads: list[bytes], fresh: bool) -> None:
    if fresh:
        answer_shapes.SHAPES.clear()  # else: the shapes of earlier examples are shared
    for data in heads:
        parsed = _Recorder()  # one head each: a head without a length is read to the close
        parsed.feed(data)
        kind, head = parsed.events.popleft()
        if kind != HEAD:  # llhttp refused it: no head built, old or new
            assert not parsed.old
            continue
        assert isinstance(head, Head)
        _same_head(head, parsed.old[-1])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 4), min_size=2, max_size=12), st.data())
def test_answers_on_one_connection_varied_and_repeated_are_812de76s(
    picks: list[int], data: st.DataObject
) -> None:
    """Length-framed answers one after another on one connection: the same shape with new
    values (the Date, the length), the same bytes again, another shape between."""
    shapes = [
        b"HTTP/1.1 200 OK\r\nDate: D%d\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nDate: D%d\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\nDate: D%d\r\nContent-Length: %d\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nDate: D%d\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\nDate: D%d\r\n"
        b"Content-Length: %d\r\n\r\n",
    ]
    parsed = _Recorder()
    for pick in picks:
        a, b = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
        values = (b, a) if pick == 1 else (a, b)
        length = values[1] if pick != 1 else values[0]
        answer = shapes[pick] % values + b"x" * length
        built = len(parsed.old)
        parsed.feed(answer)
        kind, head = parsed.events.popleft()
        assert kind == HEAD and isinstance(head, Head)
        if len(parsed.old) == built:
            # Read without llhttp (answerparse: the last answer's layout): 812de76's build of
            # the same bytes is a fresh connection's.
            fresh = _Recorder()
            fresh.feed(answer)
            parsed.old.append(fresh.old[-1])
        _same_head(head, parsed.old[-1])
        assert parsed.events.pop()[0] == END
        parsed.events.clear()


def test_a_template_is_kept_per_shape_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shared by connections, looked up by status, reason and names; none past SHAPES_MAX, none
    longer than SHAPE_MAX — and a head not kept is built all the same."""
    monkeypatch.setattr(answer_shapes, "SHAPES", {})
    monkeypatch.setattr(http_messages, "_shape_of", answer_shapes.SHAPES.get)
    monkeypatch.setattr(answer_shapes, "SHAPES_MAX", 2)
    shapes = answer_shapes.SHAPES

    def head(data: bytes) -> Head:
        parsed = FlatParsed(response=True)
        parsed.feed(data)
        value = parsed.events.popleft()[1]
        assert isinstance(value, Head)
        return value

    one = b"HTTP/1.1 200 OK\r\nDate: %b\r\nContent-Length: 0\r\n\r\n"
    assert head(one % b"a").wire == one % b"a"
    assert head(one % b"bc").wire == one % b"bc"  # another connection, the same shape
    assert list(shapes) == [(200, b"OK", (b"Date", b"Content-Length"))]
    big = b"HTTP/1.1 200 OK\r\nX-%b: 1\r\nContent-Length: 0\r\n\r\n" % (b"a" * 2000)
    assert head(big).wire == big and len(shapes) == 1  # too long to keep
    assert head(b"HTTP/1.1 200 OK\r\n\r\n").plain is False
    assert len(shapes) == 2
    third = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
    assert head(third).wire == third and len(shapes) == 2  # past SHAPES_MAX
    assert isinstance(head(third), PlainHead)
