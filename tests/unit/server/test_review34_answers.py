"""review34: answerparse's own read of an answer (:mod:`ravenproxy.server.near_answers`: an
answer of the last one's layout, whole in a read, parsed without llhttp) tried against 1bb5933's
parse (:mod:`.again_old_parse`: llhttp for every answer), at the places a response desync or a
header injection would come from. Each case primes a layout with two answers llhttp parses (the
path's plan is made by then), then feeds a third answer changed in one way — a value's bytes
(empty, spaces, tabs, CR or LF alone, CRLF and another known name, NUL and other controls, DEL,
obs-text, ``:``), the Content-Length's (``00``, ``007``, `` 5``, ``5 ``, ``+5``, ``-1``,
``5,5``, huge, more digits than fit), a name's (its case, a space before the colon, a name one
letter longer), a field repeated, missing or more, the status line (another status, reason,
version; 1xx, 204, 304 of the same shape), the body (shorter, longer, the next head in the same
read, garbage after) — alone, with a next answer in the same read, cut in two, or answering a
HEAD; and a generated one: any byte at any place of the third answer. After every read, what
``feed`` returns, the events (heads as stored), the heads' identity and the parser's and
llhttp's state equal the oracle's (:func:`.test_answerparse_answers.both_fed`)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.answer_shapes import SHAPE_MAX
from ravenproxy.server.http_messages import HEAD
from ravenproxy.server.near_answers import LAYOUTS
from ravenproxy.server.parsed_answers import _LENGTH_AT
from tests.helpers import examples

from .flat_events import FlatParsed
from .test_again_answers import _counted
from .test_answerparse_answers import both_fed

_LAYOUTS = [
    # (status line, fields with %b where the Content-Length goes), the body's length is 5.
    (b"HTTP/1.1 200 OK", [(b"Date", b"Sun, 06 Dec 2026 06:00:0%d GMT"), (b"Content-Length", b"")]),
    (
        b"HTTP/1.1 200 OK",
        [(b"Content-Length", b""), (b"X-A", b"a\tb c%d"), (b"X-B", b"\x80\xff%d")],
    ),
    (b"HTTP/1.1 404 Not % Found", [(b"X-%b", b"%%d%d"), (b"content-length", b"")]),
    (b"HTTP/1.1 200 OK", [(b"X-Empty", b""), (b"Content-Length", b""), (b"X-E", b"e%d:")]),
    (b"HTTP/1.1 200 ", [(b"X-Colon", b"a:b%d"), (b"Content-Length", b"")]),
]
"""Layouts primed: a Date, inner tabs and spaces, obs-text, ``%`` in the reason, a name and a
value, an empty value, an empty reason, a ``:`` in a value, the Content-Length at each end."""


def _answer(layout: int, n: int, body: bytes = b"hello", length: bytes | None = None) -> bytes:
    """Answer ``n`` (0-9: its values as long) of layout ``layout``."""
    line, fields = _LAYOUTS[layout]
    lines = b""
    for name, value in fields:
        if name.lower() == b"content-length":
            lines += name + b": " + (b"%d" % len(body) if length is None else length) + b"\r\n"
        elif b"%d" in value:
            lines += name + b": " + value.replace(b"%d", b"%d" % n).replace(b"%%", b"%") + b"\r\n"
        else:
            lines += name + b": " + value + b"\r\n"
    return line + b"\r\n" + lines + b"\r\n" + body


def _field(layout: int, name: bytes) -> bytes:
    """The line of ``name`` in answer 2 of ``layout`` (with its CRLF)."""
    for line in _answer(layout, 2).split(b"\r\n"):
        if line.lower().startswith(name.lower() + b":"):
            return line + b"\r\n"
    raise AssertionError(name)


def _changes(layout: int) -> list[bytes]:
    """Answer 2 of ``layout`` changed in one way each (the head as long where the change allows
    it, so that the path, not its length, tells it from the layout)."""
    a = _answer(layout, 2)
    cl = _field(layout, b"Content-Length")
    name = cl.split(b":")[0]
    other = next(f for f, _ in _LAYOUTS[layout][1] if f.lower() != b"content-length")
    line = _field(layout, other)
    value = line[len(other) + 2 : -2]
    out: list[bytes] = []
    # Values: each byte of the first other value replaced by a byte of every kind.
    for at in range(len(value)):
        for byte in (b" ", b"\t", b"\r", b"\n", b"\x00", b"\x01", b"\x0b", b"\x1f", b"\x7f"):
            out.append(
                a.replace(line, line[: len(other) + 2 + at] + byte + line[len(other) + 3 + at :])
            )
        out.append(
            a.replace(line, line[: len(other) + 2 + at] + b"\x80" + line[len(other) + 3 + at :])
        )
        out.append(
            a.replace(line, line[: len(other) + 2 + at] + b":" + line[len(other) + 3 + at :])
        )
    # A value that carries CRLF and another known name (header injection), as long or not.
    for injected in (b"\r\nContent-Length: 0", b"\r\nTransfer-Encoding: chunked", b"\r\nX: 1"):
        out.append(a.replace(line, other + b": " + injected + b"\r\n"))
        out.append(a.replace(line, other + b": " + (value + injected)[: len(value)] + b"\r\n"))
    out.append(a.replace(line, other + b":" + value + b" \r\n"))  # no space, one after
    out.append(a.replace(line, other + b": " + value[:-1] + b" \r\n") if value else a)
    out.append(a.replace(line, other + b":  " + value[1:] + b"\r\n") if value else a)
    out.append(a.replace(line, other + b": " + b" " * len(value) + b"\r\n"))
    out.append(a.replace(line, other + b": " + b"\t" * len(value) + b"\r\n"))
    out.append(a.replace(line, other + b": " + b"v" * 3000 + b"\r\n"))
    # The Content-Length: the body 5 bytes, as long (one digit) and otherwise.
    for length in (b"0", b"00", b"007", b"05", b" 5", b"5 ", b"+5", b"-1", b"5,5", b"5, 5", b"4",
                   b"6", b"9" * 19, b"1" * 25, b"18446744073709551615", b"18446744073709551616",
                   b"0x5", b"5\t", b"\t5", b"", b"\xb5", b"5\x00", b"\x005"):  # fmt: skip
        out.append(a.replace(cl, name + b": " + length + b"\r\n"))
    out.append(a.replace(cl, name + b":5\r\n"))
    # Names: another case, a space before the colon, one letter longer, repeated, one more or
    # fewer.
    out.append(a.replace(cl, cl.swapcase()[:-2] + b"\r\n"))
    out.append(a.replace(cl, name + b" : 5\r\n"))
    out.append(a.replace(cl, name + b"x: 5\r\n"))
    out.append(a.replace(cl, name[:-1] + b": 5\r\n"))
    out.append(a.replace(cl, cl + cl))
    out.append(a.replace(cl, cl + name + b": 6\r\n"))
    out.append(a.replace(cl, b""))
    out.append(a.replace(line, b""))
    out.append(a.replace(line, line + line))
    out.append(a.replace(line, line + b"Transfer-Encoding: chunked\r\n"))
    out.append(a.replace(line, line + b"Connection: close\r\n"))
    out.append(a.replace(line, other.swapcase() + line[len(other) :]))
    # The status line: another status, reason, version; interim and bodiless statuses.
    status = a.split(b"\r\n", 1)[0]
    for other_line in (
        status.replace(b"HTTP/1.1", b"HTTP/1.0"),
        status.replace(b"HTTP/1.1", b"HTTP/2.0"),
        status.replace(b"HTTP/1.1", b"http/1.1"),
        status[:9] + b"201" + status[12:],
        status[:9] + b"100" + status[12:],
        status[:9] + b"103" + status[12:],
        status[:9] + b"204" + status[12:],
        status[:9] + b"304" + status[12:],
        status[:9] + b"101" + status[12:],
        status[:13] + status[13:].swapcase(),
        status[:13] + b"X" * len(status[13:]),
        status + b" ",
        status.replace(b" ", b"  ", 1),
    ):
        out.append(a.replace(status + b"\r\n", other_line + b"\r\n", 1))
    # Bodies: shorter, longer, garbage after, the next head at once.
    out.append(a[:-1])
    out.append(a + b"x")
    out.append(a + b"\r\n")
    out.append(a + b"garbage\r\n\r\n")
    out.append(a + b"HTTP/1.1 200 OK\r\n")
    out.append(a[:-5] + _answer(layout, 3))  # a head where the body should be
    out.append(_answer(layout, 2, b"\r\n\r\n\r"))
    out.append(_answer(layout, 2, b"HTTP/"))
    return out


def _primed(layout: int) -> list[bytes]:
    return [_answer(layout, 0), _answer(layout, 1)]


def test_each_change_of_an_answer_of_a_primed_layout_is_parsed_as_1bb5933_did() -> None:
    for layout in range(len(_LAYOUTS)):
        primed, after = _primed(layout), _answer(layout, 3, b"world")
        for changed in _changes(layout):
            both_fed([*primed, changed], [False] * 3)
            both_fed([*primed, changed + after], [False] * 3)
            both_fed([*primed, changed, after, _answer(layout, 4)], [False] * 5)
            both_fed([*primed, changed, after], [False, False, True, False])
            both_fed([*primed, changed, after], [False, False, False, True])
            for cut in (1, len(changed) // 2, len(changed) - 1):
                if 0 < cut < len(changed):
                    both_fed([*primed, changed[:cut], changed[cut:] + after], [False] * 4)


def test_answers_of_a_layout_with_bodiless_set_and_cleared_are_parsed_as_1bb5933_did() -> None:
    for layout in range(len(_LAYOUTS)):
        for flags in ([False, False, True], [False, False, False, True], [False, True, False]):
            # A HEAD's answer: the GET's Content-Length, no body.
            fed = [
                _answer(layout, n, b"", b"5") if flag else _answer(layout, n)
                for n, flag in enumerate(flags)
            ]
            both_fed([*fed, _answer(layout, 5)], [*flags, False])
            both_fed([*fed[:-1], fed[-1] + _answer(layout, 5)], flags)


@st.composite
def _bytes_changed(draw: st.DrawFn) -> tuple[list[bytes], list[bool]]:
    """Two answers of a layout, then a third with one to three bytes anywhere replaced by any
    byte (or taken out, or one put in), then a fourth and fifth, in reads as they come or
    together, some answering a HEAD."""
    layout = draw(st.integers(0, len(_LAYOUTS) - 1))
    third = bytearray(_answer(layout, draw(st.integers(0, 9))))
    fields = third.index(b"\r\n") + 2  # (half the changes fall among the fields)
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        at = draw(st.integers(fields if draw(st.booleans()) else 0, len(third) - 1))
        way = draw(st.integers(0, 9))
        byte = draw(st.one_of(st.integers(0, 255), st.sampled_from(b" \t\r\n\x00\x7f\x80:0")))
        if way == 0:
            del third[at]
        elif way == 1:
            third.insert(at, byte)
        else:
            third[at] = byte
    answers = [*_primed(layout), bytes(third), _answer(layout, 4), _answer(layout, 5, b"12345")]
    reads: list[bytes] = answers[:2]
    rest = answers[2:]
    if draw(st.booleans()):
        reads.append(b"".join(rest))
    else:
        reads.extend(rest)
    flags = [i > 1 and draw(st.integers(0, 19)) == 0 for i in range(len(reads))]
    return reads, flags


@settings(max_examples=examples(3000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bytes_changed())
def test_an_answer_of_a_primed_layout_with_any_byte_changed_is_parsed_as_1bb5933_did(
    answers: tuple[list[bytes], list[bool]],
) -> None:
    both_fed(*answers)


def test_the_path_takes_the_changes_llhttp_takes_as_they_came() -> None:
    """The cases above reach the path (not all go to llhttp by a length): a value's byte
    changed to obs-text or ``:`` and a Content-Length of another digit are its (a head not
    fed to llhttp), each as llhttp would have read it."""
    parsed = FlatParsed(response=True)
    for n in range(2):
        parsed.feed(_answer(1, n))
    fed = _counted(parsed)
    parsed.events.clear()
    third = _answer(1, 2).replace(b"a\tb c2", b"\x80\t: c2")
    parsed.feed(third + _answer(1, 3, b"0123456789"[:7]))
    assert fed == []
    heads = [head for kind, head in parsed.events if kind == HEAD]
    assert [h.values for h in heads] == [  # type: ignore[attr-defined]
        [b"5", b"\x80\t: c2", b"\x80\xff2"],
        [b"7", b"a\tb c3", b"\x80\xff3"],
    ]


def test_runs_of_bodiless_statuses_with_a_content_length_are_parsed_as_1bb5933_did() -> None:
    """A 204 or 304 (and a 205, 1xx between) says a Content-Length and sends no body: a run of
    them, several in a read, is framed as llhttp frames it (no body), whatever the length."""
    for status in (b"204 No Content", b"304 Not Modified", b"205 Reset Content", b"200 OK"):
        line = b"HTTP/1.1 " + status + b'\r\nETag: "%d"\r\nContent-Length: 5\r\n\r\n'
        answers = [line % n for n in range(6)]
        both_fed([*answers[:2], b"".join(answers[2:])], [False] * 3)
        both_fed([*answers[:3], answers[3] + b"hello" + answers[4]], [False] * 4)
        both_fed(
            [*answers[:2], b"HTTP/1.1 100 Continue\r\n\r\n" + b"".join(answers[2:])], [False] * 3
        )


def test_a_made_heads_bytes_again_with_its_own_length_are_parsed_as_1bb5933_did() -> None:
    """The path made a head of another body length than its plan's head: that head's bytes
    again are framed by its own length, in the read that made it and in the next."""
    for layout in range(len(_LAYOUTS)):
        made = _answer(layout, 2, b"hell")  # (one digit: the path's)
        longer = _answer(layout, 3, b"hello12")
        both_fed([*_primed(layout), made, made, made + made], [False] * 5)
        both_fed([*_primed(layout), made + made + longer, longer + longer], [False] * 4)


def test_a_layout_longer_than_a_kept_shape_is_not_kept() -> None:
    """What the shared caches keep for the answers targets send is bounded as
    :data:`.answer_shapes.SHAPES` is (``SHAPES_MAX * SHAPE_MAX``): a layout whose template is
    longer than ``SHAPE_MAX`` is not kept (its answers still read, as any other's). (review34
    found both kept: ~1.3 MiB a 56 KB head's layout, ~666 MiB at 512, never let go.)"""
    fields = b"".join(b"X-Review34-%d: v\r\n" % i for i in range(2 * SHAPE_MAX // 16))
    answers = [b"HTTP/1.1 200 OK\r\n%bContent-Length: 1\r\n\r\n%d" % (fields, n) for n in range(4)]
    layouts, lengths = set(LAYOUTS), set(_LENGTH_AT)
    try:
        both_fed([*answers[:2], answers[2] + answers[3]], [False] * 3)
        long_layouts = [key for key in set(LAYOUTS) - layouts if len(key[0]) > SHAPE_MAX]
        long_names = [
            names for names in set(_LENGTH_AT) - lengths if len(b": \r\n".join(names)) > SHAPE_MAX
        ]
        assert (len(long_layouts), len(long_names)) == (0, 0)
    finally:
        for key in set(LAYOUTS) - layouts:
            del LAYOUTS[key]
        for names in set(_LENGTH_AT) - lengths:
            del _LENGTH_AT[names]
