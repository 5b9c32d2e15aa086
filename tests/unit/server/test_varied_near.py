"""Branch varied (issue 15, 2026-12-06): a near request (the last one's bytes but for an
origin-form target) is recognised by ``Parsed.near`` alone (``_near`` folded into it; ``feed``
asks it), its target checked by three C calls instead of ``_near_line``'s regular expression,
and the kept bytes' lead (method and space) and tail (from the target's end) kept beside them
once lined up with their head's line, not sliced out again for each near request.

The oracle is 53cce6d's ``near``, ``_near``, ``_near_line`` and ``feed``, kept verbatim below on a
subclass of the new parser (``_OldParsed``: every other method is the new one, unchanged by the
branch; its ``_again`` is 53cce6d's pair). Both are fed the same generated reads, offered to
``again`` and ``near`` first as the exchange does or to ``feed`` alone (test_varhead_near's
reads: a request, then ones like it but for a generated target, every byte value anywhere in
it, or with another method, version, line shape or field, a body, ``Connection: close``, an
upgrade, CONNECT; whole, two to a read, split, after CRLFs): the same returns, events (heads
field by field), state, request kept for replay (bytes and head) and heads reused. Every byte
value at every place of a target; long runs of near requests (the kept lead and tail carried
from one to the next) broken by a shifted, a changed or a longer one. And whole exchanges
(test_review26_exchange's driver): the Exchange as it is against one whose client parser is
``_OldParsed``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from httptools import HttpParserError, HttpParserUpgrade
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.http_heads import Head, RequestHead
from ravenproxy.server.http_messages import (
    _ENDED,
    ERROR,
    HEAD,
    REPLAY_MAX,
    Parsed,
    _new_head,
    _Stop,
)
from tests.helpers import examples

from .bd24_requests import Bd24Exchange, Bd24Parsed
from .test_exchange import VIA
from .test_review24_parse import _state, _view
from .test_review26_exchange import _drive
from .test_varhead_near import _reads

# -- 53cce6d's _near_line, Parsed.near, _near and feed, verbatim --------------------------------

_near_line = re.compile(rb"/[!-~]* HTTP/1\.1\r\n").fullmatch
"""A request line past its method's space that llhttp reads as this does: an origin-form
target of visible ASCII (each taken anywhere in a path, query or fragment; a control byte,
DEL, a byte over 0x7F refused) and HTTP/1.1. Any other goes to llhttp (:meth:`Parsed._near`)."""


class _OldParsed(Bd24Parsed):
    """(Its ``again``, which 53cce6d's exchange asked before ``near``, bd24f07's: reqside folded
    ``near`` into it.)"""

    __slots__ = ()

    def near(self, data: bytes, head: Head) -> Head | None:
        """:meth:`_near`'s head, its END queued, when ``head`` is the last and no event waits."""
        again = self._again
        if again is None or again[1] is not head or self.events:
            return None
        near = self._near(data, again)
        if near is None:
            self._again = None  # feed would ask the same (a call, once a request that differs)
            return None
        self.events.append(_ENDED)
        return near

    def _near(self, data: bytes, again: tuple[bytes, Head]) -> Head | None:
        """llhttp's head of ``data``, the kept request's bytes but for an origin-form target
        (:data:`_near_line`; the parser where that request left it, which is replayable), made
        without llhttp (whose state it would leave as it is), sharing the last one's fields."""
        last = again[1]
        line = last.line  # the last request line as it came (None: not known whole)
        kept = self._last
        if line is None or kept is None or kept[5] is not last or type(data) is not bytes:
            return None
        whole, cut = again[0], len(data) - len(again[0]) + len(line)  # the new line's end
        method = len(last.start) + 1  # the method and its space (ASCII: as many bytes)
        if (
            cut <= method
            or data[cut:] != whole[len(line) :]
            or whole[: len(line)] != line  # kept after CRLFs llhttp skipped: bytes shifted
            or data[:method] != line[:method]
            or _near_line(data, method, cut) is None
            or self.in_head
            or self.in_body
            or not (last is self._replay_head or self._replayable(last))  # asked last
        ):
            return None
        target = data[method : cut - 11]
        head = _new_head(RequestHead)
        head.start, head.target, head.version = last.start, target.decode("latin-1"), last.version
        head.line, head.fields, head.wire = data[:cut], last.fields, last.wire
        head.routing, head.size = last.routing, last.size + cut - len(line)
        self._last = (target, kept[1], kept[2], kept[3], kept[4], head)
        self._again = (data, head) if len(data) <= REPLAY_MAX else None
        self._replay_head = head  # _replayable's answer: its method, version, routing are these
        return head

    def feed(self, data: bytes) -> bytes | None:
        """Parse ``data``; returns the bytes past an upgrade's (or CONNECT's) head, if one
        ended the HTTP part of the connection. An error is queued after what came before it."""
        events = self.events
        again = self._again
        if again is not None:
            # The last request again (a scrape, a probe) or but for its target (a next URL):
            # the parser would make the same two events (the head but for its target).
            head = self._repeated(data) if data == again[0] else self._near(data, again)
            if head is not None:
                events.append((HEAD, head))
                events.append(_ENDED)
                self.fed = 0
                return None
            # The parser leaves that state: what it held is remembered anew (or not at all).
            self._again = None
        if self.tail > self.max_tail:  # refused (below): nothing more goes into the parser
            return None
        # A request may begin at the start of ``data`` (the parser between messages, no event
        # waiting): a response is never kept, not asked whether it came whole.
        fresh = False
        if not self.in_body:
            self.fed += len(data)
            if self.in_head:
                pass
            elif self._response:
                # (A slice compared: startswith parses its arguments by format, ~200 more.)
                self._version = "1.1" if data[:9] == b"HTTP/1.1 " else None
            else:
                self._line = data
                fresh = not events
        queued = len(events)
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            return data[exc.args[0] :]
        except HttpParserError as exc:
            if not isinstance(exc.__context__, _Stop):
                events.append((ERROR, str(exc) or type(exc).__name__))
            return None
        finally:
            # A head begun and not ended (the callbacks keep _between, not in_head: one C
            # call, no Python one, at a message's start).
            self.in_head = not self._between
        if self.in_body and len(events) == queued:  # inside a body, and nothing of it came
            self.tail += len(data)
            if self.tail > self.max_tail:
                events.append((ERROR, f"chunk framing or trailers over {self.max_tail} bytes"))
        elif fresh and len(events) == 2 and events[1] is _ENDED and not self.in_head:
            # One whole request that left the parser as it found it (no body event, nothing of
            # a next message begun) is kept: the same bytes again are that request again.
            # (Whether it may be replayed is asked then: _replayable.) Its events are its HEAD
            # and the shared END of a message without trailers: what a fresh parse queues
            # first is a HEAD (no body is begun before one; an error returned above), and after
            # that END the parser is in no body (a next message's body follows its HEAD: a
            # third event). Here, not in a method of its own: once a request that differs.
            parsed = events[0][1]
            assert isinstance(parsed, Head)
            if len(data) <= REPLAY_MAX:
                self._again = (bytes(data), parsed)
        return None


