"""The events :class:`~ravenproxy.server.http_messages.Parsed` queues for the exchange:
``(HEAD, Head)``, ``(DATA, bytes)``, ``(END, trailers)``, ``(ERROR, message)``, ``(EOF, None)``,
``(ANSWER, (Head, bytes))``, and the END of a message without trailers, shared."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ravenproxy.server.http_heads import Head

HEAD, DATA, END, ERROR, EOF, ANSWER = range(6)
"""Event kinds of :class:`~ravenproxy.server.http_messages.Parsed`. ``ANSWER``: a whole answer
read without llhttp (:mod:`.near_answers`), its head and its bytes as they came (the head's
wire, then its body): what ``(HEAD, head)``, ``(DATA, body)`` if it has one, and :data:`ENDED`
would say, in one event (:func:`unfolded`)."""


class _NoTrailers(list[tuple[str, str]]):
    """The trailers of a message that had none: one empty list for every such END event (no
    list and tuple made and freed per message); one that would change it is refused."""

    __slots__ = ()

    def _shared(self, *args: object, **kwargs: object) -> None:
        raise TypeError("the END event's shared empty trailers cannot change")

    append = extend = insert = remove = clear = pop = sort = reverse = _shared  # type: ignore[assignment]
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _shared  # type: ignore[assignment]


ENDED: tuple[int, list[tuple[str, str]]] = (END, _NoTrailers())
"""The END event of a message without trailers, shared."""


def unfolded(answer: tuple[Head, bytes]) -> list[tuple[int, object]]:
    """An ``ANSWER`` event's value as the events it stands for: its HEAD, its body's DATA (if it
    has one), the END of a message without trailers."""
    head, whole = answer
    body = whole[len(head.wire) :]
    return [(HEAD, head), (DATA, body), ENDED] if body else [(HEAD, head), ENDED]
