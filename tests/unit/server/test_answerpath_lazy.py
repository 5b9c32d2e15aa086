"""answerpath: an answer read without llhttp (near_answers) makes no head of its own. Its
``ANSWER`` event carries a head of its layout (the plan's: status, reason, version, names and
size the answer's), its bytes and its values as cut; its own head is made only when the event is
unfolded (a client not kept alive, a request body still to come). The parser keeps the last
near answer's head bytes, values and body length (``Parsed._recent``, valid under the plan it
was read by) where cdb10ca kept a head in ``_last``.

Held to cdb10ca: its ``NearAnswers._answered``, ``http_events.unfolded`` and
``AnswerSide.receive_upstream`` are kept verbatim below (``OldParsed``, ``OldExchange``), and
old and new are compared over generated inputs: the parser alone (answers of three layouts
whose heads are as long, values from small sets so that heads repeat, a Content-Length that
changes length, reads of 1-3 answers cut anywhere, HEAD's answers, a value llhttp refuses) by
its events unfolded and its state after each read; and the exchange over review36's
conversations (requests pipelined, bodies still coming, strays, 101s, HTTP/1.0, closes) and
over runs of the three layouts, action by action and state by state. Plus: the path is taken
(ANSWER events from the third answer of a layout on), and an ANSWER's head is never the answer's
own when its values differ, but reads as it for what the exchange asks of it.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import Action, SwitchProtocols, WriteClient
from ravenproxy.server.exchange_answer import _CLOSED_UNANSWERED, _new
from ravenproxy.server.http_events import ANSWER, DATA, END, ENDED, EOF, ERROR, HEAD
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import Parsed
from ravenproxy.server.http_rewrite import chunk, last_chunk
from ravenproxy.server.near_answers import _KINDS, answer_head, unfolded
from ravenproxy.server.parsed_answers import ParsedPlainHead
from tests.helpers import examples

from .test_exchange import VIA
from .test_heads_parse import _view
from .test_review36_answer_event import NEAR, ODD, drive

_new_head = object.__new__


# -- cdb10ca, verbatim ---------------------------------------------------------------------------
def _old_unfolded(answer: tuple[Head, bytes]) -> list[tuple[int, object]]:
    """An ``ANSWER`` event's value as the events it stands for: its HEAD, its body's DATA (if it
    has one), the END of a message without trailers."""
    head, whole = answer
    body = whole[len(head.wire) :]
    return [(HEAD, head), (DATA, body), ENDED] if body else [(HEAD, head), ENDED]


class OldParsed(Parsed):
    """cdb10ca's parser: its ``_answered`` verbatim (the rest of ``Parsed`` is unchanged)."""

    __slots__ = ()

    def _answered(self, data: bytes) -> int:
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


