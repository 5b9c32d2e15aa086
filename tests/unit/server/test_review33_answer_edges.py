"""review33: answeragain's answers queued without llhttp (:meth:`Parsed._answered`) tried at
the edges its own test (test_again_answers) does not generate — against 1bb5933's parse, kept
VERBATIM in :mod:`.again_old_parse`. A response parser that frames an answer otherwise than
llhttp did is a response desync, so every read is compared: what feed returns, every event
(heads read whole), which heads are one object, the parser's state and llhttp's own.

The edges: a run of one answer with interim (1xx) answers before each final one (an
``Expect: 100-continue`` upload's), a run ended by ``Connection: close`` / ``Proxy-Connection``
/ ``Keep-Alive`` / HTTP/1.0 / chunked, llhttp's lenient Content-Length forms (``00``, ``05``,
trailing whitespace, a tab before it, the largest llhttp takes), reasons and values with ``%``,
``\\xff``, tabs, empty values, an obs-fold, statuses 205/206/299/999, a HEAD answered between
GETs (``bodiless`` set for one read and cleared again, or from a read on), stray answers and
garbage after a run, reads given as bytearray or memoryview, cut anywhere."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import DATA, HEAD
from tests.helpers import examples

from . import again_old_parse as old_parse
from .flat_events import FlatParsed
from .test_again_answers import _llhttp
from .test_heads_parse import _view

_FINALS = [
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH: %d\r\nX-A: \r\nX-B:\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0%d\r\n\r\n",  # llhttp's leading zero
    b"HTTP/1.1 200 OK\r\nContent-Length: 00%d \t\r\n\r\n",  # and trailing whitespace
    b"HTTP/1.1 200 OK\r\nContent-Length:\t%d\r\n\r\n",
    b"HTTP/1.1 205 Reset Content\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 206 Partial\r\nContent-Range: bytes 0-1/9\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 299 \xff\t%%s 100%%\r\nX-%%: %%d\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 999 Odd\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 304 Not Modified\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\nX-V: a\r\n b\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nProxy-Connection: close\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nProxy-Connection: keep-alive\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n",
    b"HTTP/1.1 200\r\nContent-Length: %d\r\n\r\n",  # no reason, no space: not its wire
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n",
]
"""Final answers' heads (``%d`` the Content-Length): plain ones whose wire is or is not their
bytes, and ones llhttp frames otherwise or after which it keeps nothing alive."""
_INTERIMS = [
    b"",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\nContent-Length: 3\r\n\r\n",
]
"""What comes before a final answer: nothing, or interim answers."""
_STRAYS = [
    b"xyz\r\n\r\n",
    b"\r\n",
    b"\r\n\r\n",
    b"HTTP/1.1 ",
    b"\x00",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
]
"""What a target sends that nobody asked for, or that no answer is."""


@st.composite
def _runs(draw: st.DrawFn) -> tuple[list[bytes], list[bool]]:
    """Runs of one final answer (interim answers before each, or not), bodies of the announced
    length mostly (their bytes differing), a stray answer or garbage now and then; cut anywhere;
    and per read whether the parser answers a HEAD."""
    pieces: list[bytes] = []  # each answer (its interim answers before it), each stray
    for _ in range(draw(st.integers(1, 4))):
        length = draw(st.sampled_from([0, 1, 3, 40]))
        template = draw(st.sampled_from(_FINALS))
        count = template.replace(b"%%", b"").count(b"%d")
        head = template.replace(b"%%", b"%") if count == 0 else template % ((length,) * count)
        interims = draw(st.integers(0, 3)) == 0  # each answer after one, or some, or none
        interim = draw(st.sampled_from(_INTERIMS)) if interims else b""
        for _ in range(draw(st.sampled_from([3, 4, 5, 6, 8, 1, 2]))):
            if draw(st.integers(0, 7)) == 0:
                interim = draw(st.sampled_from(_INTERIMS))
            body = bytes(
                draw(st.lists(st.sampled_from(b"ab\r\nH"), min_size=length, max_size=length))
            )
            if draw(st.integers(0, 14)) == 0:
                body = body[:-1] if draw(st.booleans()) else body + b"!"
            if b"chunked" in head:
                body = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
            pieces.append(interim + head + body)
        if draw(st.integers(0, 4)) == 0:
            pieces.append(draw(st.sampled_from(_STRAYS)))
    if draw(st.integers(0, 3)):  # whole answers in a read (one or more), as a target writes them
        ends = [end for end in range(1, len(pieces)) if draw(st.integers(0, 3))]
        reads = [
            b"".join(pieces[a:b]) for a, b in zip([0, *ends], [*ends, len(pieces)], strict=True)
        ]
    else:  # cut anywhere
        whole = b"".join(pieces)
        cuts = sorted(draw(st.lists(st.integers(0, len(whole)), min_size=2, max_size=8)))
        reads = [whole[a:b] for a, b in zip([0, *cuts], [*cuts, len(whole)], strict=True)]
    reads = [read for read in reads if read]
    way = draw(st.integers(0, 5))
    at = draw(st.integers(0, len(reads)))
    # Mostly GETs; a HEAD for one read (a GET after it), or from a read on.
    flags = [(way == 0 and i == at) or (way == 1 and i >= at) for i in range(len(reads))]
    return reads, flags


def _compared(reads: list[bytes], flags: list[bool], kinds: list[int] | None = None) -> None:
    """``reads`` fed to both parsers (as bytes, a bytearray or a memoryview by ``kinds``), each
    answering a HEAD when its flag says so; everything compared after each read."""
    new = FlatParsed(response=True, max_tail=64)
    old = old_parse.Parsed(response=True, max_tail=64)
    new_heads: list[Head] = []
    old_heads: list[Head] = []
    seen: list[object] = []  # each new head's view as it was queued
    for n, (data, flag) in enumerate(zip(reads, flags, strict=True)):
        kind = kinds[n] if kinds else 0
        made = [data, bytearray(data), memoryview(data)][kind]
        again = [data, bytearray(data), memoryview(data)][kind]
        new.bodiless = old.bodiless = flag
        got, want = new.feed(made), old.feed(again)
        assert (None if got is None else bytes(got)) == (None if want is None else bytes(want))
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events], n
        # (A DATA's bytes are bytes, as llhttp's: not a view of, or a slice of, the read.)
        assert all(type(e[1]) is bytes for e in new.events if e[0] == DATA), n
        for heads, events in ((new_heads, new.events), (old_heads, old.events)):
            heads.extend(head for k, head in events if k == HEAD)  # type: ignore[misc]
        seen.extend(_view(e) for e in new.events if e[0] == HEAD)
        state = (new.in_head, new.in_body, new.midway, new.fed, new.tail, _llhttp(new))
        assert state == (old.in_head, old.in_body, old.midway, old.fed, old.tail, _llhttp(old))
        new.events.clear()
        old.events.clear()
    # No head changed once queued (the whole-head reuse's objects, shared): each as it was.
    # (Which heads are one object is no longer 1bb5933's: answerpath makes a near answer's head
    # only when its event is unfolded, and llhttp's next head may reuse the last one it made.)
    assert [_view((HEAD, head)) for head in new_heads] == seen


@settings(max_examples=examples(2400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_runs(), st.data())
def test_runs_at_the_edges_are_parsed_as_1bb5933_did(
    run: tuple[list[bytes], list[bool]], data: st.DataObject
) -> None:
    reads, flags = run
    kinds = data.draw(
        st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=len(reads), max_size=len(reads))
    )
    _compared(reads, flags, kinds)


_A = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ZERO = b"HTTP/1.1 200 OK\r\nContent-Length: 00\r\n\r\n"
_CLOSE = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nclose"
_SEQUENCES: list[tuple[list[bytes], list[bool]]] = [
    # Uploads with Expect: 100-continue: the interim answer, then the final one, again and again.
    ([_CONTINUE, _A + b"one..", _CONTINUE, _A + b"two..", _CONTINUE + _A + b"three"], [False] * 3),
    (
        [_A + b"1....", _A + b"2....", _CONTINUE + _A + b"3....", _A + b"4....", _A + b"5...."],
        [False] * 5,
    ),
    # A HEAD between GETs (its answer's head alone), then GETs again on what llhttp left.
    (
        [_A + b"1....", _A + b"2....", _A, _A + b"4....", _A + b"5...."],
        [False, False, True, False, False],
    ),
    (
        [_A + b"1....", _A + b"2....", _A + b"3....", _A, _A + b"5...."],
        [False, False, False, True, False],
    ),
    # A HEAD first, then GETs (the first answer's body would be taken as the next head).
    ([_A, _A + b"2....", _A + b"3....", _A + b"4...."], [True, False, False, False]),
    # Two answers for one request: the stray one in the same read, or in the next.
    ([_A + b"1....", _A + b"2....", _A + b"3...." + _A + b"stray", _A + b"4...."], [False] * 4),
    ([_A + b"1....", _A + b"2....", _A + b"3....", _A + b"stray" + _A + b"4...."], [False] * 4),
    # Connection: close after a run: llhttp keeps nothing alive, what follows is an error.
    ([_A + b"1....", _A + b"2....", _A + b"3....", _CLOSE, _A + b"5...."], [False] * 5),
    ([_A + b"1....", _A + b"2....", _A + b"3...." + _CLOSE + _A + b"5...."], [False] * 3),
    # Content-Length 00 (llhttp's leniency) again and again, a stray byte after.
    ([_ZERO, _ZERO, _ZERO * 3, _ZERO + b"x", _ZERO], [False] * 5),
    # The largest Content-Length llhttp takes, after a run of a small one.
    (
        [_A + b"1....", _A + b"2....", _A.replace(b"5", b"18446744073709551615") + b"big"],
        [False] * 3,
    ),
    # Another answer after those taken in a read: its version is llhttp's (HTTP/1.0 here).
    ([_A + b"1....", _A + b"2....", _A + b"3...." + _A.replace(b"1.1", b"1.0") + b"4...."], []),
    ([_A + b"1....", _A + b"2....", _A + b"3...." + b"\r\n" + _A + b"4....", _A + b"5...."], []),
    # Garbage after a run, then the same answer (llhttp's error is final both ways).
    ([_A + b"1....", _A + b"2....", _A + b"3....xyz\r\n\r\n", _A + b"4...."], [False] * 4),
]


def test_fixed_sequences_are_parsed_as_1bb5933_did() -> None:
    for reads, flags in _SEQUENCES:
        flags = flags + [False] * (len(reads) - len(flags))  # (GETs after those given)
        for kind in (0, 1, 2):
            _compared(reads, flags, [kind] * len(reads))


def test_every_cut_of_a_run_with_interim_answers_is_parsed_as_1bb5933_did() -> None:
    whole = (_A + b"1....") * 2 + _CONTINUE + _A + b"3...." + _A + b"4...." + _A + b"5...."
    for a in range(1, len(whole), 2):
        _compared([whole[:a], whole[a:]], [False, False])
        for b in range(a + 1, len(whole), 23):
            _compared([whole[:a], whole[a:b], whole[b:]], [False] * 3)
