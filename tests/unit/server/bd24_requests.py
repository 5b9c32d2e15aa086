"""bd24f07's request side, verbatim (only renamed), for branch reqside's oracle tests
(test_reqside2_*.py; also the older oracles whose old Exchange or parser inherited what reqside
restructured): ``Parsed.again`` and ``near`` (one method since, ``again``) with ``feed``, which
asked ``near``; ``Exchange.receive_client``, ``routed``, ``upstream_opened`` and ``_send`` with
``RequestHeads`` (folded into ``routed`` since); ``podroutes.same_node`` (indexes since).
Nothing here is imported from a baseline checkout.
"""

from __future__ import annotations

from types import SimpleNamespace

from httptools import HttpParserError, HttpParserUpgrade

from ravenproxy.server.exchange import Exchange, _new
from ravenproxy.server.exchange_actions import (
    Action,
    OpenUpstream,
    ReadBody,
    RouteRequest,
    WriteUpstream,
)
from ravenproxy.server.http_heads import Head, RequestHead
from ravenproxy.server.http_messages import (
    _ENDED,
    END,
    EOF,
    ERROR,
    HEAD,
    REPLAY_MAX,
    Parsed,
    _new_head,
    _Stop,
)
from ravenproxy.server.http_rewrite import request_head
from ravenproxy.server.podroutes import (
    _POD_PATH_HEADS,
    NODE_NAME_PARAM,
    Destination,
)
from ravenproxy.server.router import Route, UpstreamKey

# -- podroutes.same_node -------------------------------------------------------------------------


def bd24_same_node(last: Destination, target: str) -> bool:
    """Whether ``last`` (found by :func:`find_destination` for a request with the method,
    version and fields of one whose target is ``target``) is that request's destination too,
    but for its :attr:`~Destination.target`: when the node and port were named by
    X-Tunnel-Proxy-Host (which no target overrides but a non-origin one), or by Host and
    ``target`` names no node itself (no ``nodeName`` nor ``%`` in it, no pod path's start).
    A keep-alive connection's next request then takes ``last`` with its target set
    (:meth:`~ravenproxy.server.exchange.Exchange._on_request`): no destination made, and the
    router's memo made for ``last`` is reused without a field compared."""
    if target[:1] != "/":
        return False
    via = last.via
    if via == "host":
        return not (NODE_NAME_PARAM in target or "%" in target or target[1:5] in _POD_PATH_HEADS)
    return via == "tunnel-header"


same_node = bd24_same_node  # the name bd24f07's exchange code below calls


# -- http_rewrite.RequestHeads -------------------------------------------------------------------


class Bd24RequestHeads:
    """:func:`request_head` for one client connection's requests (``via``: the server's
    token), the part after the request line kept: a request with the last one's fields (the
    parse's same :attr:`Head.wire` object) and version, its destination and route the same
    objects (a keep-alive client's next URL: the exchange retargets the destination), gets
    the same fields, Via, upgrade and chunking, so only its request line is made.
    :meth:`head` answers (head, upgrade, chunked) as a plain tuple (an :class:`Outbound` is
    made by a subtype's constructor: three objects)."""

    __slots__ = ("_chunked", "_dest", "_route", "_tail", "_upgrade", "_version", "_wire", "via")

    def __init__(self, via: str) -> None:
        self.via = via
        # What the kept tail was made for, each in a slot of its own (compared one by one: no
        # tuple indexed per request): the fields' lines, destination, route (by identity) and
        # version. The same lines are the same fields (a name holds no colon, a value no line
        # end), hence the same routing fields and decoded forms. None: nothing kept yet.
        self._wire: bytes | None = None
        self._dest: Destination | None = None
        self._route: Route | None = None
        self._version = ""
        self._tail = b""
        """The head past its request line."""
        self._upgrade, self._chunked = False, False

    def head(self, request: Head, dest: Destination, route: Route) -> tuple[bytes, bool, bool]:
        if (
            request.wire is self._wire
            and dest is self._dest
            and route is self._route
            and request.version == self._version
        ):
            # The request line as it came when the target goes on unchanged (the same object:
            # not rewritten by the destination): no format, no encode.
            line = request.line if dest.target is request.target else None
            if line is None:
                line = f"{request.start} {dest.target} HTTP/1.1\r\n".encode("latin-1")
            return line + self._tail, self._upgrade, self._chunked
        out = request_head(request, dest, route, self.via)
        head = out.head
        # The request line ends at the head's first CRLF (a target holds none).
        self._tail, self._upgrade, self._chunked = (
            head[head.index(b"\r\n") + 2 :],
            out.upgrade,
            out.chunked,
        )
        self._wire, self._dest, self._route = request.wire, dest, route
        self._version = request.version
        return head, out.upgrade, out.chunked