class OldExchange(Exchange):
    """cdb10ca's ``receive_upstream``, verbatim (its ``unfolded``: cdb10ca's), over
    :class:`OldParsed`."""

    def upstream_opened(self) -> list[Action]:
        actions = super().upstream_opened()
        if self._up is not None:
            self._up.__class__ = OldParsed
        return actions

    def receive_upstream(self, data: bytes) -> list[Action]:
        """Bytes from the target connection; ``b""``: it closed."""
        up = self._up
        if self.phase != "forwarding" or up is None:
            return []
        if not data:
            up.events.append((EOF, None))
        else:
            rest = up.feed(data)
            if rest is not None:
                self._up_rest = rest
        # Bytes for the client are gathered while events come without waiting (head, body,
        # end of a small response: one write) and flushed before the driver waits again.
        out: list[bytes] = []
        counted = 0  # the final answer's status once its head is in out (WriteClient.status)
        events: deque[tuple[int, Any]] = up.events  # a kind says its value's type: no isinstance
        while events:
            kind, value = events.popleft()
            if kind == DATA:
                out.append(chunk(value) if self._body_out == "chunked" else value)
            elif kind == HEAD or kind == ANSWER:
                answer = None
                if kind == ANSWER:  # a whole answer (near_answers): its head, then the rest
                    answer, value = value, value[0]
                status = value.status
                if value.size > self.max_head:
                    return self._flushed(out, counted, self._bad_response("head too large"))
                if status == 101:
                    if not self._upgrade:
                        failure = self._failed("101 without an upgrade request", status=502)
                        return self._flushed(out, counted, failure)
                    self.started = True
                    self.phase = "switching"
                    self._switched = value
                    return self._flushed(out, counted, [SwitchProtocols()])
                self.started = True
                if status < 200:
                    self._info = True
                    out.append(value.wire)  # an interim answer goes on whole
                else:
                    counted = status
                    if (
                        value.plain
                        and self._client_keep
                        and self.body_done
                        and not up.bodiless
                        and status not in (204, 304)
                    ):
                        # response_framing's plain case kept alive, written out (not in
                        # _response_head: a call an answer): a target's usual answer goes on as
                        # parsed, without two calls, a Framing and a memo entry per answer
                        # (test_exchange_plain and test_server90_inline hold it to
                        # response_framing's and 8a65720's). ``up`` is held.
                        self._body_out, self._until_close = "length", False
                        self._up_keep = value.version == "1.1"
                        if answer is not None:  # head, body and end: its bytes as they came
                            out.append(answer[1])
                            break  # (its end: below)
                        out.append(value.wire)
                    else:
                        out.append(self._response_head(value, up.bodiless))  # no keyword: faster
                if answer is not None:  # its body and end, as llhttp's events, next
                    events.extendleft(_old_unfolded(answer)[:0:-1])
            elif kind == END:
                if self._info:
                    self._info = False
                    continue
                if self._body_out == "chunked":
                    out.append(last_chunk(value))
                break  # (the answer's end: below)
            elif kind == ERROR:
                return self._flushed(out, counted, self._bad_response(str(value)))
            elif self._until_close and self.started:  # EOF ends a body framed by the close
                if self._body_out == "chunked":
                    out.append(last_chunk([]))
                self._up_keep = False
                return self._flushed(out, counted, self._finished())
            else:
                what = "the connection was closed" if self.started else _CLOSED_UNANSWERED
                return self._flushed(out, counted, self._bad_response(what))
        else:  # no answer ended
            if up.in_head and up.fed > self.max_head:
                return self._flushed(out, counted, self._bad_response("head too large"))
            return self._flushed(out, counted, [])
        # An answer ended (its END, or an ANSWER's whole).
        if out:  # the action made without its __init__ (a Python call an answer)
            write = _new(WriteClient)
            write.data, write.status = b"".join(out), counted
            actions: list[Action] = [write]
        else:
            actions = []
        if self._up_keep and self._client_keep and self.body_done and not events:
            if self.client_raw is None and not up.in_head:  # _finished's common case
                self.phase = "head"
                return actions
        return actions + self._finished()


# -- the generated inputs ------------------------------------------------------------------------
_LAYOUTS = [  # three layouts whose heads are as long: a plan of one must not read another's
    b"HTTP/1.1 200 OK\r\nDate: %b\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 404 NF\r\nDate: %b\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nDATE: %b\r\ncontent-length: %d\r\n\r\n",
]
_DATES = [b"Sun, 06 Dec 2026 12:00:0%d GMT" % s for s in range(3)] + [b"te\x01t"]
_BODIES = [b"", b"x", b"ok", b"abc", b"0123456789"]  # (the last: a Content-Length as long no more)


@st.composite
def _answer(draw: Any) -> bytes:
    layout = draw(st.sampled_from(_LAYOUTS * 3 + [_LAYOUTS[0].replace(b"1.1", b"1.0", 1)]))
    date = draw(st.sampled_from(_DATES[:3] * 6 + _DATES[3:]))  # (one llhttp refuses, seldom)
    body = draw(st.sampled_from(_BODIES * 3 + [b"ok"] * 8))
    return bytes(layout % (date, len(body)) + body)


@st.composite
def _run(draw: Any) -> list[bytes]:
    """1-5 answers of one layout (a run: a plan is made from its second), values drawn."""
    layout = draw(st.sampled_from(_LAYOUTS))
    dates = st.sampled_from(_DATES[:2])
    bodies = st.sampled_from([b"ok", b"ok", b"x"])
    pairs = draw(st.lists(st.tuples(dates, bodies), min_size=1, max_size=5))
    return [layout % (date, len(body)) + body for date, body in pairs]


@st.composite
def _reads(draw: Any) -> list[tuple[bytes, bool]]:
    """Reads of 1-3 answers, some cut anywhere; each with whether it answers a HEAD. The
    answers drawn one by one, or in runs of one layout (its bytes again under another's plan)."""
    if draw(st.booleans()):
        answers = draw(st.lists(_answer(), min_size=1, max_size=24))
    else:
        answers = [a for run in draw(st.lists(_run(), min_size=1, max_size=8)) for a in run]
    rng = random.Random(draw(st.integers(0, 2**32)))
    reads: list[tuple[bytes, bool]] = []
    at = 0
    while at < len(answers):
        n = rng.choice([1, 1, 1, 1, 2, 3])
        whole = b"".join(answers[at : at + n])
        at += n
        bodiless = rng.random() < 0.05
        if rng.random() < 0.2 and len(whole) > 2:
            cut = rng.randrange(1, len(whole))
            reads += [(whole[:cut], bodiless), (whole[cut:], bodiless)]
        else:
            reads.append((whole, bodiless))
    return reads


