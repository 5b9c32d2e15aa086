"""review36: answerside's one-event answer (``(ANSWER, (head, bytes))``, sent on as its bytes to
a kept client, else unfolded into HEAD, DATA, END at the queue's front) tried against bd24f07's
``receive_upstream`` (test_answerside_answers' ``FlatOld``, kept verbatim there) over
conversations that helper's driver did not make: the client's and the target's bytes as two
streams cut anywhere, so requests come pipelined two and three a read (the next request's
events wait in the client parser: ``poll``) and a target's read holds several answers (the
second one stray), an answer and the next one's partial head, a 100 before the answer, a 101
after it, an upgrade's 101 after a run of the layout (``switch()`` and the bytes past the 101),
an upgrade request answered by an answer of the layout, 204/304 of the layout's shape, a HEAD's
answer, a request whose body is still coming, HTTP/1.0 clients (chunked and close-framed answers
to them too), the target closing at once. The same actions (each field: bytes at the client,
statuses counted), exchange state, ``_up_rest`` and ``switch()`` after each step.

And an answer that exceeds ``max_head`` only on its second appearance: impossible — a near
answer's head is as long as the layout's head llhttp took on the same connection (its size is
its wire's, as llhttp's heads' are), and ``max_head`` is one per server (``--max-header-size``);
shown below.
"""

from __future__ import annotations

import random
from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    OpenUpstream,
    Refuse,
    RouteRequest,
    SwitchProtocols,
    Tunnel,
    WriteClient,
)
from ravenproxy.server.http_events import ANSWER, HEAD
from ravenproxy.server.http_messages import Parsed
from tests.helpers import examples

from .test_answerside_answers import FlatOld, _near
from .test_answerside_answers import _state as _answer_state
from .test_exchange import VIA, route
from .test_exchange_answers import get

ROUTE = route("edge-1")
HOST = "Host: edge-1:9100\r\n"


def _shaped(status: int, reason: bytes, i: int, body: bool = True) -> bytes:
    """An answer of ``_near``'s shape (its names, lengths) with another status line; no body
    when ``body`` is false (204, 304, a HEAD's)."""
    answer = _near(i).replace(b"200 OK", b"%d %b" % (status, reason), 1)
    return answer if body else answer[: answer.index(b"\r\n\r\n") + 4]


UPGRADE = b"GET /ws HTTP/1.1\r\n" + HOST.encode() + b"Connection: Upgrade\r\nUpgrade: x\r\n\r\n"
SWITCHED = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\n"
HEAD_REQ = b"HEAD /ping HTTP/1.1\r\n" + HOST.encode() + b"\r\n"
TEN_GET = b"GET /ten HTTP/1.0\r\n" + HOST.encode() + b"\r\n"
TEN_KEEP = b"GET /ten HTTP/1.0\r\n" + HOST.encode() + b"Connection: keep-alive\r\n\r\n"
POST = b"POST /p HTTP/1.1\r\n" + HOST.encode() + b"Content-Length: 9\r\n\r\n123456789"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\npong\r\n0\r\n\r\n"
BY_CLOSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close"

