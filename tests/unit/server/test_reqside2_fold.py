"""Branch reqside (issue 15, 2026-12-06): a keep-alive request's side in fewer Python calls.

- ``Parsed.again`` and ``Parsed.near`` are one method: ``again`` returns the kept request's
  head when the same bytes came again, a head made without llhttp when they are the same but
  for an origin-form target (``near``'s), else None (the kept request dropped where ``near``
  dropped it).
- ``RequestHeads`` (the head for the target past its request line, kept while the fields,
  version, destination and route are the same) and ``Exchange._send`` are folded into
  ``Exchange.routed`` (``upstream_opened`` asks ``routed(None)``).
- ``podroutes.same_node`` reads the target's "/" by index and looks a pod path's head up only
  when the target's fifth character is one of theirs.

The oracle is bd24f07's code, verbatim in :mod:`.bd24_requests` (``Bd24Parsed``: ``again``,
``near``, ``feed``; ``Bd24Exchange``: ``receive_client``, ``routed``, ``upstream_opened``,
``_send`` over ``RequestHeads``; ``bd24_same_node``, which its ``receive_client`` asks).
Compared over generated inputs: the parse (returns, events with heads field by field, parser
state, the request kept, heads reused) offered the exchange's way or to ``feed`` alone; every
byte value at every place of a target; runs of near requests broken by other methods, fields,
lengths and shifted bytes; ``same_node`` over targets built of the pieces its rule reads and
every character at every place of short ones; whole exchanges (test_review26's driver, its
conversations: targets absolute-form, pod and node-name ones, Host and X-Tunnel-Proxy-Host,
bodies, upgrades, CONNECT, loops; and runs of near requests) with the exchange's request-side
state after every step, under a head bound that refuses some.

Hand breaks, each caught here (reverted): ``again`` keeping the request when the same bytes
are not replayable (``self._again = None`` left out: the parse test, which compares what is
kept right after ``again``; ``feed``, which the exchange asks next, drops it too);
``routed``'s kept tail taken for another destination (``built[3] is dest`` left out: two
authorities of one route); ``_POD_PATH_FOURTHS`` without "t" (a ``/cont`` path retargeted: the
``same_node`` tests and the exchanges); ``routed`` keeping a connection of another key
(``or`` → ``and``: the exchanges); ``upstream_opened`` sending without marking the
connection unused (``_up_used = False`` left out: the state test).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.http_messages import HEAD, REPLAY_MAX, Parsed
from ravenproxy.server.podroutes import Destination, same_node
from tests.helpers import examples

from .bd24_requests import Bd24Exchange, Bd24Parsed, bd24_same_node
from .test_exchange import VIA
from .test_review24_parse import _state, _view
from .test_review26_exchange import _conversation, _drive
from .test_varhead_near import _reads
from .test_varied_near import _runs

_SETTINGS = settings(
    max_examples=examples(1600), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
_NEAR = b"GET /ping?n=%d HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: latency\r\n\r\n"


# -- the parse ------------------------------------------------------------------------------------


def _kept(parsed: Any, heads: list[object]) -> object:
    again = parsed._again
    if again is None:
        return None
    index = next(i for i, h in enumerate(heads) if h is again[1])
    return again[0], index, again[2], again[3]


def _both(reads: list[bytes], *, exchange_way: bool) -> int:
    """``reads`` fed to the new parser and bd24f07's alike (``exchange_way``: offered first as
    each exchange offers them — the new ``again``; bd24f07's ``again``, then ``near`` — else to
    ``feed`` alone): the same answers, events, state, request kept and heads reused. Returns
    how many were near."""
    new, old = Parsed(response=False), Bd24Parsed(response=False)
    heads: list[list[object]] = [[], []]
    near = 0
    for i, data in enumerate(reads):
        taken = False
        if exchange_way and heads[0] and not new.events and not old.events:
            last_new, last_old = heads[0][-1], heads[1][-1]
            got = new.again(data, last_new)  # type: ignore[arg-type]
            if old.again(data, last_old):  # type: ignore[arg-type]
                assert got is last_new, i
                taken = True
            else:
                made = old.near(data, last_old)  # type: ignore[arg-type]
                assert got is not last_new and (got is None) == (made is None), i
                if got is not None:
                    near += 1
                    taken = True
                    heads[0].append(got)
                    heads[1].append(made)
                    assert _view((HEAD, got)) == _view((HEAD, made)), i
            # What is kept once it was asked (feed, which follows, may drop it either way).
            assert _kept(new, heads[0]) == _kept(old, heads[1]), i
        if not taken:
            assert new.feed(data) == old.feed(data), i
            heads[0] += [v for k, v in new.events if k == HEAD]
            heads[1] += [v for k, v in old.events if k == HEAD]
        assert [_view(e) for e in new.events] == [_view(e) for e in old.events], i
        assert _state(new) == _state(old), i
        assert new._replay_head is None or any(new._replay_head is h for h in heads[0])
        assert _kept(new, heads[0]) == _kept(old, heads[1]), i
        new.events.clear()
        old.events.clear()
    reused = [[next(j for j, o in enumerate(seen) if o is h) for h in seen] for seen in heads]
    assert reused[0] == reused[1]
    return near


@_SETTINGS
@given(st.one_of(_reads(), _runs()), st.booleans())
@example([_NEAR % 1, _NEAR % 2, _NEAR % 2, _NEAR % 30, _NEAR % 1], True)
@example([_NEAR % 1, b"\r\n" + _NEAR % 2, _NEAR % 3, _NEAR % 4], True)  # bytes shifted
@example([_NEAR % 1, (_NEAR % 2).replace(b"/ping", b"/" + b"x" * REPLAY_MAX), _NEAR % 3], True)
@example([_NEAR % 1, (_NEAR % 2) + _NEAR % 3, _NEAR % 4], False)  # pipelined, then near
@example([_NEAR % 1, b"", _NEAR % 2], True)  # the client's end offered
@example([_NEAR % 1, (_NEAR % 1).replace(b"latency", b"other"), _NEAR % 1], True)
@example([b"GET /a HTTP/1.1\r\nHost: e\r\nConnection: close\r\n\r\n"] * 2, True)  # not replayable
@example([b"GET /a HTTP/1.1\r\nHost: e\r\n\r\nGET /b HT", b"TP/1.1\r\nHost: e\r\n\r\n"], True)
def test_the_parse_as_bd24f07(reads: list[bytes], exchange_way: bool) -> None:
    _both(reads, exchange_way=exchange_way)


@pytest.mark.parametrize("method", [b"GET", b"OPTIONS", b"DELETE"])
def test_every_byte_value_at_every_place_of_a_target_as_bd24f07(method: bytes) -> None:
    """Near exactly where bd24f07 said so (visible ASCII after a "/"), the same heads."""
    first = method + b" /metrics HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"
    for byte in range(256):
        for at in range(13):
            target = b"/metrics?n=1"
            target = target[:at] + bytes([byte]) + target[at:]
            second = first.replace(b" /metrics ", b" " + target + b" ")
            near = _both([first, second, first.replace(b"/metrics", b"/m2")], exchange_way=True)
            visible = all(0x21 <= b <= 0x7E for b in target) and target[:1] == b"/"
            assert (near == 2) == visible, (byte, at)


# -- same_node ------------------------------------------------------------------------------------

_PIECES = [
    "/",
    "a",
    "t",
    "c",
    "/a",
    "%",
    "%41",
    "?",
    "nodeName",
    "nodeName=edge-2",
    "node",
    "/exec/",
    "/exec",
    "exec",
    "/containerLogs/",
    "/cont",
    "/attach/",
    "/atta",
    "/portForward/",
    "/port",
    "/run/",
    "/run",
    "run/",
    "/ping",
    "x",
    "*",
    "http://edge-1",
    " ",
    "é",
]
_VIAS = ["host", "tunnel-header", "absolute-uri", "node-name-query", "pod-path", "connect"]


@settings(max_examples=examples(4000), deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=6), st.sampled_from(_VIAS))
def test_same_node_as_bd24f07(pieces: list[str], via: str) -> None:
    target = "".join(pieces)
    last = Destination(via, "edge-1", 9100, None, "/")
    assert same_node(last, target) is bd24_same_node(last, target)


def test_same_node_at_every_character_as_bd24f07() -> None:
    """Every character of Latin-1 at every place of short targets, the pod heads' among them."""
    bases = ["", "/", "/ab", "/abcd", "/run/", "/exec/x", "/cont/x", "/atta", "/port"]
    for via in ("host", "tunnel-header", "pod-path"):
        last = Destination(via, "edge-1", 9100, None, "/")
        for base in bases:
            for at in range(len(base) + 1):
                for code in range(256):
                    target = base[:at] + chr(code) + base[at:]
                    assert same_node(last, target) is bd24_same_node(last, target), target
                    replaced = base[:at] + chr(code) + base[at + 1 :]
                    assert same_node(last, replaced) is bd24_same_node(last, replaced), replaced