class _OldExchange(Bd24Exchange):
    """The Exchange with 53cce6d's client parser (its own code is 53cce6d's: bd24f07's, which
    reqside restructured: ``Bd24Exchange``)."""

    def __init__(self, *, via: str, max_head: int) -> None:
        super().__init__(via=via, max_head=max_head)
        self.client = _OldParsed(response=False, max_tail=max_head)


# -- the parse ------------------------------------------------------------------------------------


def _kept(parsed: Any, heads: list[object]) -> object:
    again = parsed._again
    if again is None:
        return None
    return again[0], next(i for i, h in enumerate(heads) if h is again[1])


def _both(reads: list[bytes], *, exchange_way: bool) -> int:
    """``reads`` fed to the new and 53cce6d's parsers alike (``exchange_way``: offered to
    ``again`` then ``near`` first, as the exchange does; else to ``feed`` alone): the same
    returns, events, state, request kept and heads reused. Returns how many were near."""
    new, old = Parsed(response=False), _OldParsed(response=False)
    heads: list[list[object]] = [[], []]
    near = 0
    for i, data in enumerate(reads):
        taken = False
        if exchange_way and heads[0] and not new.events and not old.events:
            last_new, last_old = heads[0][-1], heads[1][-1]
            got = new.again(data, last_new)  # type: ignore[arg-type]  # (near's head too)
            taken = got is last_new
            assert taken == old.again(data, last_old), i  # type: ignore[arg-type]
            if not taken:
                made_new = got
                made_old = old.near(data, last_old)  # type: ignore[arg-type]
                assert (made_new is None) == (made_old is None), i
                if made_new is not None:
                    near += 1
                    taken = True
                    heads[0].append(made_new)
                    heads[1].append(made_old)
                    assert _view((HEAD, made_new)) == _view((HEAD, made_old)), i
        if not taken:
            assert new.feed(data) == old.feed(data), i
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events], i
        assert _state(new) == _state(old), i
        if not taken:
            heads[0] += [v for k, v in new.events if k == HEAD]
            heads[1] += [v for k, v in old.events if k == HEAD]
        assert _kept(new, heads[0]) == _kept(old, heads[1]), i
        new.events.clear()
        old.events.clear()
    reused = [[next(j for j, o in enumerate(seen) if o is h) for h in seen] for seen in heads]
    assert reused[0] == reused[1]
    return near


