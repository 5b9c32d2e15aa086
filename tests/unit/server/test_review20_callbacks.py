"""Review of srvfront's 152798a (issue 15): in callback mode the kept tunnel stream calls
:meth:`CallbackPath._advance` itself, where at 3466b61 it called :meth:`_on_upstream` (which
is unchanged, and called ``_advance`` in turn while an answer came). Held differentially: two
like connections, each served by callbacks after two answered requests, are fed the same
generated events — the target's chunks (a whole answer, part of one, bytes nobody asked for)
and its stream's end, between requests and mid-answer; the client's next requests (kept on
the stream, or sent elsewhere, so left to the task), pipelined two at once, or a ``close`` —
one with the stream calling ``_advance`` (now), the other ``_on_upstream`` (3466b61's hook).
After each event both wrote the same bytes to the client and the target, read the stream as
often, let it go (or kept it) alike, wait alike (``waiting``, ``_unread``), stamped their
keep-alive clocks alike, and left the same actions to the task."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.server.http_callbacks import CallbackPath
from ravenproxy.transport.socket_stream import SocketStream
from tests.helpers import examples

from .test_exchange import get
from .test_http_callbacks import _ANSWER, _answered_twice, _Transport

_EVENTS = st.lists(
    st.sampled_from(
        [
            "answer",
            "part",
            "rest",
            "stray",
            "end",
            "request",
            "request",
            "elsewhere",
            "pipelined",
            "close",
        ]
    ),
    min_size=1,
    max_size=8,
)


def _state(path: CallbackPath, stream: Any, transport: _Transport, stamp: float) -> object:
    done = path._exit
    left = None
    if done is not None and done.done():
        left = (
            repr(done.exception())
            if done.exception() is not None
            else [type(a).__name__ for a in done.result()]
        )
    watch = path._calls
    assert watch is not None
    return (
        list(transport.out),
        list(stream.sent),
        stream.reads,
        path.upstream is None,
        path.waiting,
        path._unread,
        path.ex.phase,
        watch.timeout_now(),
        watch.last != stamp,
        left,
    )


@settings(max_examples=examples(400), deadline=None)
@given(_EVENTS)
def test_the_stream_calling_advance_is_3466b61s_on_upstream(events: list[str]) -> None:
    asyncio.run(_both(events))


async def _both(events: list[str]) -> None:
    worlds = []
    for hook in ("_advance", "_on_upstream"):
        path, stream, transport = _answered_twice()
        watch = path._calls
        assert watch is not None
        watch.last -= 10
        worlds.append((path, stream, transport, getattr(path, hook), watch.last))
    for event in events:
        states = []
        for path, stream, transport, called_back, stamp in worlds:
            _step(event, path, stream, cast(Callable[[], None], called_back))
            states.append(_state(path, stream, transport, stamp))
        assert states[0] == states[1], event
        if states[0][-1] is not None:  # left to the task: the callbacks are done
            return


def _step(event: str, path: CallbackPath, stream: Any, called_back: Callable[[], None]) -> None:
    sock = cast(SocketStream, path.reader)
    if event in ("answer", "part", "rest", "stray", "end"):
        if event == "end":
            stream.ended = True
        else:
            stream.chunks.append(
                {"answer": _ANSWER, "part": _ANSWER[:-3], "rest": _ANSWER[-3:], "stray": b"x"}[
                    event
                ]
            )
        called_back()  # the stream's callback
        return
    data = {
        "request": get("/c", "edge-1:9100"),
        "elsewhere": get("/d", "edge-2:9100"),
        "pipelined": get("/e", "edge-1:9100") + get("/f", "edge-1:9100"),
        "close": b"GET /g HTTP/1.1\r\nHost: edge-1:9100\r\nConnection: close\r\n\r\n",
    }[event]
    sock.data_received(data)
    path._advance()  # the socket's callback
