"""answerside: a whole answer read without llhttp is one ``ANSWER`` event (its head and its
bytes as they came), where it was ``(HEAD, head)``, ``(DATA, body)`` and END. The tests that
hold the parser's events, or an exchange's old ``receive_upstream``, to an older parser's read
them unfolded (:func:`.near_answers.unfolded`): :class:`FlatParsed` is today's parser with its
``ANSWER`` events unfolded after each feed, as the older parsers queued them."""

from __future__ import annotations

from collections import deque
from typing import Any

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import Action
from ravenproxy.server.http_events import ANSWER
from ravenproxy.server.http_messages import Parsed
from ravenproxy.server.near_answers import unfolded


def flatten(events: deque[tuple[int, Any]]) -> None:
    """``events`` with each ``ANSWER`` unfolded in place (HEAD, DATA if a body, END)."""
    if any(kind == ANSWER for kind, _ in events):
        flat = [
            e
            for kind, value in events
            for e in (unfolded(value) if kind == ANSWER else [(kind, value)])
        ]
        events.clear()
        events.extend(flat)


class FlatParsed(Parsed):
    """Today's parser, its ``ANSWER`` events unfolded after each feed."""

    __slots__ = ()

    def feed(self, data: bytes) -> bytes | None:
        rest = super().feed(data)
        flatten(self.events)
        return rest


def flat_upstream(ex: Exchange) -> None:
    """The exchange's target parser made a :class:`FlatParsed` (an old ``receive_upstream``
    reads only the events it knew)."""
    up = ex._up
    if up is not None and type(up) is Parsed:
        up.__class__ = FlatParsed


class FlatUpstream(Exchange):
    """Put before an old exchange (``class Flat(FlatUpstream, Old)``): its ``receive_upstream``
    reads its target parser's events unfolded."""

    def receive_upstream(self, data: bytes) -> list[Action]:
        flat_upstream(self)
        return super().receive_upstream(data)
