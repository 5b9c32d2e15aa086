"""review38: answerpath's head-less near answers (an ``ANSWER`` event is ``(layout head, bytes,
cut)``; its own head made only when unfolded; ``Parsed._recent`` keeps the last near answer's
head bytes, cut and body length under the plan that read it), tried over conversations of this
file's own making: a layout and answers whose own head differs from it in a field the exchange
reads or should read (status, reason, version, a name's case, ``Connection: close`` or
``keep-alive`` in a field as long, a second Content-Length, another digit count, ``00``, a
leading zero, ``+1`` (``int``'s number, not llhttp's), obs-text, a control), 1xx,
204 and 304 heads, chunked answers, strays, a HEAD's answer, a 101 and ``switch()``, closes and
reopened target connections.

Three references: the parser fed the answers one after another, its events unfolded, against a
fresh parser fed each answer alone (llhttp's, every field of every head); the exchange against
a fresh exchange per request (the client's bytes, whether the client connection is kept, the
statuses counted); and the exchange against cdb10ca's (``OldExchange``, kept verbatim in
test_answerpath_lazy), action by action and state by state, reads cut anywhere."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import Action, WriteClient
from ravenproxy.server.http_events import ANSWER, DATA, ERROR
from ravenproxy.server.http_messages import Parsed
from ravenproxy.server.near_answers import answer_head, unfolded
from tests.helpers import examples

from .test_answerpath_lazy import OldExchange, _state
from .test_exchange import VIA
from .test_heads_parse import _view
from .test_review36_answer_event import ROUTE, drive

_HEAD = (
    b"HTTP/1.1 200 OK\r\nDate: Sun, 06 Dec 2026 12:0%d:1%d GMT\r\nContent-Type: text/plain\r\n"
    b"X-Trace-Number: n%04d\r\nContent-Length: %b\r\n\r\n"
)
_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npong\r\n0\r\n\r\n"
_SWITCHED = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n"

# An answer's variant: the layout's bytes, changed (``None``: the layout itself).
_VARIANTS: list[tuple[bytes, bytes] | None] = [
    None,
    (b"200 OK", b"203 OK"),
    (b"200 OK", b"200 Ok"),
    (b"HTTP/1.1 200", b"HTTP/1.0 200"),
    (b"Content-Length", b"content-length"),
    (b"Content-Type: text/plain", b"Connection: close, x-abc"),
    (b"Content-Type: text/plain", b"Connection: keep-alive,x"),
    (b"Content-Type: text/plain", b"Transfer-Encoding: x-abc"),
    (b"X-Trace-Number: n", b"Content-Length: 0"),  # a second one (the same value or not)
    (b"n00", b"n\xe9\xff"),  # obs-text
    (b"n00", b"n\x01\x02"),  # controls (llhttp refuses)
    (b"200 OK", b"204 OK"),
    (b"200 OK", b"304 OK"),
]


def _answer(variant: int, date: int, trace: int, length: bytes) -> bytes:
    """An answer of the layout (a value from small sets: heads repeat) or of a variant; its
    body as long as its Content-Length says (none for 204 and 304)."""
    head = _HEAD % (date, date, trace, length)
    change = _VARIANTS[variant]
    if change is not None:
        head = head.replace(*change, 1)
    if b" 204 " in head[:13] or b" 304 " in head[:13]:
        return head
    return head + b"b" * int(length)


_answers = st.builds(
    _answer,
    st.sampled_from([0] * 10 + list(range(1, len(_VARIANTS)))),
    st.integers(0, 2),
    st.sampled_from([1, 2, 3, 3, 3]),
    st.sampled_from([b"10"] * 6 + [b"12", b"99", b"09", b"00", b"7", b"100", b"+1"]),
)
_any = st.one_of(
    _answers,
    _answers,
    _answers,
    _answers,
    st.sampled_from([_CHUNKED, b"HTTP/1.1 100 Continue\r\n\r\n"]),
)


@st.composite
def _run(draw: Any) -> list[bytes]:
    """A run of 2-5 answers of one layout (ours, or one as long with another status, reason or
    name case; values from small sets: heads repeat, the last near one's and the plan's)."""
    variant = draw(st.sampled_from([0, 0, 1, 2, 4]))
    length = draw(st.sampled_from([b"10", b"12"]))
    return [
        _answer(
            variant,
            draw(st.integers(0, 1)),
            draw(st.integers(1, 2)),
            draw(st.sampled_from([length, length, b"10", b"12"])),
        )
        for _ in range(draw(st.integers(2, 5)))
    ]


_mixed = st.lists(st.one_of(_run(), _run(), st.lists(_any, min_size=1, max_size=2)), max_size=6)


def _flat(parsed: Parsed) -> list[object]:
    """The queued events, each ``ANSWER`` unfolded, heads read whole, DATA joined; cleared."""
    flat: list[object] = []
    for kind, value in parsed.events:
        for event in unfolded(value) if kind == ANSWER else [(kind, value)]:
            if event[0] == DATA and flat and flat[-1][0] == DATA:  # type: ignore[index]
                flat[-1] = (DATA, flat[-1][1] + event[1])  # type: ignore[index,operator]
            else:
                flat.append(_view(event))  # type: ignore[arg-type]
    parsed.events.clear()
    return flat


def _alone(answer: bytes) -> list[object]:
    parsed = Parsed(response=True)
    parsed.feed(answer)
    return _flat(parsed)


@settings(max_examples=examples(2000), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mixed, st.lists(st.integers(1, 3), min_size=30, max_size=30))
def test_answers_one_after_another_parse_as_each_alone(
    runs: list[list[bytes]], batches: list[int]
) -> None:
    """Answers fed to one parser (each a read, or two or three in one): the events of each, its
    head unfolded with every field, are a fresh parser's for it alone; an ANSWER's layout head
    reads as the answer's own for status, size, plainness and version."""
    parsed = Parsed(response=True)
    at = 0
    answers = [a for run in runs for a in run]
    for i, answer in enumerate(answers):  # (no answer after a connection's last, or one whose
        # body ends with the connection: a Transfer-Encoding other than chunked)
        if answer.startswith(b"HTTP/1.0") or b"Connection: close" in answer or b"x-abc" in answer:
            del answers[i + 1 :]
            break
    while at < len(answers):
        n = batches[at % 30]
        batch = answers[at : at + n]
        at += n
        assert parsed.feed(b"".join(batch)) is None
        want = [e for a in batch for e in _alone(a)]
        if any(e[0] == ERROR for e in want):  # type: ignore[index]
            # (llhttp takes nothing more: what follows is not compared)
            del want[[e[0] for e in want].index(ERROR) + 1 :]  # type: ignore[index]
            assert _flat(parsed) == want
            return
        for kind, value in parsed.events:
            if kind == ANSWER:
                layout, own = value[0], answer_head(value)  # type: ignore[index,arg-type]
                assert (layout.status, layout.size, layout.plain, layout.version) == (
                    own.status,
                    own.size,
                    own.plain,
                    own.version,
                )
                assert own.wire == value[1][: own.size]  # type: ignore[index]
        assert _flat(parsed) == want