# -- Parsed.feed, near and again -----------------------------------------------------------------


class Bd24Parsed(Parsed):
    """The parser with bd24f07's ``feed``, ``near`` and ``again`` (every other method is the
    new one, unchanged by reqside)."""

    __slots__ = ()

    def near(self, data: bytes, head: Head) -> Head | None:
        """llhttp's head of ``data`` made without it (END queued; the last one's fields), when
        ``head`` is the kept request's (:attr:`_again`, replayable), no event waits and ``data`` is
        its bytes but for an origin-form target; else None, the kept request dropped (feed's)."""
        again = self._again
        if again is None or again[1] is not head or self.events:
            return None
        self._again = None  # kept anew below, when near
        last, kept, lead, tail = head, self._last, again[2], again[3]
        line = last.line  # the last request line as it came (None: not known whole)
        if line is None or kept is None or kept[5] is not last or type(data) is not bytes:
            return None
        if lead is None:  # the kept bytes lined up with their head's line, once a parse:
            whole = again[0]  # not when kept after CRLFs llhttp skipped (bytes shifted)
            if whole[: len(line)] != line:
                return None
            # The method and space; from the target's end on (the line ends " HTTP/1.1" CRLF).
            lead, tail = line[: len(last.start) + 1], whole[len(line) - 11 :]
        method, end = len(lead), len(data) - len(tail)  # the new target's start and end
        if end <= method or data[end:] != tail or data[:method] != lead:
            return None
        if self.in_head or self.in_body:
            return None
        target = data[method:end]
        # As llhttp reads it: origin-form, visible ASCII (anywhere in a path, query, fragment);
        # any other byte goes to llhttp (three C calls: a regular expression is ~1 900 more).
        try:
            text = target.decode("ascii")
        except UnicodeDecodeError:
            return None
        if (
            target[0] != 47  # "/" (an index, not a slice: ~300 fewer)
            or " " in text
            or not text.isprintable()  # (ASCII: 0x20-0x7E)
            or not (last is self._replay_head or self._replayable(last))  # asked last
        ):
            return None
        made = _new_head(RequestHead)  # its line ends 11 bytes past its target
        made.start, made.target, made.version = last.start, text, last.version
        made.line, made.fields, made.wire = data[: end + 11], last.fields, last.wire
        made.routing, made.size = last.routing, last.size + end + 11 - len(line)
        self._last = (target, kept[1], kept[2], kept[3], kept[4], made)
        self._again = (data, made, lead, tail) if len(data) <= REPLAY_MAX else None
        self._replay_head = made  # _replayable's answer: its method, version, routing are these
        self.events.append(_ENDED)
        return made

    def feed(self, data: bytes) -> bytes | None:
        """Parse ``data``; returns the bytes past an upgrade's (or CONNECT's) head, if one
        ended the HTTP part of the connection. An error is queued after what came before it."""
        events = self.events
        again = self._again
        if again is not None:
            # The last request again (a scrape, a probe) or but for its target (a next URL):
            # the parser would make the same two events (the head but for its target).
            if data == again[0]:
                head = self._repeated(data)
                if head is not None:
                    events.append((HEAD, head))
                    events.append(_ENDED)
                    self.fed = 0
                    return None
            elif (head := self.near(data, again[1])) is not None:  # its END queued
                events.appendleft((HEAD, head))  # (no event waited)
                self.fed = 0
                return None
            # The parser leaves that state: what it held is remembered anew (or not at all).
            self._again = None
        if self.tail > self.max_tail:  # refused (below): nothing more goes into the parser
            return None
        # A request may begin at the start of ``data`` (the parser between messages, no event
        # waiting); an answer there may be of the last one's shape (_answered).
        fresh = False
        queued = len(events)
        if not self.in_body:
            self.fed += len(data)
            if self.in_head:
                pass
            elif self._response:
                # (The last shape's plan: one compare, not a match, for answers that differ.)
                if self._plan is not None and (took := self._answered(data)):
                    # As llhttp: the next message's bytes not counted, its version asked.
                    self.fed = self.tail = 0
                    if took == len(data):
                        return None
                    data = data[took:]
                    self._version = None
                else:
                    # (A slice compared: startswith parses its arguments by format, ~200 more.)
                    self._version = "1.1" if data[:9] == b"HTTP/1.1 " else None
            else:
                self._line = data
                fresh = not events
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            return data[exc.args[0] :]
        except HttpParserError as exc:
            # llhttp takes nothing more: no answer taken past it (_answered)
            self._last = self._plan = None
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
                self._again = (bytes(data), parsed, None, b"")
        return None

    def again(self, data: bytes, head: Head) -> bool:
        """:meth:`feed` with ``head`` taken at once: True when ``data`` is the last request
        again (``_again``), whole and bodiless, that request's head is ``head`` and no event
        waits — its END is queued; else False, and nothing was fed."""
        # :meth:`_repeated`'s rule asked without its call (once a request), the head's
        # identity first: no bytes compared for another request's head.
        again = self._again
        if again is None or again[1] is not head or self.events or self.in_head or self.in_body:
            return False
        if data != again[0]:  # feed asks whether it is that request but for its target
            return False
        if head is not self._replay_head and not self._replayable(head):
            return False
        self.events.append(_ENDED)
        self.fed = 0
        return True


