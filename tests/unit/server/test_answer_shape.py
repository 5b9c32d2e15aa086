"""answer (issue 15): an answer whose status, reason and field names are the last answer's takes
the last one's template (:attr:`Parsed._shape`) from the compare that also finds a whole head
repeated, instead of its shape key made, hashed and looked up — against 53cce6d's parse, kept
VERBATIM in :mod:`.answer_old_parse`. Both are fed the same generated answers, most of them the
last one's shape with other values, others differing from it in one part only (the status, the
reason, a name, a name's case, a field more or less, the version), cut into reads anywhere;
every event, every head (read whole) and the parser's state compared."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server import answer_shapes
from ravenproxy.server.http_messages import HEAD
from tests.helpers import examples

from . import answer_old_parse as old_parse
from .flat_events import FlatParsed
from .test_heads_parse import _conversation, _view

_STATUSES = [200, 200, 200, 201, 404, 103]
_REASONS = [b"OK", b"OK", b"", b"Created", b"5%"]
_NAMES = [b"Date", b"date", b"Content-Type", b"X-%d", b"Connection", b"Transfer-Encoding"]
_VALUES = [b"a", b"b", b"", b"Thu, 04 Dec 2026 10:00:00 GMT", b"%b", b"close", b"chunked"]


@st.composite
def _answers(draw: st.DrawFn) -> list[bytes]:
    """Answers on one target connection: each the last one's shape with other values (often),
    or that shape changed in one part, or a new one; each with a Content-Length and a body
    (the names drawn may add a framing: a chunked or closing answer ends the conversation)."""
    status, reason, version = 200, b"OK", b"1.1"
    names: list[bytes] = []
    answers: list[bytes] = []
    for _ in range(draw(st.integers(1, 8))):
        way = draw(st.integers(0, 9))
        if way == 0 or not answers:
            count = draw(st.integers(0, 5))
            names = [draw(st.sampled_from(_NAMES)) for _ in range(count)]
            status, reason = draw(st.sampled_from(_STATUSES)), draw(st.sampled_from(_REASONS))
        elif way == 1:
            status = draw(st.sampled_from(_STATUSES))
        elif way == 2:
            reason = draw(st.sampled_from(_REASONS))
        elif way == 3 and names:
            at = draw(st.integers(0, len(names) - 1))
            names[at] = draw(st.sampled_from([names[at].swapcase(), *_NAMES]))
        elif way == 4:
            names.insert(draw(st.integers(0, len(names))), draw(st.sampled_from(_NAMES)))
        elif way == 5 and names:
            del names[draw(st.integers(0, len(names) - 1))]
        elif way == 6:
            version = draw(st.sampled_from([b"1.1", b"1.0"]))
        # else: the same shape, other values
        values = [draw(st.sampled_from(_VALUES)) for _ in names]
        body = draw(st.sampled_from([b"", b"ok", b"okay"]))
        lines = [b"%b: %b" % field for field in zip(names, values, strict=True)]
        lines.insert(draw(st.integers(0, len(lines))), b"Content-Length: %d" % len(body))
        start = b"HTTP/%b %d %b" % (version, status, reason)
        answers.append(b"\r\n".join([start, *lines]) + b"\r\n\r\n" + body)
        if b"chunked" in values or b"close" in values:
            break
    whole = b"".join(answers)
    if draw(st.booleans()):
        return answers
    cuts = sorted(draw(st.lists(st.integers(0, len(whole)), max_size=4)))
    reads = zip([0, *cuts], [*cuts, len(whole)], strict=True)
    return [whole[a:b] for a, b in reads if whole[a:b]]


def _both_fed(reads: list[bytes], *, bodiless: bool) -> None:
    new = FlatParsed(response=True, max_tail=256)
    old = old_parse.Parsed(response=True, max_tail=256)
    new.bodiless = old.bodiless = bodiless
    for data in reads:
        assert new.feed(data) == old.feed(data)
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events]
        state = (new.in_head, new.in_body, new.midway, new.fed, new.tail)
        assert state == (old.in_head, old.in_body, old.midway, old.fed, old.tail)
        new.events.clear()
        old.events.clear()


_SETTINGS = settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@given(_answers(), st.booleans())
def test_answers_of_the_last_ones_shape_are_parsed_as_53cce6d_did(
    reads: list[bytes], bodiless: bool
) -> None:
    _both_fed(reads, bodiless=bodiless)


@_SETTINGS
@given(_conversation(response=True), st.booleans())
def test_heads_conversations_are_parsed_as_53cce6d_did(reads: list[bytes], bodiless: bool) -> None:
    _both_fed(reads, bodiless=bodiless)


def test_the_last_shape_is_taken_without_a_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second answer of the first's shape asks the shapes nothing; one that differs in
    its status, reason or a name's case asks (and gets its own template)."""
    asked: list[tuple[int, bytes, tuple[bytes, ...]]] = []
    parsed = FlatParsed(response=True)
    real = answer_shapes.SHAPES.get
    monkeypatch.setattr(
        "ravenproxy.server.http_messages._shape_of", lambda key: asked.append(key) or real(key)
    )
    answers = [
        b"HTTP/1.1 200 OK\r\nDate: a\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nDate: b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 201 OK\r\nDate: b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 201 Yes\r\nDate: b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 201 Yes\r\ndate: b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 201 Yes\r\ndate: c\r\nContent-Length: 0\r\n\r\n",
    ]
    wires = []
    for answer in answers:
        parsed.feed(answer)
        kind, head = parsed.events.popleft()
        assert kind == HEAD
        wires.append(head.wire)
        parsed.events.clear()
    assert wires == answers  # (each head as it came: canonical, its body empty)
    seen = [(200, b"OK"), (201, b"OK"), (201, b"Yes"), (201, b"Yes")]
    assert [key[:2] for key in asked] == seen