def _events(parsed: Parsed) -> list[object]:
    """The queued events, each ``ANSWER`` unfolded (by its parser's ``unfolded``), read whole."""
    unfold = _old_unfolded if type(parsed) is OldParsed else unfolded
    flat = [
        e
        for kind, value in parsed.events
        for e in (unfold(value) if kind == ANSWER else [(kind, value)])
    ]
    return [_view(e) for e in flat]


def _parser_state(parsed: Parsed) -> tuple[object, ...]:
    parser = parsed.parser
    llhttp = (parser.get_status_code(), parser.get_http_version(), parser.should_keep_alive())
    plan = parsed._plan
    # The plan's layout (which head of it the plan holds is not cdb10ca's: its ``_last`` held
    # the near answers' heads, which llhttp's next head of the same values reused).
    planned = None if plan is None else (plan[0], plan[2], plan[3], plan[4], plan[5].size)
    return (parsed.in_head, parsed.in_body, parsed.fed, parsed.tail, planned, llhttp)


def _fed_both(reads: list[tuple[bytes, bool]]) -> int:
    """``reads`` fed to cdb10ca's parser and today's: the same events (unfolded) and state
    after each; an ANSWER's head reads as its answer's head for what the exchange asks. Returns
    how many ANSWER events today's queued."""
    new, old = Parsed(response=True), OldParsed(response=True)
    answers = 0
    for data, bodiless in reads:
        new.bodiless = old.bodiless = bodiless
        assert new.feed(data) == old.feed(data)
        for kind, value in new.events:
            if kind == ANSWER:
                answers += 1
                layout, own = value[0], answer_head(value)
                assert (layout.status, layout.size, layout.plain, layout.version) == (
                    own.status,
                    own.size,
                    own.plain,
                    own.version,
                )
                assert value[1].startswith(own.wire)
        assert _events(new) == _events(old)
        assert _parser_state(new) == _parser_state(old)
        new.events.clear()
        old.events.clear()
    return answers