# -- Exchange.receive_client, _on_request, routed and _send --------------------------------------


class Bd24Routing(Exchange):
    """bd24f07's ``routed``, ``upstream_opened`` and ``_send`` over ``RequestHeads`` (its
    ``_request_head``), for the older oracles' Exchanges, whose parsers are older still."""

    def __init__(self, *, via: str, max_head: int) -> None:
        super().__init__(via=via, max_head=max_head)
        self._built = None
        self._request_head = Bd24RequestHeads(via).head

    def routed(self, route: Route) -> list[Action]:
        """The request's route: keep the target connection when it fits, else open one."""
        seen = self._seen  # the request's RouteRequest: its destination
        assert self.phase == "routing" and self._request is not None and seen is not None
        same = route is self.route and self._up is not None  # the driver reused the route
        self.route = route
        self.body_done, self._body_error, self.started = False, None, False
        # The head for the target, reused while the request head and the route are the same
        # objects (a keep-alive client polling one URL); inline: it runs per request.
        request, built = self._request, self._built
        if built is None or built[0] is not request or built[1] is not route:
            out = self._request_head(request, seen[2].dest, route)
            send = _new(WriteUpstream)  # made without its __init__ (a request that differs)
            send.data = out[0]
            built = self._built = (request, route, out, send)
        head, self._upgrade, self._chunked_up = built[2]
        self._outbound = [head]
        if same:
            return self._send()
        key = UpstreamKey.of(route)
        actions: list[Action] = []
        if self._up is not None and key != self._up_key:
            actions += self._drop_upstream()
        if self._up is None:
            self._up_key = key
            self.phase = "opening"
            return [*actions, OpenUpstream(route)]
        return [*actions, *self._send()]

    def upstream_opened(self) -> list[Action]:
        """The target connection :class:`OpenUpstream` asked for is open."""
        assert self.phase == "opening"
        self._up = Parsed(response=True, max_tail=self.max_head)
        self._up_used = False
        return self._send()

    def _send(self) -> list[Action]:
        """The request (and the body bytes at hand) to the target connection."""
        assert self._up is not None and self._outbound is not None and self._request is not None
        self._reused = self._up_used
        self._up_used = True
        self._up.bodiless = self._request.start == "HEAD"
        self.phase = "forwarding"
        if self.body_done:  # a retry: the request went whole the first time
            return [WriteUpstream(b"".join(self._outbound))]
        events = self.client.events
        if events and events[0][0] == END and not self._chunked_up:
            # A whole request without a body (most are): its head, as _body would send it
            # (the action made with the head: this is the head in _outbound).
            events.popleft()
            self.body_done = True
            assert self._built is not None
            return [self._built[3]]
        actions = self._body(first=True, head=self._outbound[0])
        if not self.body_done and self.phase == "forwarding":
            self._outbound = None  # not whole: never retried
            actions.append(ReadBody())
        return actions