# (request, the target's bytes for it, the target closes after them)
NEAR = [(get("/ping"), _near(i), False) for i in range(8)]
ODD: list[tuple[bytes, bytes, bool]] = [
    (get("/ping"), _near(30) + _near(31), False),  # a stray answer of the layout
    (get("/ping"), _near(32) + _near(33) + _near(34), False),  # two
    (get("/ping"), _near(35) + _near(36)[:40], False),  # the next one's partial head
    (get("/ping"), _near(37) + _near(38)[:-3], False),  # ... cut in its body
    (get("/ping"), b"HTTP/1.1 100 Continue\r\n\r\n" + _near(39), False),  # interim first
    (get("/ping"), _near(40) + SWITCHED, False),  # a 101 after it: stray
    (get("/ping"), _near(41) + b"garbage", False),  # bytes past its body
    (get("/ping"), _near(42) + b"\r\n", False),
    (get("/ping"), _near(43), True),  # the target closes right after
    (get("/ping"), _shaped(204, b"No Content", 44, body=False), False),
    (get("/ping"), _shaped(304, b"Not Modified", 45, body=False), False),
    (get("/ping"), _shaped(204, b"No Content", 46), False),  # a 204 "with" a body: stray
    (get("/ping"), _shaped(201, b"Created", 47), False),
    (get("/ping"), _near(48).replace(b"1.1", b"1.0", 1), False),
    (get("/ping"), _near(49).replace(b"text", b"te\x7ft", 1), False),  # llhttp refuses
    (HEAD_REQ, _near(50)[:-9], False),
    (HEAD_REQ, _near(51)[:-9] + _near(52), False),  # a HEAD's answer, then a stray one
    (TEN_GET, _near(53), False),
    (TEN_KEEP, _near(54), False),
    (TEN_KEEP, CHUNKED, False),  # chunked to an HTTP/1.0 client
    (TEN_GET, BY_CLOSE, True),
    (get("/ping"), BY_CLOSE, True),  # chunked to the client
    (get("/ping", "Connection: close\r\n"), _near(55), False),
    (POST, _near(56), False),  # answered while its body may still be coming
    (UPGRADE, _near(57), False),  # an upgrade answered by an answer of the layout
    (UPGRADE, SWITCHED + b"raw bytes", False),
    (UPGRADE, _near(58) + SWITCHED + b"raw", False),
    (UPGRADE, SWITCHED[:20], True),
    (get("/ping"), b"", True),  # the kept connection closed: the request goes again
    # unfolded with more behind it in the read (the unfold goes in front of them)
    (TEN_KEEP, _near(60) + _near(61), False),
    (TEN_GET, _near(62) + _near(63), False),
    (POST, _near(64) + _near(65), False),
    (get("/ping", "Connection: close\r\n"), _near(66) + _near(67), False),
    (UPGRADE, _near(68) + _near(69), False),
]


class Counted(Parsed):
    """Today's parser, counting the ANSWER events it queues (the path taken)."""

    __slots__ = ()
    answers = 0

    def feed(self, data: bytes) -> bytes | None:
        rest = super().feed(data)
        Counted.answers += sum(kind == ANSWER for kind, _ in self.events)
        return rest


class New(Exchange):
    def upstream_opened(self) -> list[Action]:
        actions = super().upstream_opened()
        if self._up is not None:
            self._up.__class__ = Counted
        return actions


