"""The events :class:`~ravenproxy.server.http_messages.Parsed` queues for the exchange:
``(HEAD, Head)``, ``(DATA, bytes)``, ``(END, trailers)``, ``(ERROR, message)``, ``(EOF, None)``,
``(ANSWER, Answer)`` (:data:`.near_answers.Answer`), and the END of a message without trailers,
shared."""

from __future__ import annotations

HEAD, DATA, END, ERROR, EOF, ANSWER = range(6)
"""Event kinds of :class:`~ravenproxy.server.http_messages.Parsed`. ``ANSWER``: a whole answer
read without llhttp (:mod:`.near_answers`): a head of its layout, its bytes as they came (its
head, then its body) and its values as cut: what ``(HEAD, head)``, ``(DATA, body)`` if it has
one, and :data:`ENDED` would say, in one event (:func:`.near_answers.unfolded`)."""


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
