"""The events :class:`~ravenproxy.server.http_messages.Parsed` queues for the exchange:
``(HEAD, Head)``, ``(DATA, bytes)``, ``(END, trailers)``, ``(ERROR, message)``, ``(EOF, None)``,
and the END of a message without trailers, shared."""

from __future__ import annotations

HEAD, DATA, END, ERROR, EOF = range(5)
"""Event kinds of :class:`~ravenproxy.server.http_messages.Parsed`."""


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
