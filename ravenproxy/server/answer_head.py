"""The head an answer goes to the client with, and how its body is framed after it: a base of
:class:`~ravenproxy.server.exchange.Exchange` (through
:class:`~ravenproxy.server.exchange_answer.AnswerSide`), reading and setting the exchange's
state it declares."""

from __future__ import annotations

from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import Parsed
from ravenproxy.server.http_rewrite import Framing, response_framing


class AnswerHead:
    """:meth:`_response_head` of :class:`~ravenproxy.server.exchange.Exchange`. The state it
    reads is the exchange's (set by its ``__init__``; declared here, not made: no attribute
    more)."""

    _client_keep: bool
    body_done: bool
    _body_out: str
    _until_close: bool
    _up_keep: bool
    _up: Parsed | None
    _request: Head | None
    _answered: tuple[Head, Head | None, tuple[bool, ...], Framing] | None

    def _response_head(self, response: Head, bodiless: bool) -> bytes:
        """The head for the client, and how the body after it is framed. An answer before the
        request body is through closes the connection after it (``Exchange._finished``): it
        says so. (A plain answer to a kept client, a target's usual one, does not come here:
        ``AnswerSide.receive_upstream`` sends it on as parsed, response_framing's plain case
        written out there.)"""
        client_keep = self._client_keep and self.body_done
        request, rest = self._request, (bodiless, client_keep, self._up is not None)
        seen = self._answered  # heads by identity: a changed one is not compared field by field
        if seen is not None and seen[0] is response and seen[1] is request and seen[2] == rest:
            framing = seen[3]
        else:
            assert self._request is not None
            framing = response_framing(
                response,
                bodiless=bodiless,
                request_version=self._request.version,
                client_keep=client_keep,
                upstream=self._up is not None,
            )
            self._answered = (response, request, rest, framing)
        self._body_out, self._until_close = framing.body_out, framing.until_close
        self._up_keep, self._client_keep = framing.up_keep, framing.client_keep
        return framing.head