# -- whole exchanges ------------------------------------------------------------------------------


def _request_state(ex: Exchange) -> tuple[object, ...]:
    up = ex._up
    return (
        ex.phase,
        ex._client_keep,
        ex._upgrade,
        ex._chunked_up,
        None if ex._outbound is None else list(ex._outbound),
        ex.body_done,
        ex._reused,
        ex._up_used,
        None if up is None else up.bodiless,
        ex._up_key,
        _view((HEAD, ex._request)) if ex._request is not None else None,
        _state(ex.client),
    )


def _watched(ex: Exchange, log: list[object]) -> Exchange:
    """``ex`` with its request-side state logged after each call the driver makes (not the
    calls made inside: the new ``upstream_opened`` calls ``routed``)."""
    depth = [0]
    for name in ("receive_client", "poll", "routed", "upstream_opened", "receive_upstream"):
        method = getattr(ex, name)

        def call(*args: Any, _method: Any = method, _name: str = name) -> Any:
            depth[0] += 1
            try:
                out = _method(*args)
            finally:
                depth[0] -= 1
            if not depth[0]:
                log.append((_name, _request_state(ex)))
            return out

        setattr(ex, name, call)
    return ex


def _exchanges(
    reads: list[bytes], answers: list[list[bytes]], fresh: list[bool], max_head: int
) -> None:
    new_log: list[object] = []
    old_log: list[object] = []
    new = _drive(_watched(Exchange(via=VIA, max_head=max_head), new_log), reads, answers, fresh)
    old = _drive(_watched(Bd24Exchange(via=VIA, max_head=max_head), old_log), reads, answers, fresh)
    assert new == old
    assert new_log == old_log


