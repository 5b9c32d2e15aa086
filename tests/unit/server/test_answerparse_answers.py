"""answerparse (issue 15): an answer of the last answer's shape — its status line and field names
the last one's, in order and case, only its values other — framed by one plain Content-Length
and whole in a read that begins between messages is parsed by a per-shape pattern
(:mod:`ravenproxy.server.near_answers`), not by llhttp — against 1bb5933's parse, kept VERBATIM
in :mod:`.again_old_parse`, which feeds every answer to llhttp.

Both are fed generated answer streams: runs of one shape whose values are drawn from what a
server may send (empty, spaces and tabs before, after and inside, obs-text, controls, DEL, long,
``%``, a Content-Length with leading zeros, signs or spaces), shapes changed in one part (the
status, the reason, a name or its case, a field more or fewer, the version, a hop-by-hop field),
interim answers (100, 103) and answers to HEAD between, bodies one byte off, cut into reads
anywhere. After every read: what feed returns, every event (heads read whole, their class, names
and values as stored), which heads are one object, the parser's state and llhttp's own."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.answer_shapes import SHAPE_MAX
from ravenproxy.server.http_messages import DATA, END, HEAD
from ravenproxy.server.parsed_answers import ParsedPlainHead
from tests.helpers import examples

from . import again_old_parse as old_parse
from .flat_events import FlatParsed
from .test_again_answers import _both_fed, _counted
from .test_heads_parse import _view

_NAMES = (b"Date", b"Content-Type", b"ETag", b"X-%d")
"""The fields of the shapes drawn (with a Content-Length among them somewhere)."""
_VALUE_BYTES = [
    b"a",
    b"Z",
    b"0",
    b" ",
    b"  ",
    b"\t",
    b"\x80",
    b"\xff",
    b"\xe9",
    b"%",
    b"%b",
    b":",
    b'"',
    b",",
    b"\x7f",
    b"\x00",
    b"\x0b",
    b"\r",
    b"\n",
    b"\r\n",
]
"""A value's pieces: what a server may send, and bytes llhttp refuses (the last six)."""
_LENGTHS = [b"", b"0", b"00", b"+", b"-", b" ", b"\t", b"a", b"1" * 19]
"""What may stand in front of a Content-Length's digits."""


@st.composite
def _value(draw: st.DrawFn) -> bytes:
    way = draw(st.integers(0, 11))
    if way == 0:
        return b""
    if way == 1:
        return b"v" * draw(st.sampled_from([100, 3000]))
    if way < 8:  # a value as servers send them
        return draw(
            st.sampled_from(
                [b"Sun, 06 Dec 2026 06:00:0%d GMT" % draw(st.integers(0, 9)), b"text/plain", b'"x"']
            )
        )
    # Now and then a byte llhttp refuses (the last six): it ends the connection's parse.
    pieces = _VALUE_BYTES if draw(st.integers(0, 7)) == 0 else _VALUE_BYTES[:-6]
    return b"".join(draw(st.lists(st.sampled_from(pieces), min_size=1, max_size=5)))


_ONE = [b"a", b"Z", b"0", b"9", b"\x80", b"\xff", b"%", b":", b",", b'"']
_ODD_ONE = [b" ", b"\t", b"\x7f", b"\x00", b"\x0b", b"\r", b"\n"]
"""A byte put in a value's place: what a server may send; a space or a tab (taken where the
last value had one), bytes llhttp refuses."""


@st.composite
def _mutated(draw: st.DrawFn, value: bytes) -> bytes:
    """``value`` with a byte or a few changed in place (as long: the path's case, a Date's next
    second), now and then one llhttp refuses."""
    for _ in range(draw(st.integers(1, 3)) if value else 0):
        at = draw(st.integers(0, len(value) - 1))
        pool = _ONE + _ODD_ONE if draw(st.integers(0, 5)) == 0 else _ONE
        value = value[:at] + draw(st.sampled_from(pool)) + value[at + 1 :]
    return value


