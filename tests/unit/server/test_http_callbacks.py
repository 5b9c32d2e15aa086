"""The callback path's clock: whichever way the callbacks hand the connection to its task, the
watch is stamped first (the chunk an answer ended with is stamped by no one else)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import cast

from ravenproxy.metrics import ServerMetrics
from ravenproxy.server.exchange import Exchange
from ravenproxy.server.exchange_actions import (
    Action,
    Close,
    OpenUpstream,
    RouteRequest,
    WriteUpstream,
)
from ravenproxy.server.front import FrontContext
from ravenproxy.server.http_callbacks import KEEPALIVE_TIMEOUT, CallbackPath
from ravenproxy.server.router import Route
from ravenproxy.transport.bytestream import ByteStream
from ravenproxy.transport.relay import IdleWatch
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.transport.tunnel_stream import StreamClosedError, TunnelStream
from ravenproxy.wire.codes import ErrorCode
from tests.unit.server.test_exchange import VIA, get, route


async def test_leaving_to_the_task_stamps_the_watch() -> None:
    """A stale stamp (the request's, before a long answer) must not stay while the task takes
    over: its watch could fire before the task leaves it, and a pipelined request be lost."""
    path = CallbackPath()
    watch = path._calls = IdleWatch(60.0)
    watch.last -= 50.0
    done: asyncio.Future[list[Action]] = asyncio.get_running_loop().create_future()
    path._exit = done
    rest: list[Action] = [Close("x")]
    path._leave(rest)
    assert done.result() is rest
    assert asyncio.get_running_loop().time() - watch.last < 1.0


async def test_leaving_again_changes_nothing() -> None:
    """Once left, a second leave (from inside the same callback) neither stamps nor answers."""
    path = CallbackPath()
    watch = path._calls = IdleWatch(60.0)
    done: asyncio.Future[list[Action]] = asyncio.get_running_loop().create_future()
    path._exit = done
    first: list[Action] = []
    path._leave(first)
    watch.last -= 50.0
    path._leave([Close("y")])
    assert done.result() is first
    assert asyncio.get_running_loop().time() - watch.last > 49.0


# -- the stamps of _advance, driven on a real Exchange -----------------------------------------


class _Transport:
    """The client socket's transport: what it was written."""

    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def get_write_buffer_size(self) -> int:
        return 0  # (a slow client's drain looks whether it took bytes)


class _Stream:
    """The target's tunnel stream: chunks to read (an exception: raised), writes all taken."""

    ended = False

    def __init__(self, *chunks: bytes | Exception) -> None:
        self.chunks = list(chunks)
        self.sent: list[bytes] = []
        self.reads = 0

    def read_nowait(self) -> bytes | None:
        self.reads += 1
        if not self.chunks:
            return b"" if self.ended else None  # as TunnelStream's: its end, once read
        chunk = self.chunks.pop(0)
        if isinstance(chunk, Exception):
            raise chunk
        return chunk

    def try_write(self, data: bytes) -> int:
        self.sent.append(bytes(data))
        return len(data)

    def on_readable(self, callback: object) -> None:
        pass


class _Router:
    def __init__(self, route: Route) -> None:
        self.to = route

    def route_again(self, dest: object, over_tls: bool, memo: object) -> SimpleNamespace:
        return SimpleNamespace(route=self.to)


def _uncounted(status: int) -> None:
    pass


class _Connection(CallbackPath):
    def __init__(self, ex: Exchange, sock: SocketStream, router: _Router) -> None:
        super().__init__()
        self.ex, self.reader, self.writer = ex, sock, sock
        self.upstream = cast(ByteStream, object())  # a kept connection of no type looked into
        self.pump = None
        self.peer = ("192.0.2.1", 40000)
        self.ctx = cast(
            FrontContext,
            SimpleNamespace(
                drain=SimpleNamespace(draining=False),
                limits=SimpleNamespace(idle_timeout=IDLE),
                router=router,
                metrics=ServerMetrics(),
            ),
        )
        self.proxy = SimpleNamespace(
            front="http", egress=None, over_tls=False, counters={}, count=_uncounted
        )

    def _close_upstream(self) -> None:
        self.upstream = None


IDLE = 60.0
_A = route("edge-1")
_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _forwarding(client: bytes, upstream: _Stream, to: Route) -> tuple[_Connection, IdleWatch]:
    """A connection in callback mode whose exchange sent its request to edge-1 (``client``
    read: the request and what came with it) and waits for the answer; its watch's stamp
    ``IDLE - 1`` seconds old (the request's, or the answer's chunk before)."""
    ex = Exchange(via=VIA, max_head=4096)
    assert [type(a) for a in ex.receive_client(client)] == [RouteRequest]
    assert [type(a) for a in ex.routed(_A)] == [OpenUpstream]
    ex.upstream_opened()
    assert ex.phase == "forwarding"
    sock = SocketStream(64 * 1024)
    sock.connection_made(cast(asyncio.Transport, _Transport()))
    path = _Connection(ex, sock, _Router(to))
    path._hooked = cast(TunnelStream, upstream)
    path._write = sock.transport.write
    path._exit = asyncio.get_running_loop().create_future()
    watch = path._calls_watch()  # as _by_callbacks makes it
    assert watch.timeout == IDLE  # the sweep of the shorter turn
    watch.last -= IDLE - 1
    return path, watch


def _fresh(watch: IdleWatch) -> bool:
    return asyncio.get_running_loop().time() - watch.last < 1.0


async def test_a_chunk_of_an_answer_that_goes_on_stamps_the_watch() -> None:
    path, watch = _forwarding(get("/a", "edge-1:9100"), _Stream(_ANSWER[:-1]), _A)
    path._advance()
    assert path.ex.phase == "forwarding" and not path._exit.done()  # type: ignore[union-attr]
    assert _fresh(watch)


async def test_nothing_from_the_target_stamps_nothing() -> None:
    """A callback that brings no byte (the stream called back for its credit, say) is no
    activity: the clock goes on (else an idle target would never time out)."""
    path, watch = _forwarding(get("/a", "edge-1:9100"), _Stream(), _A)
    path._advance()
    assert not _fresh(watch)


async def test_an_answers_end_waiting_for_a_next_request_stamps_the_watch() -> None:
    path, watch = _forwarding(get("/a", "edge-1:9100"), _Stream(_ANSWER), _A)
    path._advance()
    assert path.ex.phase == "head" and path.waiting
    assert watch.timeout_now() == KEEPALIVE_TIMEOUT and _fresh(watch)


async def test_an_answers_end_with_a_pipelined_request_on_the_kept_stream_stamps() -> None:
    stream = _Stream(_ANSWER)
    client = get("/a", "edge-1:9100") + get("/b", "edge-1:9100")
    path, watch = _forwarding(client, stream, _A)
    path._advance()
    assert path.ex.phase == "forwarding" and stream.sent[-1].startswith(b"GET /b ")
    assert watch.timeout_now() == IDLE and _fresh(watch)


async def test_an_answers_end_with_a_pipelined_request_for_the_task_stamps() -> None:
    """The pipelined request goes elsewhere (the task opens its connection): the watch is
    stamped before the task takes over, or a sweep due before the task runs would cancel it,
    and the request handed over would be lost (answered as a keep-alive timeout)."""
    client = get("/a", "edge-1:9100") + get("/b", "edge-2:9100")
    path, watch = _forwarding(client, _Stream(_ANSWER), route("edge-2", ip="10.1.0.2"))
    path._advance()
    assert path._exit is not None and path._exit.done()
    assert [type(a) for a in path._exit.result()] == [OpenUpstream]
    assert _fresh(watch)


async def test_the_target_lost_mid_answer_stamps_before_the_task_closes() -> None:
    lost = StreamClosedError(ErrorCode.CANCEL, "reset")
    path, watch = _forwarding(get("/a", "edge-1:9100"), _Stream(_ANSWER[:-1], lost), _A)
    path._advance()
    assert path._exit is not None and [type(a) for a in path._exit.result()] == [Close]
    assert _fresh(watch)


async def test_a_client_that_stops_reading_is_left_to_the_task_stamped() -> None:
    path, watch = _forwarding(get("/a", "edge-1:9100"), _Stream(_ANSWER[:-1], b"k"), _A)
    cast(SocketStream, path.reader).write_paused = True
    path._advance()
    assert path._exit is not None and path._exit.result() == []
    assert _fresh(watch)


# -- the read after a request: only when the stream may hold something unread ----------------


def _answered_twice() -> tuple[_Connection, _Stream, _Transport]:
    """Two requests answered by callbacks, each answer's chunk read as it called back: the
    connection waits for a third request, its stream read empty since the first."""
    stream = _Stream(_ANSWER)
    path, _ = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    path._advance()  # the first answer
    sock = cast(SocketStream, path.reader)
    sock.data_received(get("/b", "edge-1:9100"))
    path._advance()  # the request goes out; the stream is read (what came before is unknown)
    stream.chunks.append(_ANSWER)
    path._on_upstream()  # its answer calls back
    assert path.ex.phase == "head" and path.waiting
    transport = cast(_Transport, sock.transport)
    assert transport.out[-1].endswith(b"ok") and len(transport.out) == 2
    return path, stream, transport


async def test_a_request_sent_after_every_chunk_was_read_reads_nothing() -> None:
    path, stream, _ = _answered_twice()
    reads = stream.reads
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert path.ex.phase == "forwarding" and stream.sent[-1].startswith(b"GET /c ")
    assert stream.reads == reads  # its answer calls back when it comes


def stray_count(path: CallbackPath) -> float:
    """``ravenproxy_server_upstream_stray_total{front="http"}`` of the path's context."""
    value = path.ctx.metrics.registry.get_sample_value(
        "ravenproxy_server_upstream_stray_total", {"front": "http"}
    )
    return value or 0.0


async def test_a_chunk_that_came_between_requests_lets_the_stream_go() -> None:
    """Bytes the target sent while no request was outstanding (the stream called back while
    the connection waited for one) answer nothing: were they read after the next request,
    they would be its answer's beginning (until 812de76 they were). The stream is let go at
    once, counted; the next request goes on a fresh one."""
    path, stream, transport = _answered_twice()
    stream.chunks.append(_ANSWER)
    path._on_upstream()  # between requests
    assert path.upstream is None and len(transport.out) == 2 and stray_count(path) == 1
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert path._exit is not None and path._exit.done()
    assert [type(a) for a in path._exit.result()] == [OpenUpstream]  # the task opens it
    assert len(transport.out) == 2 and not any(b"GET /c " in sent for sent in stream.sent)


async def test_a_chunk_that_called_back_from_inside_is_read_after_the_request() -> None:
    """A chunk whose callback came from inside another (the stream fed while the request was
    written) found the connection busy: it is read before the request's callback returns."""
    path, stream, transport = _answered_twice()

    def write_and_answer(data: bytes) -> int:
        stream.sent.append(bytes(data))
        stream.chunks.append(_ANSWER)
        path._on_upstream()  # busy: not served from here
        return len(data)

    stream.try_write = write_and_answer  # type: ignore[method-assign]
    cast(SocketStream, path.reader).data_received(get("/c", "edge-1:9100"))
    path._advance()
    assert len(transport.out) == 3 and transport.out[-1].endswith(b"ok")
    assert path.ex.phase == "head"


# -- counting: an answer's status once, as its head goes to the client ------------------------


async def test_answers_by_callbacks_count_each_final_status_once() -> None:
    """The status rides on the client write that carries the head (no action of its own): a
    head split from its body, and an interim 100 before it, count the final status once."""
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    head, body = _ANSWER[:-2], _ANSWER[-2:]
    path, _ = _forwarding(get("/a", "edge-1:9100"), _Stream(interim, head, body), _A)
    counted: list[int] = []
    path.proxy.count = counted.append  # type: ignore[assignment]  # each status it counts
    path._advance()
    assert path.ex.phase == "head" and counted == [200]
    transport = cast(_Transport, cast(SocketStream, path.reader).transport)
    assert b"".join(transport.out) == interim + _ANSWER
    stream = _Stream(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    path._hooked = cast(TunnelStream, stream)
    cast(SocketStream, path.reader).data_received(get("/b", "edge-1:9100"))
    path._advance()
    assert path.ex.phase == "head" and counted == [200, 404]


async def test_a_request_left_to_the_task_leaves_its_answer_unread() -> None:
    """No credit for the request: its rest goes to the task, and the callbacks stop there —
    the answer the stream holds already is the task's to read, after it sent the rest."""
    stream = _Stream(_ANSWER)
    path, _ = _forwarding(get("/a", "edge-1:9100"), stream, _A)
    path._advance()  # the first answer
    stream.chunks.append(_ANSWER)  # the next one, early
    stream.try_write = lambda data: 0  # type: ignore[method-assign]
    path._unread = True  # the stream may hold what came
    cast(SocketStream, path.reader).data_received(get("/b", "edge-1:9100"))
    reads = stream.reads
    path._advance()
    assert path._exit is not None and [type(a) for a in path._exit.result()] == [WriteUpstream]
    assert stream.reads == reads and stream.chunks == [_ANSWER]