class Bd24Exchange(Bd24Routing):
    """The Exchange as it was at bd24f07: its client parser and ``receive_client`` (with
    bd24f07's ``same_node``) too. (``_on_request``, unchanged, is the Exchange's: it asks the
    new ``same_node``, held to bd24f07's alone in test_reqside2_fold.)"""

    def __init__(self, *, via: str, max_head: int) -> None:
        super().__init__(via=via, max_head=max_head)
        self.client = Bd24Parsed(response=False, max_tail=max_head)

    def receive_client(self, data: bytes) -> list[Action]:
        """Bytes from the client; ``b""``: it closed its side."""
        if self.phase == "closed":
            return []
        seen = self._seen
        if seen is not None and self.phase == "head":
            client = self.client
            if client.again(data, seen[0]):  # the last request again: it goes on as it went
                self._client_keep, self._request, self.phase = seen[1], seen[0], "routing"
                return [seen[2]]
            request = client.near(data, seen[0])  # or that but for its target (END queued)
            if request is not None:  # _on_request's case of the last fields (see there)
                if request.size <= self.max_head and same_node(seen[2].dest, request.target):
                    return self._retarget(request, seen)
                return self._on_request(request)
        if not data:
            self.client.events.append((EOF, None))
        elif self.client_raw is not None:
            self.client_raw += data
        else:
            self.client_raw = self.client.feed(data)
        return self._client_events()


# -- the new code driven in the old shapes (for the older oracles) -------------------------------


def offered(parsed: Parsed, data: bytes, head: Head) -> bool:
    """The new ``Parsed.again`` in bd24f07's terms, for oracles that compare it with an older
    parser's ``again`` (a bool): True when it took the last request again (``head`` returned,
    its END queued); a head it made for a near request is queued as ``feed`` queues one (HEAD
    first, ``fed`` reset: the events an older parser's ``feed`` makes of the same bytes), and
    False, as when it made none (then nothing was queued)."""
    got = parsed.again(data, head)
    if got is head:
        return True
    if got is not None:
        parsed.events.appendleft((HEAD, got))
        parsed.fed = 0
    return False


class RoutedHeads:
    """The head for the target as ``Exchange.routed`` makes it (``RequestHeads`` folded into it
    by reqside), asked as ``RequestHeads.head`` was: (head, upgrade, chunked) for a request,
    its destination and route, one connection's requests in turn (no target connection held:
    nothing is sent)."""

    def __init__(self, via: str) -> None:
        self.ex = Exchange(via=via, max_head=1 << 20)

    @property
    def _wire(self) -> bytes | None:
        """The fields' lines the kept tail was made for (RequestHeads' slot)."""
        built = self.ex._built
        return None if built is None else built[0].wire

    def head(self, request: Head, dest: Destination, route: Route) -> tuple[bytes, bool, bool]:
        ex = self.ex
        built = ex._built
        if built is not None and built[0] is request:
            # routed reuses its head while the request head and the route are the same objects
            # (RequestHeads was asked anew: its kept tail, not its last head, serves): a stand-in
            # with its fields' lines and version (all the kept tail's test reads of it).
            ex._built = (SimpleNamespace(wire=request.wire, version=request.version), *built[1:])
        ex.phase, ex._request, ex._seen = "routing", request, (request, True, RouteRequest(dest))
        actions = ex.routed(route)
        assert [type(a) for a in actions] == [OpenUpstream]
        built = ex._built
        assert built is not None and ex._outbound == [built[2].data]
        assert (ex._upgrade, ex._chunked_up) == (built[5], built[6])
        return built[2].data, built[5], built[6]