def _cut(data: bytes, rng: random.Random | None, most: int = 3) -> list[bytes]:
    if rng is None or len(data) < 2 or rng.random() < 0.5:
        return [data] if data else []
    cuts = sorted(rng.sample(range(1, len(data)), min(rng.randint(1, most), len(data) - 1)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def _client_reads(requests: list[bytes], rng: random.Random | None) -> deque[bytes]:
    """The client's stream: runs of 1-3 requests a read (pipelined), some cut anywhere (each
    request a read without ``rng``)."""
    reads: deque[bytes] = deque()
    at = 0
    while at < len(requests):
        n = 1 if rng is None else rng.choice([1, 1, 1, 2, 3])
        reads.extend(_cut(b"".join(requests[at : at + n]), rng))
        at += n
    return reads


def _state(ex: Exchange) -> tuple[object, ...]:
    return (*_answer_state(ex), len(ex.client.events), ex.client_raw, ex._up_rest)


def drive(
    ex: Exchange,
    conversation: list[tuple[bytes, bytes, bool]],
    seed: int | None,
    got: list[bytes] | None = None,
) -> list[object]:
    """The client's requests as one stream and each request's target bytes as reads, fed as a
    server would: client bytes while the exchange waits for a head (or a body), buffered
    requests polled, the target's reads while forwarding (its close after them when it
    closes), bytes a kept target sent past its answer as ``upstream_ended(stray=True)``. The
    log: every action's repr, the state after each step, ``switch()``'s result; ``got``: the
    client's bytes for each request routed."""
    rng = None if seed is None else random.Random(seed)
    client = _client_reads([r for r, _, _ in conversation], rng)
    log: list[object] = []
    routed = -1
    target: deque[bytes] = deque()

    def act(actions: list[Action]) -> bool:
        nonlocal routed, target
        queue = deque(actions)
        while queue:
            action = queue.popleft()
            log.append((type(action).__name__, repr(action)))
            if isinstance(action, WriteClient) and got is not None:
                got[routed] += action.data
            elif isinstance(action, RouteRequest):
                routed += 1
                if got is not None:
                    got.append(b"")
                if routed < len(conversation):
                    _, answer, closes = conversation[routed]
                    target = deque(_cut(answer, rng, 4))
                    if closes:
                        target.append(b"")
                queue.extend(ex.routed(ROUTE))
            elif isinstance(action, OpenUpstream):
                queue.extend(ex.upstream_opened())
            elif isinstance(action, SwitchProtocols):
                log.append(("switch", ex.switch()))
                return False
            elif isinstance(action, Close | Refuse | Tunnel):
                return False
        log.append(_state(ex))
        return True

    for _ in range(400):
        if ex.phase == "head":
            if target and ex._up is not None:  # the kept target sent more than its answer
                log.append(("ended", repr(ex.upstream_ended(stray=bool(target[0])))))
            target.clear()
            if ex.client.events:  # a request read with the last one (pipelined)
                going = act(ex.poll())
            elif client:
                going = act(ex.receive_client(client.popleft()))
            else:
                break
        elif ex.phase == "forwarding":
            if client and not ex.body_done and (not target or rng is None or rng.random() < 0.5):
                going = act(ex.receive_client(client.popleft()))
            elif target:
                going = act(ex.receive_upstream(target.popleft()))
            else:
                break
        else:
            break
        if not going:
            break
    return log


@settings(max_examples=examples(1200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(st.sampled_from(NEAR * 4 + ODD), min_size=1, max_size=18),
    st.sampled_from([4096, 4096, 4096, 90, 128]),
    st.integers(0, 2**32),
)
def test_streams_cut_anywhere_the_same_as_bd24f07(
    conversation: list[tuple[bytes, bytes, bool]], max_head: int, seed: int
) -> None:
    new = drive(New(via=VIA, max_head=max_head), conversation, seed)
    old = drive(FlatOld(via=VIA, max_head=max_head), conversation, seed)
    assert new == old


# The cases the generated runs reach by chance, each written out: the path taken (an ANSWER
# queued) and bd24f07's result.
PRIMED = NEAR[:4]
CASES = {
    name: PRIMED + tail
    for name, tail in {
        "stray": [ODD[0], NEAR[5]],
        "two-stray": [ODD[1], NEAR[5]],
        "partial-next": [ODD[2], NEAR[5]],
        "101-after": [ODD[5], NEAR[5]],
        "garbage-after": [ODD[6], NEAR[5]],
        "closes-after": [ODD[8], NEAR[5]],
        "upgrade-near": [ODD[24], NEAR[5]],
        "upgrade-101": [ODD[25]],
        "upgrade-near-101": [ODD[26]],
        "post": [ODD[23], NEAR[5]],
        "ten": [ODD[17], NEAR[5]],
        "ten-keep": [ODD[18], NEAR[5]],
        "last": [ODD[22], NEAR[5]],
        "204-body": [ODD[11], NEAR[5]],
        "head-stray": [ODD[16], NEAR[5]],
        "ten-keep-stray": [ODD[29], NEAR[5]],
        "ten-stray": [ODD[30], NEAR[5]],
        "post-stray": [ODD[31], NEAR[5]],
        "last-stray": [ODD[32], NEAR[5]],
        "upgrade-stray": [ODD[33], NEAR[5]],
    }.items()
}


def test_each_case_takes_the_answer_event_and_agrees() -> None:
    most = {}
    for name, conversation in CASES.items():
        most[name] = 0
        for seed in range(40):
            Counted.answers = 0
            new = drive(New(via=VIA, max_head=4096), conversation, seed)
            most[name] = max(most[name], Counted.answers)
            old = drive(FlatOld(via=VIA, max_head=4096), conversation, seed)
            assert new == old, (name, seed)
    # The odd answer itself taken by the path (two primed ones before it), but where its status
    # line is not the layout's (a 204 of its names, a 101).
    assert {name for name, n in most.items() if n < 3} == {"204-body", "upgrade-101", "head-stray"}


def _alone(request: tuple[bytes, bytes, bool]) -> bytes:
    got: list[bytes] = []
    drive(Exchange(via=VIA, max_head=4096), [request], None, got)
    return got[0]


def test_each_request_gets_what_it_gets_alone() -> None:
    """Not against the oracle (which shares the parser, ``_finished`` and ``unfolded``): each
    request of a case, each read whole, gets the bytes it gets alone on a fresh exchange (a
    fresh target connection: llhttp's) — a stray answer goes to no one, a HEAD's answer has no
    body, an answer's bytes are its own."""
    for name, conversation in CASES.items():
        got: list[bytes] = []
        drive(New(via=VIA, max_head=4096), conversation, None, got)
        assert got == [_alone(request) for request in conversation[: len(got)]], name
        assert len(got) >= len(PRIMED) + 1, name  # (the odd request reached)


def _go(ex: Exchange, actions: list[Action], writes: list[tuple[bytes, int]]) -> None:
    queue = deque(actions)
    while queue:
        action = queue.popleft()
        if isinstance(action, RouteRequest):
            queue.extend(ex.routed(ROUTE))
        elif isinstance(action, OpenUpstream):
            queue.extend(ex.upstream_opened())
        elif isinstance(action, WriteClient):
            writes.append((action.data, action.status))


def test_pipelined_requests_answers_as_they_came() -> None:
    """Requests three a client read, each answer of the layout a read of its own: each goes on
    as the read itself (the path's), the next request polled after it, as bd24f07's."""
    answers = [_near(i) for i in range(10)]
    for ex in (New(via=VIA, max_head=4096), FlatOld(via=VIA, max_head=4096)):
        Counted.answers = 0
        writes: list[tuple[bytes, int]] = []
        for i, answer in enumerate(answers):
            if i % 3 == 0:
                _go(ex, ex.receive_client(get("/ping") * min(3, len(answers) - i)), writes)
            else:
                assert ex.phase == "head" and ex.head_begun
                _go(ex, ex.poll(), writes)
            assert ex.phase == "forwarding"
            _go(ex, ex.receive_upstream(answer), writes)
            assert ex.phase == "head" and ex._up is not None
        assert writes == [(a, 200) for a in answers]
        assert not ex.head_begun
        if type(ex) is New:
            assert Counted.answers == 8  # all but the first two


def test_switch_after_a_run_of_the_layout() -> None:
    """An upgrade after answers of the layout: the 101's head for the client and the bytes past
    it, in the read that ended a near answer's run, as bd24f07's."""
    results = []
    for ex in (New(via=VIA, max_head=4096), FlatOld(via=VIA, max_head=4096)):
        log = drive(ex, [*PRIMED, (UPGRADE, SWITCHED + b"\x81\x05hello", False)], None)
        results.append(log)
        switch = [entry for entry in log if entry[0] == "switch"]
        assert switch == [("switch", (SWITCHED, b"", b"\x81\x05hello"))]
    assert results[0] == results[1]


def test_a_near_head_is_as_long_as_the_head_llhttp_took() -> None:
    """The bound: an answer taken by the path has a head of its layout's length, which llhttp
    measured the same way (its wire's length) two answers before on the same connection, under
    the same ``max_head`` (one per server). So a bound the path's head exceeds refused the
    layout's first answer already: no plan, no ANSWER."""
    size = _near(0).index(b"\r\n\r\n") + 4
    for max_head, answered in ((size, 6), (size - 1, 0)):
        Counted.answers = 0
        ex = New(via=VIA, max_head=max_head)
        log = drive(ex, NEAR[:6], None)
        writes = [entry for entry in log if entry[0] == "WriteClient"]
        refused = [entry for entry in log if entry[0] == "Refuse"]
        assert len(writes) == answered and len(refused) == (answered == 0)
        assert Counted.answers == (4 if answered else 0)
    parsed = Parsed(response=True)
    for i in range(40):
        parsed.feed(_near(i, b"x" * (i % 5)))
    sizes = {value.size for kind, value in parsed.events if kind == HEAD}
    sizes |= {value[0].size for kind, value in parsed.events if kind == ANSWER}
    heads = {len(value[0].wire) for kind, value in parsed.events if kind == ANSWER}
    assert sizes == heads == {size}


ALONE = [case for case in ODD if case[1]]
"""The odd cases but the retry's (a kept connection that closes unanswered is tried again;
alone it is a new one: a 502)."""


@settings(max_examples=examples(1200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.sampled_from(NEAR * 4 + ALONE), min_size=1, max_size=18))
def test_each_request_of_a_run_gets_what_it_gets_alone(
    conversation: list[tuple[bytes, bytes, bool]],
) -> None:
    """test_each_request_gets_what_it_gets_alone over generated runs (each read whole)."""
    got: list[bytes] = []
    drive(New(via=VIA, max_head=4096), conversation, None, got)
    assert got == [_alone(request) for request in conversation[: len(got)]]
