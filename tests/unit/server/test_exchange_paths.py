"""The exchange's shortcuts for a whole request without a body (its head goes to the target as
is, :meth:`Exchange._send`; the last one again is taken at once, :meth:`Parsed.again`) against
the general path (the body events forwarded one by one, every head queued as an event, as
before the shortcuts): the same bytes to the target and to the client, and the same actions,
for many requests on one connection — bodiless, with a length, chunked (trailers too),
pipelined, HEAD, in pieces, and one that ends the connection."""

from __future__ import annotations

import random
from collections import deque

import pytest

from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    CloseUpstream,
    OpenUpstream,
    ReadBody,
    Refuse,
    RouteRequest,
    WriteClient,
    WriteUpstream,
)
from ravenproxy.server.http_heads import Head
from ravenproxy.server.http_messages import Parsed
from ravenproxy.server.router import Route

from .bd24_requests import Bd24Routing
from .test_exchange import OK, VIA, route


class Parsing(Parsed):
    """Every request fed to the parser's events (none taken at once by :meth:`Parsed.again`)."""

    def again(self, data: bytes, head: Head) -> Head | None:
        return None


class General(Bd24Routing):
    """bd24f07's ``Exchange._send`` (folded into ``routed`` since: ``Bd24Routing``, over
    ``RequestHeads``) without the shortcut: every request through ``_body``; and
    :meth:`Exchange.receive_client` without the last request's again (its HEAD queued and
    taken as any other)."""

    def __init__(self, *, via: str, max_head: int) -> None:
        super().__init__(via=via, max_head=max_head)
        self.client = Parsing(response=False, max_tail=max_head)

    def _send(self) -> list[Action]:
        assert self._up is not None and self._outbound is not None and self._request is not None
        self._reused = self._up_used
        self._up_used = True
        self._up.bodiless = self._request.start == "HEAD"
        self.phase = "forwarding"
        if self.body_done:
            return [WriteUpstream(b"".join(self._outbound))]
        actions = self._body(first=True, head=self._outbound[0])
        if not self.body_done and self.phase == "forwarding":
            self._outbound = None
            actions.append(ReadBody())
        return actions


HEAD_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"

REQUESTS = [
    b"GET /ping HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: probe\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: edge-1:9100\r\nUser-Agent: probe\r\n\r\n",  # the same again
    b"GET /other HTTP/1.1\r\nHost: edge-1:9100\r\nX-A: 1\r\nKeep-Alive: 5\r\n\r\n",
    b"POST /p HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /e HTTP/1.1\r\nHost: edge-1:9100\r\nContent-Length: 0\r\n\r\n",
    b"PUT /c HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n0\r\n\r\n",
    b"PUT /t HTTP/1.1\r\nHost: edge-1:9100\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\nX-Sum: 1\r\n\r\n",
    b"HEAD /h HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n",
    b"GET /x HTTP/1.0\r\nHost: edge-1:9100\r\nConnection: keep-alive\r\n\r\n",
]
CLOSING = b"GET /last HTTP/1.1\r\nHost: edge-1:9100\r\nConnection: close\r\n\r\n"


def run(ex: Exchange, chunks: list[bytes], target: Route) -> list[tuple[str, bytes]]:
    """Drive ``ex`` as the front does: client bytes in the given pieces, every request routed
    to ``target`` and answered 200; what went where, in order."""
    log: list[tuple[str, bytes]] = []
    rest = deque(chunks)
    queue: deque[Action] = deque(ex.receive_client(rest.popleft()))
    while True:
        while queue:
            action = queue.popleft()
            if isinstance(action, RouteRequest):
                queue.extend(ex.routed(target))
            elif isinstance(action, OpenUpstream):
                log.append(("open", b""))
                queue.extend(ex.upstream_opened())
            elif isinstance(action, WriteUpstream):
                log.append(("up", action.data))
            elif isinstance(action, WriteClient):
                if action.status:
                    log.append(("count", b"%d" % action.status))
                log.append(("down", action.data))
            elif isinstance(action, CloseUpstream):
                log.append(("close-up", b""))
            elif isinstance(action, Close | Refuse):
                log.append((type(action).__name__, b""))
                return log
            else:
                assert isinstance(action, ReadBody), action
                log.append(("read-body", b""))
        if ex.phase == "forwarding" and not ex.body_done and rest:
            queue.extend(ex.receive_client(rest.popleft()))
        elif ex.phase == "forwarding":
            answer = HEAD_OK if ex._up is not None and ex._up.bodiless else OK
            queue.extend(ex.receive_upstream(answer))
        elif ex.phase == "head" and (polled := ex.poll()):
            queue.extend(polled)
        elif ex.phase == "head" and rest:
            queue.extend(ex.receive_client(rest.popleft()))
        else:
            return log


def both(chunks: list[bytes]) -> list[tuple[str, bytes]]:
    target = route("edge-1")
    fast = run(Exchange(via=VIA, max_head=4096), chunks, target)
    general = run(General(via=VIA, max_head=4096), chunks, target)
    assert fast == general
    return fast


def test_one_by_one_the_same_as_the_general_path() -> None:
    log = both([*REQUESTS, *REQUESTS, CLOSING])
    sent = [data for where, data in log if where == "up"]
    assert sum(data.startswith((b"GET ", b"POST ", b"PUT ", b"HEAD ")) for data in sent) == 19
    assert log[-1] == ("Close", b"")
    # The first request opens the target connection; a HEAD's is not used again (llhttp cannot
    # be told its answer has no body), so the two after them open one each.
    assert log.count(("open", b"")) == 3


def test_pipelined_the_same_as_the_general_path() -> None:
    log = both([b"".join(REQUESTS) + CLOSING])
    assert [d for w, d in log if w == "count"] == [b"200"] * (len(REQUESTS) + 1)


@pytest.mark.parametrize("seed", range(20))
def test_random_pieces_the_same_as_the_general_path(seed: int) -> None:
    """Requests in a random order, cut at random places (bodies arriving after their head:
    the general path reads them as the front's body pump does)."""
    rng = random.Random(seed)
    stream = b"".join(rng.choice(REQUESTS) for _ in range(12)) + CLOSING
    cuts = sorted(rng.sample(range(1, len(stream)), 15))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    log = both(chunks)
    assert [d for w, d in log if w == "count"] == [b"200"] * 13


def test_each_request_again_and_again_the_same_as_the_general_path() -> None:
    """Each request three times in a row, one read each (the same again is taken at once when
    it is whole and bodiless), then the first again after the others."""
    log = both([r for r in REQUESTS for _ in range(3)] + [REQUESTS[0], CLOSING])
    assert [d for w, d in log if w == "count"] == [b"200"] * (3 * len(REQUESTS) + 2)