# -- the parser ----------------------------------------------------------------------------------
@settings(max_examples=examples(1600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_reads())
def test_reads_of_three_layouts_are_parsed_as_cdb10ca_did(reads: list[tuple[bytes, bool]]) -> None:
    _fed_both(reads)


def _a(layout: int, date: int, body: bytes) -> bytes:
    return _LAYOUTS[layout] % (_DATES[date], len(body)) + body


def test_the_path_is_taken_and_a_repeated_head_takes_its_cut() -> None:
    """From the third answer of a layout on, ANSWER events; a head that repeats the last near
    one's (in the read or the next) queues its values as cut, no new cut."""
    reads = [(_a(0, 0, b"ok"), False), (_a(0, 1, b"ok"), False)]  # llhttp's: the plan
    reads += [(_a(0, 2, b"x"), False), (_a(0, 2, b"x") * 2, False), (_a(0, 2, b"x"), False)]
    assert _fed_both(reads) == 4
    parsed = Parsed(response=True)
    for data, _ in reads[:3]:
        parsed.feed(data)
    parsed.events.clear()
    parsed.feed(reads[3][0])
    parsed.feed(reads[4][0])
    cuts = [value[2] for kind, value in parsed.events if kind == ANSWER]
    assert len(cuts) == 3 and cuts[0] is cuts[1] is cuts[2] is parsed._recent[2]  # type: ignore[index]
    heads = [value[0] for kind, value in parsed.events if kind == ANSWER]
    assert all(head is parsed._plan[5] for head in heads)  # type: ignore[index]
    assert answer_head(parsed.events[0][1]).wire == _a(0, 2, b"x")[: heads[0].size]  # type: ignore[arg-type]


def test_the_last_near_answer_is_not_taken_under_another_plan() -> None:
    """The last near answer's bytes again once another layout's plan is made (its heads as
    long) are not read as that layout's: cut again, refused by its template, llhttp's."""
    a_runs = [(_a(0, d, b"ok"), False) for d in (0, 1, 2)]
    b_runs = [(_a(1, d, b"ok"), False) for d in (0, 1)]  # llhttp's: B's plan
    again = [(_a(0, 2, b"ok"), False)]
    assert _fed_both(a_runs + b_runs + again + a_runs) == 3  # (A's third; the last two A's)
    parsed = Parsed(response=True)
    for data, _ in a_runs + b_runs:
        parsed.feed(data)
    parsed.events.clear()
    parsed.feed(again[0][0])
    assert [kind for kind, _ in parsed.events] == [HEAD, DATA, END]
    assert parsed.events[0][1].status == 200  # type: ignore[union-attr]


# -- the exchange --------------------------------------------------------------------------------
class _New(Exchange):
    pass


def _state(ex: Exchange) -> tuple[object, ...]:
    up = ex._up
    waiting = 0
    if up is not None:
        unfold = _old_unfolded if type(up) is OldParsed else unfolded
        waiting = sum(len(unfold(v)) if k == ANSWER else 1 for k, v in up.events)
    return (
        ex.phase,
        ex.body_done,
        ex.started,
        ex._client_keep,
        ex._up_keep,
        ex._body_out,
        ex._until_close,
        ex._reused,
        ex._info,
        None if up is None else (up.bodiless, waiting, up.in_head, up.in_body),
    )


def _driven(ex: Exchange, conversation: list[tuple[bytes, bytes, bool]], seed: int) -> list[object]:
    log = drive(ex, conversation, seed)
    return [*log, _state(ex)]


@settings(max_examples=examples(1200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(NEAR * 4 + ODD), min_size=1, max_size=18),
    st.sampled_from([4096, 4096, 90, 128]),
    st.integers(0, 2**32),
)
def test_review36s_conversations_as_cdb10ca(
    conversation: list[tuple[bytes, bytes, bool]], max_head: int, seed: int
) -> None:
    new = _driven(_New(via=VIA, max_head=max_head), conversation, seed)
    old = _driven(OldExchange(via=VIA, max_head=max_head), conversation, seed)
    assert new == old


_GET = b"GET /m HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"
_TEN = b"GET /m HTTP/1.0\r\nHost: edge-1:9100\r\n\r\n"
_TEN_KEPT = b"GET /m HTTP/1.0\r\nHost: edge-1:9100\r\nConnection: keep-alive\r\n\r\n"
_HEAD = b"HEAD /m HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"
_POST = b"POST /m HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 4\r\n\r\n"


@settings(max_examples=examples(1200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from([_GET] * 12 + [_TEN, _TEN_KEPT, _HEAD, _POST]),
            _answer(),
            st.integers(0, 20),
        ),
        min_size=1,
        max_size=16,
    ),
    st.sampled_from([4096, 4096, 90]),
    st.integers(0, 2**32),
)
def test_runs_of_three_layouts_through_the_exchange_as_cdb10ca(
    drawn: list[tuple[bytes, bytes, int]], max_head: int, seed: int
) -> None:
    """Requests of every framing answered by answers of the three layouts (a stray one now and
    then, the target's close after one now and then): the same actions and state."""
    conversation = []
    for request, answer, n in drawn:
        if request == _HEAD:
            answer = answer[: answer.index(b"\r\n\r\n") + 4]
        extra = answer if n == 0 else b""  # a stray answer behind it
        conversation.append((request, answer + extra, n == 1))
    new = _driven(_New(via=VIA, max_head=max_head), conversation, seed)
    old = _driven(OldExchange(via=VIA, max_head=max_head), conversation, seed)
    assert new == old


def test_an_unfolded_answer_goes_on_with_its_own_head() -> None:
    """An HTTP/1.0 client's answer of the layout (not sent on as its bytes): its own head
    framed, after a run of the layout's (an ANSWER whose layout head has other values)."""
    conversation = [(_GET, _a(0, d % 3, b"ok"), False) for d in range(5)]
    conversation.append((_TEN, _a(0, 2, b"abc"), False))
    for seed in range(20):
        new = _driven(_New(via=VIA, max_head=4096), conversation, seed)
        assert new == _driven(OldExchange(via=VIA, max_head=4096), conversation, seed)
    got: list[bytes] = []
    drive(_New(via=VIA, max_head=4096), conversation, None, got)
    assert got[-1].startswith(b"HTTP/1.1 200 OK\r\nDate: " + _DATES[2]) and got[-1].endswith(b"abc")
    assert b"Content-Length: 3\r\n" in got[-1]
