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
from ravenproxy.server.http_events import ANSWER
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


class NearAnswers:
    """:meth:`_answered` of :class:`~ravenproxy.server.http_messages.Parsed` (its base). The
    state it reads and sets is the parser's (made by its ``__init__``; declared here, not made:
    no attribute more)."""

    __slots__ = ()

    events: deque[tuple[int, object]]
    bodiless: bool
    _plan: Plan | None
    _last: tuple[bytes, list[bytes], list[bytes], object, str, Head] | None

    def _answered(self, data: bytes) -> int:
        """How many bytes of ``data`` (a response parser's between messages, :attr:`_plan` set)
        are whole answers of the last one's layout (:mod:`.near_answers`), none fed to llhttp,
        each queued as one ``ANSWER`` event (:data:`.http_events.ANSWER`: its head and its bytes,
        what llhttp's HEAD, DATA and END say, without two events and a body's slice an answer):
        its head the last head itself when its bytes come again (its whole-head reuse,
        answeragain's case), else one made as :meth:`on_headers_complete` makes it."""
        template, values_of, kinds, field, least, planned, body = self._plan  # type: ignore[misc]
        if self.bodiless or type(data) is not bytes:
            return 0
        last: Any = self._last  # (set with _plan)
        kept: Any = last[5]
        if kept is not planned:  # a head the path made: its body's length once asked
            body = -1
        wire, events, at, size = kept.wire, self.events, 0, len(data)
        while True:  # an answer of the layout at ``at``?
            begin = at + len(wire)
            if begin + least > size:  # not whole in ``data`` (or not of the layout): llhttp's
                break
            head = data[at:begin]
            if head == wire:  # the last head again (a scrape's, a probe's)
                if body < 0:
                    body = int(kept.values[field])  # (digits: checked)
                made, length = kept, body
            else:
                cut = values_of(head)
                number = cut[field + 1]
                if (
                    template % cut != head
                    or head.translate(_KINDS) != kinds
                    or not number.isdigit()
                ):
                    break
                values = list(cut)
                del values[0]  # (the empty cut)
                # As on_headers_complete's plain head (its size on the wire: its bytes').
                made = _new_head(ParsedPlainHead)
                made.reason, made.status, made.version = kept.reason, kept.status, kept.version
                made.names, made.values, made.size, made.wire = kept.names, values, len(head), head
                length = int(number)
            end = begin + length
            if end > size:  # the body is not whole in ``data``: llhttp's
                break
            # Its HEAD, DATA and END in one event: its bytes as they came (data itself when the
            # read is the answer).
            events.append((ANSWER, (made, data[at:end])))
            if made is not kept:
                kept, body, wire = made, length, head
            at = end
            if end == size:
                break
        if kept is not last[5]:  # the last head's: as on_headers_complete keeps it
            # (A store the class declares for its subclass's slot.)
            self._last = (last[0], last[1], kept.values, last[3], last[4], kept)  # type: ignore[misc]
        return at