@st.composite
def _length(draw: st.DrawFn, body: int) -> bytes:
    if draw(st.integers(0, 24)):
        return b"%d" % body
    after = draw(st.sampled_from([b"", b" ", b"\t", b"  ", b"a"]))
    return draw(st.sampled_from(_LENGTHS)) + b"%d" % body + after


@st.composite
def _shape(draw: st.DrawFn) -> tuple[bytes, list[bytes], int]:
    """A status line, the names (one of them the Content-Length's) and where that one is."""
    names = list(draw(st.lists(st.sampled_from(_NAMES), max_size=3)))
    at = draw(st.integers(0, len(names)))
    names.insert(
        at, draw(st.sampled_from([b"Content-Length", b"Content-Length", b"content-length"]))
    )
    line = draw(st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found", b"HTTP/1.1 200 "]))
    return line, names, at


@st.composite
def _changed(
    draw: st.DrawFn, shape: tuple[bytes, list[bytes], int]
) -> tuple[bytes, list[bytes], int]:
    """``shape`` changed in one part."""
    line, names, at = shape
    names = list(names)
    way = draw(st.integers(0, 8))
    if way == 0:
        line = line.replace(b"200", b"201").replace(b"404", b"410")
    elif way == 1:
        line += b"!"
    elif way == 2:
        line = line.replace(b"1.1", b"1.0")
    elif way == 3:
        names.insert(at + 1, b"X-More")
    elif way == 4 and len(names) > 1:  # a field fewer (not the Content-Length)
        i = draw(st.sampled_from([i for i in range(len(names)) if i != at]))
        names.pop(i)
        at -= i < at
    elif way == 5:
        names[at] = names[at].upper()
    elif way == 6:
        names.insert(0, draw(st.sampled_from([b"Connection", b"Transfer-Encoding", b"Upgrade"])))
        at += 1
    elif way == 7:
        names.insert(0, b"Content-Length")  # two of them
        at += 1
    else:
        other = [i for i in range(len(names)) if i != at]
        if other:
            i = draw(st.sampled_from(other))
            names[i] = names[i].lower() if names[i] != names[i].lower() else names[i].upper()
    return line, names, at


def _answer(shape: tuple[bytes, list[bytes], int], values: list[bytes], body: bytes) -> bytes:
    line, names, _ = shape
    fields = b"".join(n + b": " + v + b"\r\n" for n, v in zip(names, values, strict=True))
    return line + b"\r\n" + fields + b"\r\n" + body


@st.composite
def _answers(draw: st.DrawFn) -> tuple[list[bytes], list[bool]]:
    """Answers on one target connection, read as the target wrote them or cut anywhere, and
    whether each read answers a HEAD."""
    shape = draw(_shape())
    answers: list[bytes] = []
    heads: list[bool] = []
    last: list[bytes] | None = None  # the last answer's values, for its shape
    for _ in range(draw(st.integers(2, 20))):
        way = draw(st.integers(0, 19))
        if way == 0:
            shape = draw(_changed(shape))
        elif way == 1:
            shape = draw(_shape())
        elif way == 2:
            interim = draw(st.sampled_from([b"100 Continue", b"103 Early Hints"]))
            answers.append(b"HTTP/1.1 " + interim + b"\r\n\r\n")
            heads.append(False)
        size = draw(st.sampled_from([0, 1, 5, 7, 7, 7, 20, 35]))
        piece = draw(st.sampled_from([b"x", b"\r\n", b"HTTP/1.1 200 OK\r\n"]))
        body = (piece * size)[:size]
        if last is not None and len(last) == len(shape[1]) and draw(st.integers(0, 7)):
            # The last answer's values, some changed in place (the Content-Length: the body's).
            values = [
                draw(_length(len(body))) if i == shape[2] else draw(_mutated(v))
                for i, v in enumerate(last)
            ]
        else:
            values = [
                draw(_length(len(body))) if i == shape[2] else draw(_value())
                for i in range(len(shape[1]))
            ]
        last = values
        off = draw(st.integers(0, 39))
        if off == 0 and body:
            body = body[:-1]
        elif off == 1:
            body += b"z"
        head = draw(st.integers(0, 39)) == 0  # (llhttp takes nothing after a HEAD's answer)
        answers.append(_answer(shape, values, b"" if head else body))
        heads.append(head)
    if draw(st.booleans()):
        return answers, heads
    # Cut anywhere: a read answers a HEAD when the answer it begins in does.
    whole = b"".join(answers)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(whole) - 1)), max_size=6))))
    starts = [sum(map(len, answers[:i])) for i in range(len(answers))]
    reads, flags = [], []
    for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True):
        if whole[a:b]:
            reads.append(whole[a:b])
            flags.append(heads[max(i for i, s in enumerate(starts) if s <= a)])
    return reads, flags