def _recent_cases() -> list[list[bytes]]:
    a = [_answer(0, d, t, b"10") for d in range(3) for t in (1, 2)]
    longer = _answer(0, 1, 1, b"100")
    return [
        [*a[:3], longer, longer, *a[:4]],  # the plan changed (another length) and back
        [*a[:3], _answer(0, 2, 3, b"100"), *a[:4]],  # another length between
        [*a[:3], _CHUNKED, *a[2:5]],  # llhttp's answer between two near ones
        [*a[:3], _answer(11, 0, 1, b"10"), _answer(12, 0, 1, b"10"), *a[2:5]],  # 204, 304
        [*a[:4], b"HTTP/1.1 100 Continue\r\n\r\n" + a[3], *a[3:5]],
        [*a[:4], a[0], a[0], a[3]],  # the plan head's bytes again, the recent one's
        [*a[:4], _answer(9, 0, 1, b"10"), a[1]],  # obs-text in a value: taken
        [*a[:4], _answer(10, 0, 1, b"10")],  # controls in a value: llhttp's (refused)
        # int's number, not llhttp's (refused; more in the read than the layout's least body)
        [*a[:4], _answer(0, 1, 2, b"+1") + a[0]],
    ]


def test_the_recent_head_after_the_plan_changed_is_each_answers_own() -> None:
    """Written out: runs of the layout with a plan change, llhttp's answer, 204/304 or a 1xx
    between: each answer's events (heads whole) as alone."""
    for case in _recent_cases():
        parsed = Parsed(response=True)
        near = 0
        for at, answer in enumerate(case):
            parsed.feed(answer)
            near += sum(kind == ANSWER for kind, _ in parsed.events)
            assert _flat(parsed) == _alone(answer), (at, answer)
        assert near >= 2, case  # (the path taken: after the change too)