@_SETTINGS
@given(_conversation(), st.sampled_from([4096, 4096, 4096, 60]))
def test_conversations_as_bd24f07(
    conversation: tuple[list[bytes], list[list[bytes]], list[bool]], max_head: int
) -> None:
    """test_review26's conversations (targets absolute-form, pod paths, node names, Host and
    X-Tunnel-Proxy-Host, bodies, upgrades, CONNECT, loops, routes made anew), some under a
    head bound that refuses them."""
    _exchanges(*conversation, max_head)


_ANSWER = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
_CHUNKED = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"]
_CLOSED: list[bytes] = []  # the target closes before answering: a retry


@_SETTINGS
@given(
    st.one_of(_reads(), _runs()),
    st.lists(st.booleans(), min_size=1, max_size=3),
    st.sampled_from([4096, 4096, 80]),
)
@example(
    [
        _NEAR % 1,
        (_NEAR % 2).replace(b"/ping", b"/m?nodeName=edge-2&x"),  # names another node
        _NEAR % 3,
        (_NEAR % 4).replace(b"/ping", b"/exec/ns/pod/c"),  # a pod path
        (_NEAR % 5).replace(b"/ping", b"/containerLogs/ns/p/c"),
        (_NEAR % 6).replace(b"/ping", b"/contents"),  # a pod path's head, no pod path
        b"\r\n" + _NEAR % 7,
        _NEAR % 8,
        _NEAR % 9,
    ],
    [False, True],
    4096,
)
def test_runs_of_near_requests_through_exchanges_as_bd24f07(
    reads: list[bytes], fresh: list[bool], max_head: int
) -> None:
    _exchanges(reads, [_ANSWER, _CHUNKED, _ANSWER, _CLOSED], fresh, max_head)


def test_one_route_for_two_authorities_as_bd24f07() -> None:
    """Two absolute-form requests with the same fields whose destinations differ in their
    authority alone (``edge-1:80``, ``edge-1``: one host, port and scheme, so one route): the
    second's head is not the first's past its request line (its Host is its own)."""
    fields = b" HTTP/1.1\r\nHost: edge-1\r\nUser-Agent: t\r\n\r\n"
    reads = [b"GET http://edge-1:80/a" + fields, b"GET http://edge-1/b" + fields]
    _exchanges(reads, [_ANSWER], [False], 4096)
    log = _drive(Exchange(via=VIA, max_head=4096), reads, [_ANSWER], [False])
    sent = [v[1] for v in log if v[0] == "WriteUpstream"]
    assert [b"Host: edge-1:80\r\n" in sent[0], b"Host: edge-1\r\n" in sent[1]] == [True, True]
