"""A response head as :class:`~ravenproxy.server.http_messages.Parsed` makes it from llhttp's
parse (:class:`ParsedPlainHead`), and how llhttp frames an answer whose head is a plain head's
bytes again or of its shape with other values (:func:`length_field`: such an answer is queued
without llhttp, :mod:`.near_answers`)."""

from __future__ import annotations

from ravenproxy.server.http_heads import PlainHead


def paired(
    names: list[bytes] | tuple[bytes, ...], values: list[bytes]
) -> list[tuple[bytes, bytes]]:
    """The fields as a head holds them (:attr:`Head.fields`) from the parse's names and values."""
    return list(zip(names, values))  # noqa: B905 (as many: on_header appends both)


class ParsedPlainHead(PlainHead):
    """A :class:`PlainHead` as the parse makes it (object's C constructor and its stores): the
    names and values as llhttp gave them, paired into :attr:`Head.fields` only when asked (the
    head goes on as its wire: most are never asked)."""

    __slots__ = ("names", "values")

    names: tuple[bytes, ...]
    values: list[bytes]

    @property
    def fields(self) -> list[tuple[bytes, bytes]]:  # type: ignore[override]  # made when asked
        return paired(self.names, self.values)


_LENGTH_AT: dict[tuple[bytes, ...], int] = {}
"""Where the Content-Length is among a shape's names (:func:`length_field`'s), by the names."""
_length_at = _LENGTH_AT.get
LENGTH_AT_MAX = 512
"""Names kept at most (as :data:`.answer_shapes.SHAPES_MAX`), each set of them no longer on the
wire than :data:`.answer_shapes.SHAPE_MAX`: its one caller, :func:`.near_answers.plan_of`, asks
only for shapes whose template is no longer."""


def length_field(head: object) -> int:
    """Where the Content-Length is among the fields of ``head`` (an index into its names and
    values) when llhttp frames an answer whose head is ``head``'s :attr:`Head.wire` (parsed when
    llhttp is between messages, not answering a HEAD) by that Content-Length alone and is
    between messages after it; else -1.

    That wire is the head's bytes: ``HTTP/1.1``, its status, reason, names and values as llhttp
    parsed them, each line ending in CRLF, CR and LF nowhere else (llhttp takes none inside a
    value or reason), so llhttp parsing those bytes ends their head at their empty line, with
    the parts it made them from. Framed by its Content-Length when it is a :class:`PlainHead`
    (one Content-Length, no hop-by-hop field: no Transfer-Encoding, no Connection: kept alive
    as HTTP/1.1) of version 1.1 and a final status with a body (not 1xx, 204, 304). The same
    holds for any head of its version, status, reason and names with other values
    (:mod:`.near_answers`): plainness is the names'."""
    if type(head) is not ParsedPlainHead or head.version != "1.1":
        return -1
    if head.status < 200 or head.status in (204, 304):
        return -1
    names = head.names
    at = _length_at(names)
    if at is None:
        lowered = [name.lower() for name in names]  # (a plain head has one)
        at = lowered.index(b"content-length") if b"content-length" in lowered else -1
        if len(_LENGTH_AT) < LENGTH_AT_MAX:
            _LENGTH_AT[names] = at
    return at
