"""answeragain (issue 15): an answer whose head is the last answer's byte for byte, framed by its
Content-Length alone, whole in a read that begins between messages, is queued without llhttp
(:meth:`Parsed._answered`) — against 1bb5933's parse, kept VERBATIM in :mod:`.again_old_parse`,
which feeds every answer to llhttp. Both are fed the same generated answer streams: runs of
identical answers (Content-Length 0 or not), answers differing from the last in one byte
anywhere in the head, 1xx / 204 / 304, ``Connection: close``, HTTP/1.0, chunked after a
Content-Length one, bodies longer or shorter than announced, chunk trailers over the max-tail
bound, a head's bytes that are not its canonical wire, answers to HEAD (bodiless), cut into
reads anywhere (part of a head, a head and part of a body, two answers, an answer and part of
the next). After every read: what feed returns, every event (heads read whole), which heads are
one object, the parser's state and llhttp's own (status, version, keep-alive)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import DATA, END, HEAD, Parsed
from tests.helpers import examples

from . import again_old_parse as old_parse
from .flat_events import FlatParsed
from .test_heads_parse import _conversation, _view

_BASES = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nDate: Sun, 06 Dec 2026 03:00:00 GMT\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 \r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 5%%\r\nX-%%d: %%b\r\nContent-Length: %d\r\n\r\n",
]
"""Heads framed by their Content-Length (``%d``), each its own canonical wire."""
_OTHERS = [
    b"HTTP/1.1 204 No Content\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length:%d\r\n\r\n",  # not its wire (no space)
    b"HTTP/1.1 200 OK\r\nContent-Length: %d  \r\n\r\n",
    b"HTTP/1.1 200  OK\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\nContent-Length: %d\n\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0%d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nUpgrade: x\r\nContent-Length: %d\r\n\r\n",
    b"\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n",  # CRLF before (llhttp skips it)
]
"""Heads llhttp frames otherwise, that end the connection, or that are not their wire."""
_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


_BYTES = [b"\r", b"\n", b" ", b":", b"0", b"1", b"A", b"a", b"%", b"\xff"]


@st.composite
def _answers(draw: st.DrawFn) -> list[bytes]:
    """Answers on one target connection: runs of the same head (most often), the last head
    with a byte changed, or another; a body of the announced length (other bytes, often the
    same) or one more or less, a chunked answer now and then."""
    answers: list[bytes] = []
    head: bytes | None = None
    length = draw(st.sampled_from([0, 0, 2, 5, 300]))
    for _ in range(draw(st.integers(1, 12))):
        way = draw(st.integers(0, 29))
        if way == 0:
            trailer = b"X-T: " + b"t" * draw(st.sampled_from([1, 100]))
            answers.append(_CHUNKED + b"3\r\nabc\r\n0\r\n" + trailer + b"\r\n\r\n")
            continue
        if head is not None and way < 20:
            pass  # the last head again
        elif head is not None and way < 24:
            at = draw(st.integers(0, len(head) - 1))
            head = head[:at] + draw(st.sampled_from(_BYTES)) + head[at + 1 :]
        else:
            if draw(st.integers(0, 3)) == 0:
                length = draw(st.sampled_from([0, 1, 2, 5, 300]))
            template = draw(st.sampled_from(_BASES if way < 27 else _OTHERS))
            head = template % ((length,) * template.replace(b"%%", b"").count(b"%d"))
        body = draw(st.sampled_from([b"x", b"y", b"\r\n"])) * length
        off = draw(st.integers(0, 19))
        if off == 0:
            body = body[:-1]
        elif off == 1:
            body += b"HTTP/1.1 "
        answers.append(head + body)
    whole = b"".join(answers)
    if draw(st.booleans()):
        return answers
    cuts = sorted(draw(st.lists(st.integers(0, len(whole)), max_size=6)))
    reads = zip([0, *cuts], [*cuts, len(whole)], strict=True)
    return [whole[a:b] for a, b in reads if whole[a:b]]


def _llhttp(parsed: Parsed | old_parse.Parsed) -> tuple[object, ...]:
    parser = parsed.parser
    return (parser.get_status_code(), parser.get_http_version(), parser.should_keep_alive())


def _both_fed(
    reads: list[bytes],
    *,
    bodiless: bool | list[bool],
    max_tail: int = 64,
    view: Callable[[tuple[int, object]], object] = _view,
) -> None:
    """``reads`` fed to both parsers, each answering a HEAD (``bodiless``: throughout, or per
    read: the exchange sets it per request on the target connection's parser), their events
    compared by ``view`` after each."""
    new = FlatParsed(response=True, max_tail=max_tail)
    old = old_parse.Parsed(response=True, max_tail=max_tail)
    new_heads: list[Head] = []
    old_heads: list[Head] = []
    seen: list[object] = []  # each new head's view as it was queued
    flags = bodiless if isinstance(bodiless, list) else [bodiless] * len(reads)
    for data, flag in zip(reads, flags, strict=True):
        new.bodiless = old.bodiless = flag
        assert new.feed(data) == old.feed(data)
        assert [view(e) for e in new.events] == [view(e) for e in old.events]
        for heads, events in ((new_heads, new.events), (old_heads, old.events)):
            heads.extend(head for kind, head in events if kind == HEAD)  # type: ignore[misc]
        seen.extend(view(e) for e in new.events if e[0] == HEAD)
        state = (new.in_head, new.in_body, new.midway, new.fed, new.tail, _llhttp(new))
        assert state == (old.in_head, old.in_body, old.midway, old.fed, old.tail, _llhttp(old))
        new.events.clear()
        old.events.clear()
    # No head changed once queued (the whole-head reuse's objects, shared): each as it was.
    # (Which heads are one object is no longer 1bb5933's: answerpath makes a near answer's head
    # only when its event is unfolded, and llhttp's next head may reuse the last one it made.)
    assert [view((HEAD, head)) for head in new_heads] == seen


_SETTINGS = settings(
    max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@_SETTINGS
@given(_answers(), st.data())
def test_answer_streams_are_parsed_as_1bb5933_did(reads: list[bytes], data: st.DataObject) -> None:
    # Now and then a HEAD answered: from the start, or from one read on (the same answer's
    # head then comes without its body).
    way = data.draw(st.integers(0, 9))
    at = data.draw(st.integers(0, len(reads))) if way == 0 else len(reads)
    _both_fed(reads, bodiless=[way == 1 or i >= at for i in range(len(reads))])


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conversation(response=True), st.booleans())
def test_heads_conversations_are_parsed_as_1bb5933_did(reads: list[bytes], bodiless: bool) -> None:
    _both_fed(reads, bodiless=bodiless, max_tail=256)


_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"


def _cuts() -> list[list[bytes]]:
    """The same answer three times, cut at every place once and twice (every third place)."""
    whole = _ANSWER * 3
    ways = [[whole[:a], whole[a:]] for a in range(1, len(whole))]
    ways += [
        [whole[:a], whole[a:b], whole[b:]] for a in range(1, 80, 3) for b in range(a + 1, 240, 7)
    ]
    return ways


def test_every_cut_of_a_run_of_one_answer_is_parsed_as_1bb5933_did() -> None:
    for reads in _cuts():
        _both_fed([_ANSWER, *reads], bodiless=False)
        _both_fed([_ANSWER, *reads], bodiless=True)


def _counted(parsed: Parsed) -> list[bytes]:
    """The reads ``parsed`` hands llhttp from now on (its parser wrapped)."""
    fed: list[bytes] = []
    real = parsed.parser

    class Counting:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def feed_data(self, data: bytes) -> None:
            fed.append(bytes(data))
            real.feed_data(data)

    parsed.parser = Counting()  # type: ignore[assignment]
    return fed


def test_the_same_answer_again_is_queued_without_llhttp() -> None:
    """The third and later answers with the first one's head (the second came again through
    llhttp), whole in a read, feed llhttp nothing: the same head object, the body as read, END;
    what follows another head is llhttp's, and so is an answer not whole in its read."""
    parsed = FlatParsed(response=True)
    fed = _counted(parsed)
    parsed.feed(_ANSWER)
    first = parsed.events[0][1]
    parsed.feed(_ANSWER)
    assert parsed.events[3] == (HEAD, first)
    parsed.events.clear()
    for data in (_ANSWER, _ANSWER * 2, _ANSWER.replace(b"hello", b"world")):
        parsed.feed(data)
        events = list(parsed.events)
        parsed.events.clear()
        assert events[0] == (HEAD, first) and events[2][0] == END and events[1][0] == DATA
        assert [e[1] for e in events if e[0] == DATA] == [data[-5:]] * (len(data) // len(_ANSWER))
    assert fed == [_ANSWER, _ANSWER]
    parsed.feed(_ANSWER + b"HTTP/1.1 404 No\r\nContent-Length: 0\r\n\r\n")
    assert fed[2:] == [b"HTTP/1.1 404 No\r\nContent-Length: 0\r\n\r\n"]
    parsed.feed(_ANSWER)  # after another head: llhttp's, twice
    parsed.feed(_ANSWER)
    parsed.feed(_ANSWER[:-1])  # not whole in the read: llhttp's
    assert fed[3:] == [_ANSWER, _ANSWER, _ANSWER[:-1]]


_CHUNKS = [_CHUNKED + b"3\r\nabc\r\n", b"0\r\nX-T: t", b"\r\n\r\n"]
_SEQUENCES: list[tuple[list[bytes], bool | list[bool]]] = [
    # (A head is asked whether it came whole again once llhttp has parsed it twice in a row.)
    ([_ANSWER] * 3, True),  # answering a HEAD
    ([_ANSWER] * 4 + [_ANSWER[:-5], _ANSWER], [False] * 4 + [True, False]),  # one HEAD's
    ([_ANSWER] * 3, [False, False, True]),
    (
        [_ANSWER[:-5].replace(b"200 OK", b"103 Hi")] * 2 + [_ANSWER.replace(b"200 OK", b"103 Hi")],
        False,
    ),
    (
        [_ANSWER[:-5].replace(b"200 OK", b"204 No")] * 2 + [_ANSWER.replace(b"200 OK", b"204 No")],
        False,
    ),
    (
        [_ANSWER[:-5].replace(b"200 OK", b"304 No")] * 2 + [_ANSWER.replace(b"200 OK", b"304 No")],
        False,
    ),
    ([_ANSWER.replace(b"1.1", b"1.0")] * 2 + [_ANSWER], False),  # the same fields, HTTP/1.1 now
    ([_ANSWER, _ANSWER, _ANSWER + _ANSWER[:20]], False),
    ([*_CHUNKS, _ANSWER, _ANSWER, _ANSWER], False),  # a chunked answer's tail, then the same
    ([_ANSWER, _ANSWER, _ANSWER[:-1] + b"HTTP/1.1 x\r\n\r\n", _ANSWER], False),  # an error
    ([_ANSWER.replace(b"5\r\n\r\nhello", b"0\r\n\r\n")] * 4, False),
    ([_ANSWER, _ANSWER, _ANSWER[:-1], b"o" + _ANSWER], False),
    ([_ANSWER, _ANSWER, _ANSWER * 2 + _ANSWER.replace(b"hello", b"HTTP/")], False),
    ([_ANSWER, _ANSWER, _ANSWER + _ANSWER.replace(b"200 OK", b"200 Ok")], False),
    ([_ANSWER, _ANSWER, _ANSWER[:-1] + b"!" + _ANSWER], False),
]


def test_answers_on_each_edge_are_parsed_as_1bb5933_did() -> None:
    for reads, bodiless in _SEQUENCES:
        _both_fed(reads, bodiless=bodiless)