_NEAR = b"GET /ping?n=%d HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: latency\r\n\r\n"


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_reads(), st.booleans())
@example([_NEAR % 1, _NEAR % 2, _NEAR % 2, _NEAR % 30, _NEAR % 1], True)
@example([_NEAR % 1, b"\r\n" + _NEAR % 2, _NEAR % 3, _NEAR % 4], True)  # bytes shifted
@example([_NEAR % 1, b"GET /xyz HTTP/1.1\r\n\r\nHost: edge-1:9100\r\n\r\n"], True)
@example([_NEAR % 1, (_NEAR % 2).replace(b"/ping", b"/" + b"x" * REPLAY_MAX), _NEAR % 3], True)
@example([_NEAR % 1, (_NEAR % 2) + _NEAR % 3, _NEAR % 4], False)  # pipelined, then near
def test_the_parse_as_53cce6d(reads: list[bytes], exchange_way: bool) -> None:
    _both(reads, exchange_way=exchange_way)


@pytest.mark.parametrize("method", [b"GET", b"OPTIONS", b"DELETE"])
def test_every_byte_value_in_a_target_as_53cce6d(method: bytes) -> None:
    """Every byte value, at every place of an origin-form target (its first included): near
    exactly where 53cce6d's regular expression said so (visible ASCII after a "/")."""
    first = method + b" /metrics HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"
    for byte in range(256):
        for at in range(13):
            target = b"/metrics?n=1"
            target = target[:at] + bytes([byte]) + target[at:]
            second = first.replace(b" /metrics ", b" " + target + b" ")
            near = _both([first, second, first.replace(b"/metrics", b"/m2")], exchange_way=True)
            visible = all(0x21 <= b <= 0x7E for b in target) and target[:1] == b"/"
            # The second near, and the third after it (its tail kept).
            assert (near == 2) == visible, (byte, at)


@st.composite
def _runs(draw: st.DrawFn) -> list[bytes]:
    """Long runs of near requests (the kept lead and tail carried from one to the next), each
    now and then broken: shifted by CRLFs, a field changed, longer than the replay bound,
    another method, or the same bytes again."""
    base = draw(st.sampled_from([_NEAR, _NEAR.replace(b"GET", b"DELETE"), _NEAR + b""]))
    reads = [base % 0]
    for n in range(1, draw(st.integers(2, 30))):
        data = base % n
        how = draw(st.sampled_from(["near"] * 12 + ["crlf", "field", "long", "method", "same"]))
        if how == "crlf":
            data = b"\r\n" + data
        elif how == "field":
            data = data.replace(b"latency", b"other")
        elif how == "long":
            data = data.replace(b"/ping", b"/" + b"y" * REPLAY_MAX)
        elif how == "method":
            data = b"HEAD" + data[data.index(b" ") :]
        elif how == "same":
            data = reads[-1]
        reads.append(data)
    return reads


@settings(max_examples=examples(1200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_runs(), st.booleans())
def test_runs_of_near_requests_as_53cce6d(reads: list[bytes], exchange_way: bool) -> None:
    _both(reads, exchange_way=exchange_way)


def test_a_run_of_near_requests_is_made_without_llhttp() -> None:
    """Not only alike: each near request of a run is near (its lead and tail kept)."""
    reads = [_NEAR % n for n in range(12)]
    assert _both(reads, exchange_way=True) == 11
    parsed = Parsed(response=False)
    parsed.feed(reads[0])
    head = parsed.events[0][1]
    parsed.events.clear()
    for data in reads[1:]:
        made = parsed.again(data, head)  # type: ignore[arg-type]
        assert made is not None and made.target == data.split(b" ")[1].decode()
        assert parsed._again is not None and parsed._again[2] == b"GET "
        assert parsed._again[3] == data[data.index(b" HTTP/1.1\r\n") :]
        head = made
        parsed.events.clear()


# -- whole exchanges ------------------------------------------------------------------------------

_ANSWER = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
_CHUNKED = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"]


@settings(max_examples=examples(1200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_reads(), _runs()), st.lists(st.booleans(), min_size=1, max_size=3))
@example(
    [
        _NEAR % 1,
        (_NEAR % 2).replace(b"/ping", b"/m?nodeName=edge-2&x"),  # names another node
        _NEAR % 3,
        (_NEAR % 4).replace(b"/ping", b"/exec/ns/pod/c"),  # a pod path
        b"\r\n" + _NEAR % 5,
        _NEAR % 6,
        _NEAR % 7,
    ],
    [False],
)
def test_exchanges_as_53cce6d(reads: list[bytes], fresh: list[bool]) -> None:
    answers = [_ANSWER, _CHUNKED]
    new = _drive(Exchange(via=VIA, max_head=4096), reads, answers, fresh)
    old = _drive(_OldExchange(via=VIA, max_head=4096), reads, answers, fresh)
    assert new == old