# -- the exchange ----------------------------------------------------------------------------
def _req(method: bytes, version: bytes, extra: bytes = b"") -> bytes:
    return b"%b /r38 HTTP/%b\r\nHost: edge-1:9100\r\n%b\r\n" % (method, version, extra)


_GET = _req(b"GET", b"1.1")
_REQUESTS = [
    _GET,
    _GET,
    _GET,
    _GET,
    _req(b"GET", b"1.0"),
    _req(b"GET", b"1.0", b"Connection: keep-alive\r\n"),
    _req(b"GET", b"1.1", b"Connection: close\r\n"),
    _req(b"HEAD", b"1.1"),
    _req(b"POST", b"1.1", b"Content-Length: 3\r\n") + b"abc",
]
_UPGRADE = _req(b"GET", b"1.1", b"Connection: Upgrade\r\nUpgrade: x\r\n")


@st.composite
def _conversation(draw: Any) -> list[tuple[bytes, bytes, bool]]:
    out = []
    for _ in range(draw(st.integers(1, 6))):
        for answer in draw(_run()):  # a run of a layout (the path's from its third)
            out.append((_GET, answer, False))
        request, answer = draw(st.sampled_from(_REQUESTS)), draw(_any)
        if request.startswith(b"HEAD"):
            answer = answer[: answer.index(b"\r\n\r\n") + 4]
        how = draw(st.integers(0, 15))
        if how == 0:
            answer += draw(_answers)  # a stray answer behind it
        out.append((request, answer, how == 1))  # the target closes after it
    if draw(st.booleans()):
        out.append((_UPGRADE, _SWITCHED + b"raw", False))
    return out


class _Counted(Exchange):
    """Today's exchange, keeping each status its WriteClient actions count."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.counted: list[int] = []

    def receive_upstream(self, data: bytes) -> list[Action]:
        actions = super().receive_upstream(data)
        self.counted += [a.status for a in actions if isinstance(a, WriteClient) and a.status]
        return actions


def _one(request: bytes, answer: bytes, closes: bool) -> tuple[bytes, str, list[int]]:
    ex = _Counted(via=VIA, max_head=4096)
    got: list[bytes] = []
    drive(ex, [(request, answer, closes)], None, got)
    return got[0], ex.phase, ex.counted


@settings(max_examples=examples(1600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conversation())
def test_each_request_gets_what_a_fresh_exchange_gets(
    conversation: list[tuple[bytes, bytes, bool]],
) -> None:
    """The client's bytes for each request routed, and whether the client connection goes on
    after it, are a fresh exchange's fed that request and answer alone; the statuses counted
    are the fresh ones' (each final status once an answer)."""
    ex = _Counted(via=VIA, max_head=4096)
    got: list[bytes] = []
    drive(ex, conversation, None, got)
    counted: list[int] = []
    for i, data in enumerate(got):
        alone = _one(*conversation[i])
        assert data == alone[0], (i, conversation[i])
        if i + 1 < len(got):
            assert alone[1] == "head", (i, conversation[i])
        elif i + 1 == len(conversation) and b"Upgrade" not in conversation[i][0]:
            # (A refused answer on a kept connection: the GET goes again on a new one, which
            # this driver does not answer.)
            retried = ex.phase == "forwarding" and alone[1] == "closed" and not alone[0]
            assert ex.phase == alone[1] or retried
        counted += alone[2]
    assert ex.counted == counted


