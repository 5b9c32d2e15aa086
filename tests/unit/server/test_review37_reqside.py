"""review37: branch reqside's folded request side (``Parsed.again`` answering near requests,
``RequestHeads`` and ``_send`` folded into ``Exchange.routed``, ``same_node`` by index) tried
against bd24f07's (:mod:`.bd24_requests`, verbatim) over inputs reqside's own tests did not
generate, and against a fresh connection.

A driver of its own plays the front's world: each :class:`RouteRequest` answered by a script —
the route kept, a new Route object for the same node, the request's node *moved* (a route to
another node, another target connection), or a refusal (429, 403, 421, 502); each
:class:`OpenUpstream` opened or failing its dial (502); each answer whole, chunked, cut, or the
target closing before answering (a kept connection's: the retry, ``upstream_opened`` →
``routed(None)``, whose own dial may fail). The client's requests come in runs: near requests
(the last one's bytes but for its target) alternating with repeated ones and with others,
pipelined several to a read or cut, with bodies (Content-Length, chunked), WebSocket upgrades,
CONNECT, ``OPTIONS *``, absolute-form targets with and without ports, ``/api/v1/nodes/N/proxy/…``
paths, every pod path prefix ``same_node`` knows whole, cut short, in another case and
percent-encoded, ``nodeName`` queries, Host and X-Tunnel-Proxy-Host changing between requests,
under head bounds met exactly (the bound at a head's size, one under, one over).

Checked: the new Exchange and bd24f07's ask the driver for the same things in the same order,
with the same request-side state after each call (test_reqside2_fold's ``_watched``); and,
independent of the oracle, every request of a run of near and repeated requests reaches its
target byte for byte as it does when sent alone on a fresh connection.

Hand breaks of the production code, each caught here (then reverted): a near head's size
left the last one's (``made.size = last.size``: the bound at a head's size exactly, and the pod
prefixes); the near request's bound not asked before it is retargeted (``request.size <=
self.max_head`` left out: the exact bounds); a retry sending the head alone (``_outbound[0]``:
a DELETE's body lost on a kept connection that closed unanswered); ``same_node`` without its
``"%"`` test (``node%4Eame=edge-2`` retargeted to the Host's node: the fresh connection's
test, whose destinations differ); ``again`` not comparing the method (``PUT`` taken as the last
``GET``); ``routed``'s kept tail for another route (``built[1] is route`` left out: an HTTP/1.0
request without Host, whose Host is made of the route's port, after the node moved). Not
observable through an exchange, hence not counted: ``routed``'s request line reused when the
destination rewrote the target (``dest.target is request.target``: only an absolute-form target
is rewritten, and none is retargeted or kept), ``again``'s replayable test on the near path
(what ``feed`` keeps is one whole request without a body event, and one that closes the
connection ends it first), and ``_retarget`` / ``_on_request`` (bd24f07's oracle inherits them).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, example, given, settings
from hypothesis import strategies as st

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    OpenUpstream,
    Refuse,
    RouteRequest,
    SwitchProtocols,
    Tunnel,
    WriteUpstream,
)
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import Parsed
from ravenproxy.server.router import Route
from tests.helpers import examples

from .bd24_requests import Bd24Exchange
from .test_exchange import VIA, route
from .test_reqside2_fold import _watched
from .test_review26_exchange import _view

_SETTINGS = settings(
    max_examples=examples(1600), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# -- requests -------------------------------------------------------------------------------------

_POD_TARGETS = [
    f"/{prefix}{rest}"
    for prefix in ("containerLogs", "exec", "attach", "portForward", "run")
    for rest in ("/ns/web-1/c?follow=true", "/ns/web-1", "/ns/", "/ns", "/", "")
] + [
    "/exe",
    "/atta",
    "/port",
    "/cont",
    "/ru",
    "/runs/ns/p/c",
    "/execx/ns/p/c",
    "/Exec/ns/p/c",
    "/RUN/ns/p/c",
    "/containerlogs/ns/p/c",
    "/portforward/ns/p",
    "/%65xec/ns/p/c",
    "/exec/ns%2Fp/c",
    "/r%75n/ns/p/c",
    "/exec//p/c",
]
_TARGETS = [
    "/ping?n=1",
    "/ping?n=2",
    "/ping?n=22",
    "/metrics",
    "/",
    "/api/v1/nodes/edge-1/proxy/metrics",
    "/api/v1/nodes/edge-2/proxy/stats/summary?x=1",
    "/api/v1/nodes/edge-1/proxy/exec/ns/p/c",
    "/m?nodeName=edge-2",
    "/m?nodeName=edge-2:9100&x=1",
    "/m?node%4Eame=edge-2",
    "/m?nodeName=",
    "/m?nodename=edge-2",
    "/m?x=%41",
    "http://edge-1:9100/m",
    "http://edge-1/m",
    "http://edge-1:80/m",
    "http://edge-2:9100/m?n=1",
    "https://edge-1:10250/pods",
    "http://EDGE-1:9100/m",
    "http://10.1.0.1:10250/x",
    *_POD_TARGETS,
]
_FIELD_SETS = [
    [(b"Host", b"edge-1:9100")],
    [(b"Host", b"edge-1:9100"), (b"User-Agent", b"t")],
    [(b"Host", b"edge-2:9100"), (b"User-Agent", b"t")],
    [(b"Host", b"edge-1")],
    [(b"Host", b"Edge-1:9100")],
    [(b"Host", b"127.0.0.1"), (b"X-Tunnel-Proxy-Host", b"edge-2:9100")],
    [(b"Host", b"127.0.0.1"), (b"X-Tunnel-Proxy-Host", b"edge-1")],
    # No Host (HTTP/1.0's): the head sent on gets one made of the route's port.
    [(b"X-Tunnel-Proxy-Host", b"edge-2"), (b"Connection", b"keep-alive")],
    [(b"Host", b"edge-1:9100"), (b"Connection", b"Upgrade"), (b"Upgrade", b"websocket")],
    [(b"Host", b"edge-1:9100"), (b"Connection", b"close")],
    [(b"Host", b"edge-1:9100"), (b"Expect", b"100-continue")],
    [],  # no Host: HTTP/1.1 refuses it
]
_ENDING_FIELDS = 4
"""The last of :data:`_FIELD_SETS` end a run (an upgrade, a close, Expect, no Host): seldom."""
_FIELDS = [*range(len(_FIELD_SETS) - _ENDING_FIELDS)] * 6 + [*range(len(_FIELD_SETS))]
_METHODS = ["GET"] * 12 + ["HEAD", "POST", "PUT", "DELETE", "OPTIONS", "CONNECT"]

_request = st.tuples(
    st.sampled_from(_METHODS),
    st.sampled_from(_TARGETS),
    st.sampled_from(["1.1"] * 6 + ["1.0"]),
    st.sampled_from(_FIELDS),
    st.sampled_from([None] * 6 + [b"", b"hi", ("chunked", b"abc"), ("chunked", b"")]),
)


def _bytes(req: tuple[Any, ...]) -> bytes:
    method, target, version, which, body = req
    fields = list(_FIELD_SETS[which])
    if method == "CONNECT":
        target = "edge-1:10250"
    elif method == "OPTIONS" and target == "/":
        target = "*"
    payload = b""
    if isinstance(body, bytes):
        fields.append((b"Content-Length", b"%d" % len(body)))
        payload = body
    elif body is not None:
        fields.append((b"Transfer-Encoding", b"chunked"))
        data = body[1]
        payload = (b"%x\r\n%b\r\n" % (len(data), data) if data else b"") + b"0\r\n\r\n"
    lines = b"".join(k + b": " + v + b"\r\n" for k, v in fields)
    return f"{method} {target} HTTP/{version}\r\n".encode() + lines + b"\r\n" + payload


@st.composite
def _run(draw: st.DrawFn) -> list[bytes]:
    """A client's requests: each the last one again, the last one but for its target (a near
    one), or another."""
    last = draw(_request)
    if draw(st.integers(0, 2)):  # mostly a plain GET's run (a scrape's, a poller's)
        last = ("GET", last[1], "1.1", draw(st.sampled_from(_FIELDS[:-1])) % 6, None)
    out = [_bytes(last)]
    for _ in range(draw(st.integers(1, 9))):
        step = draw(st.sampled_from(["near"] * 4 + ["again"] * 2 + ["method", "fields", "other"]))
        if step == "near":
            last = (last[0], draw(st.sampled_from(_TARGETS)), *last[2:])
        elif step == "method":  # that but for its method (one as long, often)
            method = draw(st.sampled_from(["PUT", "PUT", "GET", "HEAD", "POST", "DELETE"]))
            last = (method, *last[1:])
        elif step == "fields":  # that but for its fields (edge-1's Host or edge-2's, ...)
            last = (*last[:3], draw(st.sampled_from(_FIELDS)), last[4])
        elif step == "other":
            last = draw(_request)
        out.append(_bytes(last))
    return out


@st.composite
def _reads(draw: st.DrawFn, requests: list[bytes]) -> list[bytes]:
    """The requests as the client's reads: one a read, several in one (pipelined), or cut."""
    reads: list[bytes] = []
    at = 0
    while at < len(requests):
        many = draw(st.sampled_from([1, 1, 1, 1, 1, 1, 2, 3]))
        data = b"".join(requests[at : at + many])
        at += many
        if draw(st.integers(0, 9)) == 0:
            cut = draw(st.integers(1, len(data) - 1))
            reads += [data[:cut], data[cut:]]
        else:
            reads.append(data)
    return reads


