"""How an answer of the last answer's layout — its status line and field names, in order and
case, the last one's; only its values differ (a Date, a Content-Length, an ETag), each as long
as the last one's — is read without llhttp: :func:`plan_of` makes, for a head llhttp parsed
(framed by its Content-Length alone: :func:`~ravenproxy.server.parsed_answers.length_field`;
after one of its shape as long, or the same head again), where its values lie, and
:meth:`~ravenproxy.server.http_messages.Parsed.feed` reads a later answer by it when llhttp is
between messages. No Python loop over the bytes or the fields: the values are cut at those
places (one C call), the head must be its shape's template with them (one format and compare:
every byte but the values' is the last head's), and its bytes must be of the last head's
kinds at each place (one translation and compare).

The kinds (:data:`_KINDS`): a control, CR, LF, HTAB and SP each stay themselves, any other byte
(visible ASCII, obs-text 0x80-0xFF) is one kind. Each value is then as llhttp reports it, its
bytes as they came (tests/unit/server/test_answerparse_rules.py asks llhttp itself): the last
head's values (llhttp's or checked so) hold no control but HTAB, no CR or LF, and begin with no
SP or HTAB (llhttp drops those), and a value of the same kinds at each place neither. The
Content-Length's value must be ASCII digits (llhttp's number, a leading zero included, is
``int``'s). Anything else goes to llhttp, as does an answer whose head or body is not whole in
the read, or whose values' lengths changed (llhttp's until two heads of a layout came in a
row; values whose lengths change answer to answer make no plan).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from operator import itemgetter
from typing import Any, cast

from ravenproxy.server.answer_shapes import SHAPE_MAX
from ravenproxy.server.http_events import ANSWER, DATA, ENDED, HEAD
from ravenproxy.server.http_heads import Head
from ravenproxy.server.parsed_answers import ParsedPlainHead, length_field

_KINDS = bytes(c if c < 0x21 or c == 0x7F else 0x61 for c in range(256))
"""A translation table to a head's byte kinds: controls, HTAB, CR, LF, SP and DEL stay
themselves; any other byte becomes ``a``."""

Plan = tuple[bytes, Callable[[bytes], tuple[bytes, ...]], bytes, int, int, Head, int]
"""How an answer of a head's layout is read: the shape's template with a ``%b`` in front (for
the empty cut the values' getter begins with), the values' getter (an ``itemgetter`` of
slices), the head's kinds (:data:`_KINDS`), which value is the Content-Length's, the least
body an answer of the layout has (its Content-Length as many digits: a read shorter than its
head and that is not whole, a large answer's, is not cut first), and the head and its body's
length (the same head again, as most: no ``int`` per answer)."""


LAYOUTS: dict[tuple[bytes, tuple[int, ...]], tuple[bytes, Callable[[bytes], Any]]] = {}
"""A layout's template (with a ``%b`` in front) and values' getter by its shape's template and
its values' lengths: shared by every target connection, as the templates are."""
_layout = LAYOUTS.get
LAYOUTS_MAX = 512
"""Layouts kept at most (as :data:`.answer_shapes.SHAPES_MAX`), each of a template no longer
than :data:`.answer_shapes.SHAPE_MAX` (:func:`plan_of`'s): what they hold is bounded as the
shapes are (review34: a 56 KB head's layout held ~1.3 MiB)."""


def plan_of(head: Head, template: bytes) -> Plan | None:
    """The plan of ``head``'s layout (its shape's template ``template``) when llhttp frames
    ``head``'s answer by its Content-Length alone (:func:`.length_field`) and the template is no
    longer than a kept shape's (:data:`.answer_shapes.SHAPE_MAX`: a plan holds a slice a field,
    ~1.3 MiB for a 56 KB head's thousands); else None (its answers are llhttp's)."""
    if len(template) > SHAPE_MAX:
        return None
    field = length_field(head)
    if field < 0:
        return None
    head = cast("ParsedPlainHead", head)  # (length_field's)
    values = head.values
    key = (template, tuple(map(len, values)))
    layout = _layout(key)
    if layout is None:
        at = len(b"HTTP/1.1 %d %b\r\n" % (head.status, head.reason))
        cuts = [slice(0, 0)]  # (a tuple for one field too)
        for name, value in zip(head.names, values):  # noqa: B905 (as many)
            at += len(name) + 2
            cuts.append(slice(at, at + len(value)))
            at += len(value) + 2
        layout = (b"%b" + template, itemgetter(*cuts))
        if len(LAYOUTS) < LAYOUTS_MAX:
            LAYOUTS[key] = layout
    kinds, digits = head.wire.translate(_KINDS), len(values[field])
    least = 10 ** (digits - 1) if digits > 1 else 0
    return (*layout, kinds, field, least, head, int(values[field]))


_new_head = object.__new__

Answer = tuple[ParsedPlainHead, bytes, tuple[bytes, ...] | None]
"""An ``ANSWER`` event's value (:data:`.http_events.ANSWER`): a head of the answer's layout (the
plan's: its status, reason, version, names and size are the answer's, its values maybe another
answer's), the answer's bytes as they came (its head, then its body), and its values as the
layout's getter cut them (an empty cut first), or None when its head is that head's bytes. The
answer's own head is made only when asked (:func:`answer_head`): sent on as its bytes, an answer
needs none (the exchange reads only what the layout's head holds too)."""


def answer_head(answer: Answer) -> Head:
    """The head of an ``ANSWER`` event's answer, as :meth:`.Parsed.on_headers_complete` makes a
    plain head (its size on the wire: its bytes')."""
    layout, whole, cut = answer
    if cut is None:  # its head's bytes are the layout head's
        return layout
    values = list(cut)
    del values[0]  # (the empty cut)
    made = _new_head(ParsedPlainHead)
    made.reason, made.status, made.version = layout.reason, layout.status, layout.version
    made.names, made.values, made.size = layout.names, values, layout.size
    made.wire = whole[: layout.size]
    return made


def unfolded(answer: Answer) -> list[tuple[int, object]]:
    """An ``ANSWER`` event's value as the events it stands for: its HEAD, its body's DATA (if it
    has one), the END of a message without trailers."""
    head = answer_head(answer)
    body = answer[1][len(head.wire) :]
    return [(HEAD, head), (DATA, body), ENDED] if body else [(HEAD, head), ENDED]


class NearAnswers:
    """:meth:`_answered` of :class:`~ravenproxy.server.http_messages.Parsed` (its base). The
    state it reads and sets is the parser's (made by its ``__init__``; declared here, not made:
    no attribute more)."""

    __slots__ = ()

    events: deque[tuple[int, object]]
    bodiless: bool
    _plan: Plan | None
    _recent: tuple[Head, bytes, tuple[bytes, ...], int] | None

    def _answered(self, data: bytes) -> int:
        """How many bytes of ``data`` (a response parser's between messages, :attr:`_plan` set)
        are whole answers of the last one's layout (:mod:`.near_answers`), none fed to llhttp,
        each queued as one ``ANSWER`` event (:data:`.http_events.ANSWER`, an :data:`Answer`: what
        llhttp's HEAD, DATA and END say, without two events, a body's slice and a head made an
        answer). An answer whose head's bytes are the last near answer's (the plan's head's, if
        none came under this plan) takes its values as they were cut (answeragain's case: no
        cut, no compare)."""
        template, values_of, kinds, field, least, planned, body = self._plan  # type: ignore[misc]
        if self.bodiless or type(data) is not bytes:
            return 0
        recent = self._recent
        if recent is not None and recent[0] is planned:  # (one under another plan: not of it)
            wire, kept, body = recent[1], recent[2], recent[3]
        else:
            wire, kept = planned.wire, None
        events, at, size = self.events, 0, len(data)
        while True:  # an answer of the layout at ``at``?
            begin = at + len(wire)
            if begin + least > size:  # not whole in ``data`` (or not of the layout): llhttp's
                break
            head = data[at:begin]
            if head == wire:  # the last head again (a scrape's, a probe's)
                cut, length = kept, body
            else:
                cut = values_of(head)
                number = cut[field + 1]
                if (
                    template % cut != head
                    or head.translate(_KINDS) != kinds
                    or not number.isdigit()
                ):
                    break
                length = int(number)
            end = begin + length
            if end > size:  # the body is not whole in ``data``: llhttp's
                break
            # Its HEAD, DATA and END in one event: its bytes as they came (data itself when the
            # read is the answer).
            events.append((ANSWER, (planned, data[at:end], cut)))
            if cut is not kept:
                kept, body, wire = cut, length, head
            at = end
            if end == size:
                break
        if kept is not None and (recent is None or kept is not recent[2]):
            # (A store the class declares for its subclass's slot.)
            self._recent = (planned, wire, kept, body)  # type: ignore[misc]
        return at