@settings(max_examples=examples(1600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_conversation(), st.sampled_from([4096, 4096, 150]), st.integers(0, 2**32))
def test_the_exchange_acts_as_cdb10cas_over_these_conversations(
    conversation: list[tuple[bytes, bytes, bool]], max_head: int, seed: int
) -> None:
    """Reads cut anywhere, requests pipelined: the same actions (``switch()``'s result too)
    and states as cdb10ca's exchange."""
    ex = Exchange(via=VIA, max_head=max_head)
    old_ex = OldExchange(via=VIA, max_head=max_head)
    new = [*drive(ex, conversation, seed), _state(ex)]
    old = [*drive(old_ex, conversation, seed), _state(old_ex)]
    assert new == old


def test_an_http10_clients_answers_after_a_run_are_framed_each_by_its_own_head() -> None:
    """Written out: HTTP/1.0 clients (kept alive and not) after a run of the layout, and the
    run's heads again: each answer framed from its own values (the memo of a head's framing
    never another answer's), as alone."""
    run = [(_GET, _answer(0, d, t, b"10"), False) for d in range(3) for t in (1, 2, 3)]
    for request in _REQUESTS[4:6]:
        for answer in [run[0][1], run[4][1], run[8][1], _answer(0, 2, 3, b"12")]:
            other = run[1][1] if answer != run[1][1] else run[2][1]
            answers = [answer, answer, other, answer]  # (kept alive: each its own head)
            conversation = [*run, *((request, a, False) for a in answers)]
            got: list[bytes] = []
            drive(Exchange(via=VIA, max_head=4096), conversation, None, got)
            alone = _one(request, answer, False)[0]
            assert got[len(run)] == alone
            if b"keep-alive" in request:
                assert got[len(run) :] == [_one(request, a, False)[0] for a in answers]
            assert alone.endswith(answer[answer.index(b"\r\n\r\n") + 4 :])
            assert answer[answer.index(b"\r\n") + 2 : answer.index(b"Content-Length")] in alone


def test_the_last_near_answer_of_a_layout_again_under_another_plan_is_counted_as_its_own() -> None:
    """Written out: a run of the layout (its last near answer kept), a run of a layout as long
    with another status (203: another plan), then the first run's last answer again: its own
    status is counted (200), its bytes go on as they came, as alone."""
    ours = [_answer(0, d % 2, d % 2 + 1, b"12") for d in range(4)]
    other = [_answer(1, d % 2, 2 - d % 2, b"10") for d in range(4)]
    conversation = [(_GET, a, False) for a in [*ours, *other, ours[-1], ours[-2], other[-1]]]
    ex = _Counted(via=VIA, max_head=4096)
    got: list[bytes] = []
    drive(ex, conversation, None, got)
    assert got == [_one(*c)[0] for c in conversation]
    assert ex.counted == [200] * 4 + [203] * 4 + [200, 200, 203]


def _post_answered_early(run: list[bytes], answer: bytes) -> list[str]:
    """After ``run`` (GETs answered, one connection), a POST whose head comes, then ``answer``
    from the target, then the body: the actions after the head (the upstream opened when
    ``run`` is empty), by their reprs."""
    ex = Exchange(via=VIA, max_head=4096)
    drive(ex, [(_GET, a, False) for a in run], None)
    post = _REQUESTS[-1]
    head = post[: post.index(b"\r\n\r\n") + 4]
    actions = ex.receive_client(head)
    assert [type(a).__name__ for a in actions] == ["RouteRequest"]
    actions = ex.routed(ROUTE)
    if not run:
        actions = ex.upstream_opened()
    log = [repr(a) for a in ex.receive_upstream(answer)]
    log += [repr(a) for a in ex.receive_client(post[len(head) :])]
    return [*log, ex.phase]


def test_an_answer_before_the_request_body_ended_is_unfolded_as_alone() -> None:
    """Written out: after a run of the layout (the answer an ANSWER), a POST answered before
    its body came: the client gets the answer with its own head, then the connection closes
    (the rest of the body would be read as a request), as on a fresh connection."""
    run = [_answer(0, d % 2, d % 3 + 1, b"10") for d in range(5)]
    for answer in [run[-1], run[-2], _answer(0, 1, 3, b"10")]:
        alone = _post_answered_early([], answer)
        assert _post_answered_early(run, answer) == alone
        assert alone[-1] == "closed" and repr(answer[: answer.index(b"\r\n") + 2])[2:-1] in alone[0]