# -- the driver -----------------------------------------------------------------------------------

_OK = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
_ANSWERS = [
    _OK,
    _OK,
    _OK,
    [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"],
    [b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 2\r\n\r\nok"],
    [],  # the target closes before answering: a kept connection's request is retried
    [b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"],
    [b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"],
]
_STEPS = ["fresh", "fresh", "move", "move", "move", 429, 403, 421, 502]


def _drive(
    ex: Exchange,
    reads: list[bytes],
    answers: list[list[bytes]],
    routes_script: list[Any],
    dials: list[bool],
) -> tuple[list[tuple[object, ...]], list[bytes]]:
    """``ex`` driven as the front drives it, its world scripted: each route asked for kept
    (one Route object per destination's node and port), made anew for the same node, moved to
    another node (another target connection), or refused with a status; each dial opened or
    failing (502); the client's body fed while it is not through, then the next answer; b""
    once the client or an answer has no more. What it asked for, in order, and the bytes sent
    to the target for each request routed."""
    log: list[tuple[object, ...]] = []
    sent: list[bytes] = []
    routes: dict[tuple[object, ...], Route] = {}
    made: list[Route] = []
    asked_for: list[RouteRequest] = []
    reads, asked, dialled, next_answer = list(reads), 0, 0, 0
    pieces: list[bytes] | None = None
    actions: list[Action] = []
    client_closed = False
    for _ in range(400):
        stop = False
        while actions:
            action = actions.pop(0)
            log.append(_view(action, made))
            if isinstance(action, RouteRequest):
                dest = action.dest
                # Which earlier action and destination objects it is (the front's router keeps
                # a memo per destination object: one reused is routed as it was).
                same = [i for i, a in enumerate(asked_for) if a is action]
                same_dest = [i for i, a in enumerate(asked_for) if a.dest is dest]
                asked_for.append(action)
                log.append(("asked", same[:1], same_dest[:1]))
                key = (dest.host.lower(), dest.port, dest.pod, dest.scheme)
                step = routes_script[asked % len(routes_script)] if routes_script else "keep"
                asked += 1
                sent.append(repr(key).encode() + b" ")  # where it went, then what
                if isinstance(step, int):
                    actions[:0] = ex.refused(step, dest.host, f"scripted {step}")
                    continue
                if key not in routes or step != "keep":
                    name = dest.host.lower() or ("edge-1" if dest.pod else "edge-3")
                    port = dest.port or 10250
                    if step == "move":  # another node, another port (the Host made of it)
                        name, port = name + "-moved", port + 1
                    ip = f"10.1.{len(name)}.{1 + sum(name.encode()) % 200}"
                    routes[key] = route(name, port, ip)
                    made.append(routes[key])
                log.append(("route", made.index(routes[key])))
                actions[:0] = ex.routed(routes[key])
            elif isinstance(action, OpenUpstream):
                pieces = None
                ok = dials[dialled % len(dials)] if dials else True
                dialled += 1
                if ok:
                    actions[:0] = ex.upstream_opened()
                else:
                    actions[:0] = ex.refused(502, action.route.node.name, "scripted dial failure")
            elif isinstance(action, WriteUpstream):
                sent[-1] += action.data
            elif isinstance(action, SwitchProtocols):
                log.append(("switch", *ex.switch()))
                stop = True
            elif isinstance(action, (Refuse, Tunnel)) or type(action).__name__ == "Close":
                stop = True
        if stop or ex.phase in ("closed", "switching"):
            break
        if ex.phase == "forwarding":
            if ex._up is None:
                actions = ex.upstream_lost()
            elif not ex.body_done and reads:
                actions = ex.receive_client(reads.pop(0))
            elif pieces is None:
                pieces = list(answers[next_answer % len(answers)])
                next_answer += 1
            elif pieces:
                actions = ex.receive_upstream(pieces.pop(0))
            else:
                pieces = None
                actions = ex.receive_upstream(b"")
        elif ex.phase == "head":
            pieces = None
            actions = ex.poll()
            if not actions:
                if reads:
                    actions = ex.receive_client(reads.pop(0))
                elif not client_closed:
                    client_closed = True
                    actions = ex.receive_client(b"")
                else:
                    break
        else:
            raise AssertionError(ex.phase)
    log.append(("end", ex.phase, ex.body_done, ex.started, ex.client.midway))
    return log, sent


class _Counting(Parsed):
    """The client's parser, counting what ``again`` took: the same request, a near one."""

    def __init__(self, *, response: bool, max_tail: int) -> None:
        super().__init__(response=response, max_tail=max_tail)
        self.taken = {"again": 0, "near": 0}

    def again(self, data: bytes, head: Head) -> Head | None:
        got = super().again(data, head)
        if got is not None:
            self.taken["again" if got is head else "near"] += 1
        return got


def _both(
    reads: list[bytes],
    answers: list[list[bytes]],
    routes_script: list[Any],
    dials: list[bool],
    max_head: int,
) -> tuple[list[tuple[object, ...]], dict[str, int]]:
    """The same world for the new Exchange and bd24f07's: the same actions, bytes to the
    target and request-side state after each call. The new one's actions, and what its
    parser's ``again`` took (the same request again, near ones)."""
    new_state: list[object] = []
    old_state: list[object] = []
    new = _watched(Exchange(via=VIA, max_head=max_head), new_state)
    new.client = counting = _Counting(response=False, max_tail=max_head)
    old = _watched(Bd24Exchange(via=VIA, max_head=max_head), old_state)
    new_log, new_sent = _drive(new, reads, answers, routes_script, dials)
    old_log, old_sent = _drive(old, reads, answers, routes_script, dials)
    assert new_log == old_log
    assert new_sent == old_sent
    assert new_state == old_state
    _events(new_log, counting.taken)
    return new_log, counting.taken


def _events(log: list[tuple[object, ...]], taken: dict[str, int]) -> None:
    """What a generated world led to (``--hypothesis-show-statistics``)."""
    if currently_in_test_context():
        kinds = [v[0] for v in log]
        event(f"near heads made: {min(taken['near'], 3)}; the same again: {min(taken['again'], 2)}")
        event(f"requests routed: {min(kinds.count('RouteRequest'), 5)}")
        for v in log:
            if v[0] == "Refuse":
                event(f"refused {v[1]}")
        for at, kind in enumerate(kinds):
            if (
                kind == "OpenUpstream"
                and kinds[at - 1] == "CloseUpstream"
                and kinds[at - 2] != "route"
            ):
                event("a retry")
            if kind == "route" and log[at][1] > 0:
                event("a route made anew or moved")
        if "switch" in kinds:
            event("switched")
        if "Tunnel" in kinds:
            event("tunnel")


def _head_size(request: bytes) -> int:
    return request.index(b"\r\n\r\n") + 4


@st.composite
def _world(draw: st.DrawFn) -> tuple[list[bytes], list[list[bytes]], list[Any], list[bool], int]:
    requests = draw(_run())
    reads = draw(_reads(requests))
    answers = [_OK] * draw(st.integers(1, 6))  # answered, but for one of them seldom:
    answers[draw(st.integers(0, len(answers) - 1)) // 2] = draw(st.sampled_from(_ANSWERS))
    routes_script = ["keep"] * len(requests)  # kept, but for one or two (a refusal ends it)
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2]))):
        routes_script[draw(st.integers(0, len(requests) - 1))] = draw(st.sampled_from(_STEPS))
    dials = [True] * 12  # opened, a dial failing seldom (a retry's, say)
    if draw(st.integers(0, 5)) == 0:
        dials[draw(st.integers(1, 11))] = False
    bound = draw(st.sampled_from(["wide", "wide", "wide", "exact"]))
    max_head = 4096
    if bound == "exact":  # a later request's head at the bound, one under it or one over
        size = max(_head_size(requests[0]), _head_size(draw(st.sampled_from(requests))))
        max_head = size + draw(st.sampled_from([-1, 0, 0, 1]))
    return reads, answers, routes_script, dials, max_head


_PING = b"GET /ping?n=%d HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: t\r\n\r\n"
_TUNNELED = (
    b"GET /ping?n=%d HTTP/1.0\r\nX-Tunnel-Proxy-Host: edge-2\r\nConnection: keep-alive\r\n\r\n"
)


@_SETTINGS
@given(_world())
@example(([_PING % 1, _PING % 2, _PING % 2, _PING % 3, _PING % 3], [_OK], ["keep"], [True], 4096))
@example(  # the node moves mid-run: the near request's connection is another
    ([_PING % 1, _PING % 2, _PING % 3], [_OK], ["keep", "move", "keep"], [True], 4096)
)
@example(  # a kept connection closes unanswered: the retry's dial fails
    ([_PING % 1, _PING % 2, _PING % 3], [_OK, []], ["keep"], [True, True, False], 4096)
)
@example(([_PING % 1, _PING % 2 + _PING % 3 + _PING % 3], [_OK], ["keep", 429], [True], 4096))
@example(  # the near request's head at the bound exactly, then one over it
    ([_PING % 1, _PING % 22, _PING % 222], [_OK], ["keep"], [True], _head_size(_PING % 22))
)
@example(
    (
        [
            _PING % 1,
            (_PING % 2).replace(b"/ping?n=2", b"/exec/ns/web-1/c"),
            (_PING % 3).replace(b"/ping?n=3", b"/exec"),
            (_PING % 4).replace(b"/ping?n=4", b"/%65xec/ns/p/c"),
            (_PING % 5).replace(b"/ping?n=5", b"/runs/ns/p/c"),
            (_PING % 6).replace(b"/ping?n=6", b"/api/v1/nodes/edge-2/proxy/x"),
        ],
        [_OK],
        ["keep"],
        [True],
        4096,
    )
)
@example(([_PING % 1, (_PING % 1).replace(b"GET", b"PUT")], [_OK], ["keep"], [True], 4096))
@example(([_PING % 1, (_PING % 2).replace(b"GET /", b"PUT /")], [_OK], ["keep"], [True], 4096))
@example(
    (
        [_PING % 1, (_PING % 2).replace(b"1.1", b"1.0"), (_PING % 3).replace(b"edge-1", b"edge-2")],
        [_OK],
        ["keep"],
        [True],
        4096,
    )
)
@example(  # a body on a kept connection that closes unanswered: retried whole
    (
        [_PING % 1, b"DELETE /x HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 2\r\n\r\nhi"],
        [_OK, [], _OK],
        ["keep"],
        [True],
        4096,
    )
)
@example(  # no Host: the head's made of the route, which moves mid-run (another port)
    (
        [_TUNNELED % 1, _TUNNELED % 2, _TUNNELED % 3],
        [_OK],
        ["keep", "move", "keep"],
        [True],
        4096,
    )
)
def test_scripted_worlds_as_bd24f07(
    world: tuple[list[bytes], list[list[bytes]], list[Any], list[bool], int],
) -> None:
    _both(*world)


# -- against a fresh connection -------------------------------------------------------------------

_PLAIN_FIELDS = [0, 1, 2, 3, 4, 5, 6, 7]  # no upgrade, close, Expect; no Host: HTTP/1.0's


@st.composite
def _plain_run(draw: st.DrawFn) -> list[bytes]:
    """A run every request of which is answered and leaves the connection open: near and
    repeated requests, sometimes another's fields, bodies by length or chunked."""
    which = draw(st.sampled_from(_PLAIN_FIELDS))
    method = draw(st.sampled_from(["GET", "GET", "HEAD", "POST", "DELETE"]))
    body = draw(st.sampled_from([None, None, b"hi", ("chunked", b"abc")]))
    out = []
    for _ in range(draw(st.integers(2, 10))):
        step = draw(st.sampled_from(["again", "near", "near", "other"]))
        if step == "other" or not out:
            which = draw(st.sampled_from(_PLAIN_FIELDS))
            method = draw(st.sampled_from(["GET", "GET", "HEAD", "POST", "DELETE"]))
            body = draw(st.sampled_from([None, None, b"hi", ("chunked", b"abc")]))
        target = draw(st.sampled_from(_TARGETS)) if step != "again" or not out else None
        version = "1.0" if which == 7 else "1.1"
        req = _bytes((method, target or "/", version, which, body))
        if target is None:
            req = out[-1]
        out.append(req)
    return out


@_SETTINGS
@given(_plain_run(), st.booleans(), st.lists(st.sampled_from(["keep", "fresh"]), max_size=3))
@example([_PING % 1, _PING % 2, _PING % 2, _PING % 1], False, ["keep"])
@example(  # a node named in a query, percent-encoded (the Host's node: not retargeted)
    [_PING % 1, (_PING % 2).replace(b"/ping?n=2", b"/m?node%4Eame=edge-2"), _PING % 3],
    False,
    ["keep"],
)
@example(
    [b"GET http://edge-1:80/a HTTP/1.1\r\nHost: edge-1\r\n\r\n"]
    + [b"GET http://edge-1/b HTTP/1.1\r\nHost: edge-1\r\n\r\n"] * 2,
    True,
    ["keep"],
)
def test_a_run_sends_each_request_as_a_fresh_connection_does(
    requests: list[bytes], pipelined: bool, routes_script: list[str]
) -> None:
    """Each request of a run reaches its target as it does alone on a new client connection
    (a new Exchange): the same bytes (head and body), or refused alike."""
    reads = [b"".join(requests)] if pipelined else requests
    log, sent = _drive(Exchange(via=VIA, max_head=4096), reads, [_OK], routes_script, [True])
    alone = []
    for request in requests:
        one_log, one_sent = _drive(Exchange(via=VIA, max_head=4096), [request], [_OK], [], [True])
        if any(v[0] == "Refuse" for v in one_log):
            break  # the run ends at a refusal too
        alone += one_sent
    assert sent == alone[: len(sent)]
    assert len(sent) == len(alone) or any(v[0] == "Refuse" for v in log)


@pytest.mark.parametrize("prefix", ["containerLogs", "exec", "attach", "portForward", "run"])
def test_every_pod_prefix_cut_short_after_a_host_request(prefix: str) -> None:
    """After a request routed by Host, a near one whose target is a pod path (routed by its
    pod: another destination), each prefix cut at every length, with and without its "/",
    in another case: routed as bd24f07 routes it, sent as a fresh connection sends it."""
    whole = f"/{prefix}/ns/web-1/c"
    cuts = {whole[:n] for n in range(1, len(whole) + 1)}
    cuts |= {c.upper() for c in cuts} | {c.swapcase() for c in cuts}
    for cut in sorted(cuts):
        second = (_PING % 2).replace(b"/ping?n=2", cut.encode())
        reads = [_PING % 1, second, _PING % 3]
        log, taken = _both(reads, [_OK], ["keep"], [True], 4096)
        assert taken == {"again": 0, "near": 2}, cut  # (both near: made without llhttp)
        _, sent = _drive(Exchange(via=VIA, max_head=4096), reads, [_OK], ["keep"], [True])
        _, alone = _drive(Exchange(via=VIA, max_head=4096), [second], [_OK], [], [True])
        assert sent[1] == alone[0], cut
        assert [v[0] for v in log].count("RouteRequest") == 3, cut