def _stored(event: tuple[int, object]) -> object:
    """An event as :func:`_view` reads it, and as it is stored: the head's class, its names and
    values (their types), a body's type."""
    kind, value = event
    if kind != HEAD:
        return (_view(event), type(value).__name__)
    stored: tuple[object, ...] = (type(value).__name__,)  # (the oracle's classes are its own)
    if isinstance(value, ParsedPlainHead | old_parse.ParsedPlainHead):
        stored += (type(value.names), value.names, type(value.values), value.values)
    return (_view(event), stored)


def both_fed(reads: list[bytes], flags: list[bool]) -> None:
    """``reads`` fed to both parsers (``flags``: whether each read answers a HEAD), compared
    after each, their events as stored (:func:`_stored`)."""
    _both_fed(reads, bodiless=flags, max_tail=256, view=_stored)


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_answers())
def test_answers_of_one_shape_are_parsed_as_1bb5933_did(
    answers: tuple[list[bytes], list[bool]],
) -> None:
    both_fed(*answers)


_A = b"HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 06:00:0%d GMT\r\nContent-Length: %d\r\n\r\n%s"


def _a(second: int, body: bytes = b"hello") -> bytes:
    return _A % (second, len(body), body)


_EDGES: list[list[bytes]] = [
    [_a(0), _a(1), _a(2), _a(3) + _a(4) + _a(5)],  # taken from the third on, several a read
    [_a(0), _a(1), _a(2, b"hi!!!"), _a(3, b"1234567890")],  # a length of two digits: llhttp's
    [_a(0), _a(1), _a(2).replace(b"06:00:02", b" 6:00:02")],  # a space where there was none
    [_a(0), _a(1), _a(2).replace(b"Sun,", b"Sun\t")],  # a tab where there was none
    [_a(0), _a(1), _a(2).replace(b"Sun,", b"Sun\x7f")],  # DEL (llhttp refuses it)
    [_a(0), _a(1), _a(2).replace(b"Sun,", b"Sun\x00")],
    [_a(0), _a(1), _a(2).replace(b"Sun,", b"Sun\xff")],  # obs-text: taken
    [_a(0), _a(1), _a(2).replace(b"Sun,", b"Sun\r")],
    [_a(0), _a(1), _a(2).replace(b"Sun,", b"Sun\n")],
    [_a(0), _a(1), _a(2).replace(b"Sun, ", b"Sun:\r\n")],  # a line more, as long
    [_a(0), _a(1), _a(2).replace(b"Date", b"date")],  # a name's case: another shape
    [_a(0), _a(1), _a(2).replace(b"200 OK", b"201 OK")],
    [_a(0), _a(1), _a(2).replace(b"HTTP/1.1", b"HTTP/1.0"), _a(3)],  # (llhttp: closed)
    [_a(0), _a(1), _a(2)[:-1], b"o", _a(3).replace(b"HTTP/1.1", b"HTTP/1.0"), _a(4)],
    [_a(0), _a(1), _a(2).replace(b"Content-Length: 5", b"Content-Length:05")],
    [_a(0, b"hello1"), _a(1, b"hello1"), _a(2, b"hello")[:-1] + b"\r\n\r\n1234567"],
    [_a(0, b"x" * 15), _a(1, b"y" * 15), _a(2, b"z" * 15).replace(b": 15", b": 0F")],
    [_a(0), _a(1), _a(2)[:-1], b"o" + _a(3)],  # a body cut across reads
    [_a(0), _a(1), _a(2)[:30], _a(2)[30:] + _a(3)],  # a head cut across reads
    [_a(0), _a(1), b"HTTP/1.1 100 Continue\r\n\r\n" + _a(2), _a(3), _a(4)],  # interim
    [_a(0), _a(1), _a(2) + _a(3)[:-2] + b"HTTP/1.1 x\r\n\r\n", _a(4)],  # an error after
    [_a(0, b""), _a(1, b""), _a(2, b""), _a(3, b"") * 3],  # Content-Length 0
    # A head the path made, then its bytes again: its own body's length, not the plan's.
    [_a(0), _a(1), _a(2, b"hell") * 2],
    [_a(0), _a(1), _a(2, b"hell"), _a(2, b"hell"), _a(3, b"hell!") + _a(3, b"hell!")],
    [_a(0), _a(1), _a(1) + _a(2, b"hello!") * 2],  # (the plan's head's length known first)
]
"""Runs of one shape at its edges: each is fed as written, and with its reads answering a HEAD
from the third on."""


