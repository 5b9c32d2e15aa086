"""How an answer of the last answer's shape — its status line and field names, in order and
case, the last one's; only its values differ (a Date, a Content-Length, an ETag) — is read
without llhttp: a regular expression per shape (:func:`plan_of`), which
:meth:`~ravenproxy.server.http_messages.Parsed.feed` matches at a read's start when llhttp is
between messages and the last head is one llhttp frames by its Content-Length alone
(:func:`~ravenproxy.server.parsed_answers.length_field`).

What a value may hold is what llhttp was seen to take as it comes (tests/unit/server/
test_answerparse_rules.py asks llhttp itself): any byte but a control (HTAB excepted) and DEL,
obs-text (0x80-0xFF) included, trailing spaces and tabs kept, empty allowed; not beginning with
a space or a tab (llhttp drops those), not holding a CR or an LF. The Content-Length's value:
ASCII digits only, at most 18 (llhttp's number, a leading zero included, is ``int``'s). A line
that is anything else does not match: the answer goes to llhttp, as does one whose head or body
is not whole in the read.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from typing import Any, cast

from ravenproxy.server.http_events import DATA, ENDED, HEAD
from ravenproxy.server.http_heads import Head
from ravenproxy.server.parsed_answers import ParsedPlainHead, length_field

_VALUE = rb"((?:[!-~\x80-\xff][\t -~\x80-\xff]*)?)"
"""A field's value as llhttp reports it, its bytes as they came (see the module's docstring)."""
_LENGTH = rb"([0-9]{1,18})"
"""The Content-Length's value: digits (18 at most: no overflow, no long ``int``)."""

Match = Callable[[bytes, int], "re.Match[bytes] | None"]
Plan = tuple[Match, int]
"""A shape's plan: its pattern's ``match`` (at a position) and which value is the
Content-Length's."""

PLANS: dict[bytes, Plan] = {}
"""Plans by their shape's template (:mod:`.answer_shapes`: one bytes object a shape, its hash
kept): shared by every target connection, as the templates are."""
_plan_by_template = PLANS.get
PLANS_MAX = 512
"""Plans kept at most (as :data:`.answer_shapes.SHAPES_MAX`)."""


def plan_of(head: Head, template: bytes) -> Plan | None:
    """The plan of ``head``'s shape (its template ``template``) when llhttp frames ``head``'s
    answer by its Content-Length alone (:func:`.length_field`); else None."""
    at = length_field(head)
    if at < 0:
        return None
    plan = _plan_by_template(template)
    if plan is None:
        head = cast("ParsedPlainHead", head)  # (length_field's)
        lines = [b"HTTP/1\\.1 %d %b\r\n" % (head.status, re.escape(head.reason))]
        for i, name in enumerate(head.names):
            lines.append(b"%b: %b\r\n" % (re.escape(name), _LENGTH if i == at else _VALUE))
        lines.append(b"\r\n")
        plan = (re.compile(b"".join(lines)).match, at)
        if len(PLANS) < PLANS_MAX:
            PLANS[template] = plan
    return plan


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
        are whole answers of the last one's shape (:mod:`.near_answers`), their events queued
        as llhttp's — the last head itself when its values come again (its whole-head reuse),
        else one made as :meth:`on_headers_complete` makes it — none fed to llhttp."""
        match, length = self._plan  # type: ignore[misc]  # (feed's gate)
        if self.bodiless or type(data) is not bytes or (got := match(data, 0)) is None:
            return 0
        last: Any = self._last  # (set with _plan)
        kept: Any = last[5]
        events, at, size = self.events, 0, len(data)
        while True:  # ``got``: a head of the shape at ``at``
            values = list(got.groups())
            start = got.end()
            end = start + int(values[length])
            if end > size:  # the body is not whole in ``data``: llhttp's
                break
            if values != kept.values:
                # As on_headers_complete's plain head: the head's size on the wire is its
                # bytes', which are its template with its values.
                wire = data[at:start]
                made: Any = _new_head(ParsedPlainHead)
                made.reason, made.status, made.version = kept.reason, kept.status, kept.version
                made.names, made.values, made.size, made.wire = kept.names, values, len(wire), wire
                kept = made
            events.append((HEAD, kept))
            if end > start:  # llhttp's body event: the body's bytes in this read
                events.append((DATA, data[start:end]))
            events.append(ENDED)
            at = end
            if end == size or (got := match(data, end)) is None:
                break
        if kept is not last[5]:  # the last head's: as on_headers_complete keeps it
            # (A store the class declares for its subclass's slot.)
            self._last = (last[0], last[1], kept.values, last[3], last[4], kept)  # type: ignore[misc]
        return at