def test_runs_of_one_shape_at_their_edges_are_parsed_as_1bb5933_did() -> None:
    for reads in _EDGES:
        both_fed(reads, [False] * len(reads))
        both_fed(reads, [i >= 2 for i in range(len(reads))])


def test_every_cut_of_a_run_of_one_shape_is_parsed_as_1bb5933_did() -> None:
    whole = _a(2) + _a(3, b"world") + _a(4, b"")
    for a in range(1, len(whole), 2):
        both_fed([_a(0), _a(1), whole[:a], whole[a:]], [False] * 4)


def test_an_answer_of_the_last_ones_layout_is_queued_without_llhttp() -> None:
    """From the third answer of a shape on (the second came through llhttp), an answer whose
    values are as long as the last one's feeds llhttp nothing: a new head each (an equal one
    when its bytes are the last head's), the body as read, END; llhttp reads one whose values
    changed length, and the next (a plan is made for a head as long as the last one), and from
    the one after on the path reads by their places."""
    parsed = FlatParsed(response=True)
    fed = _counted(parsed)
    for second in range(6):
        parsed.feed(_a(second, b"hell%d" % second))
    heads = [head for kind, head in parsed.events if kind == HEAD]
    assert fed == [_a(0, b"hell0"), _a(1, b"hell1")]
    assert len({id(head) for head in heads}) == 6
    assert [h.values for h in heads] == [  # type: ignore[attr-defined]
        [b"Sun, 06 Dec 2026 06:00:0%d GMT" % s, b"5"] for s in range(6)
    ]
    parsed.events.clear()
    parsed.feed(_a(5, b"hell5"))  # the last head's bytes again: that head (one equal to it)
    assert _view(parsed.events[0]) == _view((HEAD, heads[-1]))
    parsed.feed(_a(6, b"a longer body"))  # a value as long no more: llhttp's
    parsed.feed(_a(7, b"a longer bodY"))  # and the next (its head as long as the last one's)
    parsed.feed(_a(8, b"a longer bOdY"))
    assert fed[2:] == [_a(6, b"a longer body"), _a(7, b"a longer bodY")]


def test_no_plan_for_a_layout_longer_than_a_kept_shape() -> None:
    """A head whose shape's template is over ``SHAPE_MAX`` makes no plan (a plan holds a slice
    a field: ~1.3 MiB for a 56 KB head's, review34): its answers are llhttp's, as before."""
    fields = b"".join(b"X-Many-%d: v\r\n" % i for i in range(SHAPE_MAX // 12))
    parsed = FlatParsed(response=True)
    fed = _counted(parsed)
    answers = [b"HTTP/1.1 200 OK\r\n%bContent-Length: 1\r\n\r\n%d" % (fields, n) for n in range(4)]
    for answer in answers:
        parsed.feed(answer)
    assert parsed._plan is None
    assert fed == answers
    assert [kind for kind, _ in parsed.events] == [HEAD, DATA, END] * 4
