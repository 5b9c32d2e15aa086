"""Review of frontcut (a70c41f, 32d5354): the front's splice takes a client's small read as it
comes (:meth:`SocketStream.on_data`'s ``take``, :meth:`FrontSplice._offer`), and the splice's
per-chunk idle stamp is ``touch`` written out (``watch.last = watch.clock()``).

Differential, on real front sockets, under both event loops (uvloop: the server's; asyncio's),
plain TCP and TLS fronts: the new :class:`SocketStream` and :class:`FrontSplice` against
f667209's (``_F667209SocketStream`` below: f667209's ``data_received`` and ``on_data`` verbatim;
test_frontcut_take's ``_F667209FrontSplice``, f667209's verbatim but for its name, checked by
hand against /work/wt/base). Generated traffic: small reads one by one and in bursts, bulk,
answers, a target that stops reading (the upload waits for credit) and goes on, a client that
stops reading (the front pauses writing) and goes on, the client's half-close, its reset, the
target's reset, the tunnel aborted mid-stream, the credit probe's wait. Both must deliver the
same bytes in the same order and end the same way.

Besides: bytes the front read before the splice, ``initial_up`` and the client's next small
reads go up in that order; ``--idle-timeout`` is kept alive by small reads alone (the take's
stamp) and by answers alone (``_take``'s stamp), and fires when nothing moves, not early.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvloop
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.pki.authority import generate_ca, issue_server_cert
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_key
from ravenproxy.transport import front_splice
from ravenproxy.transport.bytestream import READ_LIMIT
from ravenproxy.transport.front_splice import FrontSplice
from ravenproxy.transport.lender import LEND_FROM
from ravenproxy.transport.relay import IDLE_ERROR, RelayResult
from ravenproxy.transport.session import SessionConfig, StreamClosedError, TunnelStream
from ravenproxy.transport.socket_stream import SocketStream
from ravenproxy.wire.config import WireConfig
from tests.unit.transport import test_frontcut_take
from tests.unit.transport.test_frontcut_take import _F667209FrontSplice
from tests.unit.transport.test_session import TARGET, WAIT, tunnel

# -- f667209's SocketStream reading side --------------------------------------------------------


class _F667209SocketStream(SocketStream):
    """The new SocketStream with f667209's ``data_received`` and ``on_data``, verbatim (no
    take: every read is buffered and called back)."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        self.pending = True
        if self._lend is True and len(data) >= LEND_FROM:
            self._start_lending()
        if not self._buffer:
            self._buffer = data  # the common case: no copy until a second chunk waits
        elif isinstance(self._buffer, bytearray):
            self._buffer += data
        else:
            self._buffer = bytearray(self._buffer) + data
        if not self._read_paused and len(self._buffer) > 2 * self._limit:
            assert self._transport is not None
            try:
                self._transport.pause_reading()
                self._read_paused = True
            except NotImplementedError:
                pass
        if self._read_waiter is not None:  # _wake_reader's check: a call a request spared
            self._wake_reader()
        # Loaded once, as an attribute: a bound method held in a slot and called as
        # ``self._on_data()`` is a LOAD_METHOD 3.11 leaves unspecialized (a chunk a request).
        callback = self._on_data
        if callback is not None:
            callback()

    def on_data(self, callback: Callable[[], None] | None) -> None:  # type: ignore[override]
        """Serve the reading side by callbacks: ``callback`` runs when bytes, the EOF or the
        loss of the connection arrive (after they are buffered); it takes them with
        :meth:`read_nowait`. None: stop."""
        self._on_data = callback


KINDS: dict[str, tuple[type[SocketStream], type[Any]]] = {
    "f667209": (_F667209SocketStream, _F667209FrontSplice),
    "new": (SocketStream, FrontSplice),
}
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}
WINDOW = 64 * 1024
"""The target's stream window: a stalled target stops the client's upload soon."""
PROBE = 0.2
"""CREDIT_PROBE while these run (2 s in the code): the probe's wait in a few tenths."""


@contextlib.contextmanager
def _short_probe() -> Iterator[None]:
    saved = front_splice.CREDIT_PROBE, test_frontcut_take.CREDIT_PROBE
    front_splice.CREDIT_PROBE = test_frontcut_take.CREDIT_PROBE = PROBE  # type: ignore[misc]
    try:
        yield
    finally:
        front_splice.CREDIT_PROBE, test_frontcut_take.CREDIT_PROBE = saved  # type: ignore[misc]


@dataclass
class Tls:
    server: ssl.SSLContext
    client: ssl.SSLContext


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    path = tmp_path_factory.mktemp("review28-front")
    ca, key = generate_ca("review28-front-ca")
    cert, cert_key = issue_server_cert(ca, key, ["front"])
    write_pem_cert(path / "ca.crt", ca)
    write_pem_cert(path / "s.crt", cert)
    write_pem_key(path / "s.key", cert_key)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(path / "s.crt", path / "s.key")
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(path / "ca.crt")
    return Tls(server, client)


def _run(loop: str, make: Callable[[], Any]) -> Any:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(make())


# -- a front, its client and its target ----------------------------------------------------------


@dataclass
class Target:
    """The agent's end of the stream: reads what comes up while ``reading`` is set."""

    up: bytearray = field(default_factory=bytearray)
    eof: bool = False
    closed: bool = False
    reading: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    stream: asyncio.Future[TunnelStream] | None = None

    async def serve(self, stream: TunnelStream) -> None:
        stream.accept()
        assert self.stream is not None
        self.stream.set_result(stream)
        try:
            while True:
                await self.reading.wait()
                data = await stream.read()
                if not data:
                    self.eof = True
                    break
                self.up.extend(data)
            await self.release.wait()  # open for what goes down after the client's EOF
        except StreamClosedError:
            self.closed = True


@dataclass
class Front:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    sock: SocketStream
    splice: Any
    task: asyncio.Task[RelayResult]
    target: Target
    stream: TunnelStream
    pair: Any

    async def result(self, wait: float = WAIT) -> RelayResult:
        return await asyncio.wait_for(asyncio.shield(self.task), wait)


async def _until(check: Callable[[], bool], what: str, wait: float = WAIT) -> None:
    deadline = time.monotonic() + wait
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {wait}s: {what}")
        await asyncio.sleep(0.002)


@contextlib.asynccontextmanager
async def _front(
    kind: str,
    tls: Tls | None,
    *,
    idle_timeout: float | None = None,
    before: bytes = b"",
    initial_up: bytes = b"",
) -> AsyncIterator[Front]:
    """A client at a front (its SocketStream, ``kind``'s), spliced by ``kind``'s FrontSplice to
    a tunnel stream whose target reads while told to. ``before``: sent by the client and
    buffered by the front before the splice starts; ``initial_up``: read before it too (a
    CONNECT's pipelined bytes)."""
    sock_class, splice_class = KINDS[kind]
    loop = asyncio.get_running_loop()
    accepted: asyncio.Queue[SocketStream] = asyncio.Queue()

    def made() -> SocketStream:
        sock = sock_class(READ_LIMIT)
        accepted.put_nowait(sock)
        return sock

    target = Target()
    target.reading.set()
    target.stream = loop.create_future()
    config = SessionConfig(wire=WireConfig(initial_stream_window=WINDOW, max_stream_window=WINDOW))
    server = await loop.create_server(
        made, "127.0.0.1", 0, ssl=tls.server if tls is not None else None
    )
    writer: asyncio.StreamWriter | None = None
    task: asyncio.Task[RelayResult] | None = None
    try:
        async with tunnel(target.serve, edge_config=config, cloud_config=config) as pair:
            port = server.sockets[0].getsockname()[1]
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    "127.0.0.1",
                    port,
                    ssl=tls.client if tls is not None else None,
                    server_hostname="front" if tls is not None else None,
                    limit=16 * 1024,  # a client that stops reading stops the front soon
                ),
                WAIT,
            )
            sock = await asyncio.wait_for(accepted.get(), WAIT)
            assert type(sock) is sock_class
            if before:
                writer.write(before)
                await writer.drain()
                await _until(lambda: sock.pending, "the front buffers the early bytes")
            stream = await asyncio.wait_for(pair.cloud.open_stream(TARGET), WAIT)
            splice = splice_class(sock, idle_timeout)
            splice.splice(stream, initial_up)
            task = asyncio.create_task(splice.wait())
            agent_side = await asyncio.wait_for(target.stream, WAIT)
            try:
                yield Front(reader, writer, sock, splice, task, target, agent_side, pair)
            finally:
                target.release.set()
    finally:
        if writer is not None:
            writer.transport.abort()
        if task is not None:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        server.close()
        await server.wait_closed()


def _reset(writer: asyncio.StreamWriter) -> None:
    raw = writer.get_extra_info("socket")
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# -- generated traffic, both kinds -------------------------------------------------------------

Op = tuple[Any, ...]
_OPS = st.one_of(
    st.tuples(st.just("up"), st.integers(1, 3000)),
    st.tuples(st.just("burst"), st.integers(2, 30)),
    st.tuples(st.just("bulk"), st.integers(LEND_FROM, 3 * LEND_FROM)),
    st.tuples(st.just("down"), st.integers(1, 3000)),
    st.tuples(st.just("flood"), st.integers(256 * 1024, 1024 * 1024)),
    st.tuples(
        st.sampled_from(
            ["stall", "go", "cstop", "cgo", "wait", "upeof", "reset", "treset", "abort"]
        )
    ),
)
ENDS = ("reset", "treset", "abort")
"""Ops after which the connection is gone: bytes after them need not arrive."""


async def _traffic(kind: str, tls: Tls | None, ops: list[Op]) -> tuple[Any, ...]:
    """What the target got, what the client got, how the splice ended (compared between the
    kinds), after ``ops``."""
    async with _front(kind, tls) as f:
        target = f.target
        sent = bytearray()
        down = bytearray()
        received = bytearray()
        client_reading = asyncio.Event()
        client_reading.set()
        shut = ended = False

        async def client_reads() -> None:
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                while True:
                    await client_reading.wait()
                    data = await f.reader.read(1 << 16)
                    if not data:
                        return
                    received.extend(data)

        def send(data: bytes) -> None:
            sent.extend(data)
            f.writer.write(data)

        async def drained() -> None:
            with contextlib.suppress(ConnectionError):
                await asyncio.wait_for(f.writer.drain(), WAIT)

        downs: asyncio.Queue[bytes] = asyncio.Queue()

        async def target_writes() -> None:
            # One writer, in order (writes from tasks of their own may pass each other).
            with contextlib.suppress(StreamClosedError):
                while True:
                    chunk = await downs.get()
                    try:
                        await f.stream.write(chunk)
                    finally:
                        downs.task_done()

        reading = asyncio.create_task(client_reads())
        writes = [asyncio.create_task(target_writes())]
        for op in ops:
            what = op[0]
            if what in ("up", "bulk") and not shut and not ended:
                send(bytes([len(sent) % 251]) * op[1])
                await drained()
            elif what == "burst" and not shut and not ended:
                for _ in range(op[1]):  # back to back: read one by one or merged
                    send(bytes([len(sent) % 251]) * 7)
                await drained()
            elif what in ("down", "flood") and not ended:
                chunk = bytes([len(down) % 251]) * op[1]
                down.extend(chunk)
                downs.put_nowait(chunk)
            elif what == "stall":
                target.reading.clear()
            elif what == "go":
                target.reading.set()
            elif what == "cstop":
                client_reading.clear()
            elif what == "cgo":
                client_reading.set()
            elif what == "upeof" and not shut and not ended and tls is None:
                f.writer.write_eof()
                shut = True
            elif what == "reset" and not ended:
                _reset(f.writer)
                ended = True
            elif what == "treset" and not ended:
                f.stream.reset()
                ended = True
            elif what == "abort" and not ended:
                f.stream.session.ws.transport.abort()
                ended = True
            await asyncio.sleep(0.003 if what != "wait" else PROBE * 1.5)
        target.reading.set()
        client_reading.set()
        if not ended:
            await _until(
                lambda: len(target.up) >= len(sent) and len(received) >= len(down),
                "everything arrives",
            )
            if not shut:
                if tls is None:
                    f.writer.write_eof()
                else:
                    f.writer.close()  # TLS: close_notify, no half-close
            await _until(lambda: target.eof, "the client's EOF goes up")
            await asyncio.wait_for(downs.join(), WAIT)
            with contextlib.suppress(StreamClosedError):
                f.stream.write_eof()
        result = await f.result()
        for task in writes:
            task.cancel()
        await asyncio.gather(*writes, return_exceptions=True)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(reading, WAIT if not ended else 0.5)
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        up = bytes(target.up)
        assert up == bytes(sent[: len(up)])  # in order, nothing made up, whatever the end
        assert bytes(received) == bytes(down[: len(received)])
        if ended:
            assert result.error
            return ("ended", True, bool(result.error), result.idle)
        assert up == bytes(sent)
        assert bytes(received) == bytes(down)
        assert result.error == "", result.error
        return (
            "clean",
            len(up),
            len(received),
            result.bytes_up,
            result.bytes_down,
            result.error,
            result.idle,
        )


def _both(loop: str, tls: Tls | None, ops: list[Op]) -> None:
    async def both() -> tuple[Any, Any]:
        with _short_probe():
            return await _traffic("f667209", tls, ops), await _traffic("new", tls, ops)

    old, new = _run(loop, both)
    assert new == old


_EXAMPLES = [
    [("up", 5), ("burst", 20), ("down", 7), ("up", 1)],
    [("stall",), ("bulk", 3 * LEND_FROM), ("burst", 10), ("up", 3), ("wait",), ("go",)],
    [("stall",), ("bulk", 2 * LEND_FROM), ("up", 5), ("upeof",), ("go",)],
    [("cstop",), ("flood", 1024 * 1024), ("burst", 30), ("up", 2000), ("cgo",)],
    [("burst", 5), ("abort",), ("up", 3)],
    [("stall",), ("bulk", LEND_FROM), ("up", 4), ("treset",), ("up", 3)],
    [("up", 3), ("upeof",), ("down", 4), ("wait",)],
    [("cstop",), ("flood", 600_000), ("stall",), ("bulk", LEND_FROM), ("up", 1), ("reset",)],
]


def _examples(test: Callable[..., None]) -> Callable[..., None]:
    for ops in _EXAMPLES:
        test = example(ops)(test)
    return test


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@_examples
@given(st.lists(_OPS, min_size=1, max_size=10))
def test_a_plain_front_passes_on_as_f667209s(loop: str, ops: list[Op]) -> None:
    _both(loop, None, ops)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@_examples
@given(st.lists(_OPS, min_size=1, max_size=10))
def test_a_tls_front_passes_on_as_f667209s(loop: str, tls: Tls, ops: list[Op]) -> None:
    _both(loop, tls, ops)


# -- what was read before the splice, and what comes right after --------------------------------


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("kind", ["f667209", "new"])
@pytest.mark.parametrize("stalled", [False, True])
def test_early_bytes_initial_up_and_the_next_small_reads_go_up_in_order(
    loop: str, secure: bool, kind: str, stalled: bool, tls: Tls
) -> None:
    """Bytes the front buffered before the splice (a client that did not wait for the 200),
    then ``initial_up`` (pipelined after the CONNECT's head), then small reads one by one:
    the target gets ``initial_up``, the early bytes, the small reads, in that order (as the
    splice starts: initial_up, then what the socket holds). ``stalled``: the early bytes are
    more than the window and the target reads nothing at first, so the small reads come while
    the sender waits for credit."""
    early = (b"E" * (3 * WINDOW)) if stalled else b"early"

    async def run() -> bytes:
        async with _front(kind, tls if secure else None, before=early, initial_up=b"I") as f:
            if stalled:
                f.target.reading.clear()
            smalls = [b"s%03d" % i for i in range(40)]
            for small in smalls:
                f.writer.write(small)
                await f.writer.drain()
                await asyncio.sleep(0.001)
            f.target.reading.set()
            want = b"I" + early + b"".join(smalls)
            await _until(lambda: len(f.target.up) >= len(want), "all up")
            assert bytes(f.target.up) == want
            if secure:
                f.writer.close()
            else:
                f.writer.write_eof()
            await _until(lambda: f.target.eof, "the EOF up")
            f.stream.write_eof()
            result = await f.result()
            assert result.error == ""
            assert result.bytes_up == len(want)
            return bytes(f.target.up)

    _run(loop, run)


# -- the idle clock --------------------------------------------------------------------------------

IDLE = 0.4


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("kind", ["f667209", "new"])
@pytest.mark.parametrize("way", ["up", "down"])
def test_small_reads_or_answers_alone_keep_the_idle_timeout_off(
    loop: str, kind: str, way: str
) -> None:
    """A byte every IDLE/4 for 3 * IDLE, one way only (``up``: the client's small reads, which
    the new code takes as they come and stamps in ``_offer``; ``down``: the target's, stamped
    in ``_take``): never idle; then nothing moves and it goes idle, not before IDLE."""

    async def run() -> tuple[bool, float]:
        async with _front(kind, None, idle_timeout=IDLE) as f:
            loop_ = asyncio.get_running_loop()
            end = loop_.time() + 3 * IDLE
            got = 0
            last = 0.0
            while loop_.time() < end:
                if way == "up":
                    f.writer.write(b"u")
                    await f.writer.drain()
                else:
                    await f.stream.write(b"d")
                last = loop_.time()
                await asyncio.sleep(IDLE / 4)
                assert not f.task.done(), f"went idle at a byte every {IDLE / 4}s ({way})"
                got += 1
            if way == "up":
                await _until(lambda: len(f.target.up) == got, "the bytes up")
            else:
                await _until(lambda: len(f.reader._buffer) == got, "the bytes down")  # type: ignore[attr-defined]
            result = await f.result()
            return result.idle and result.error == IDLE_ERROR, loop_.time() - last

    idle, after = _run(loop, run)
    assert idle
    assert IDLE - 0.02 <= after <= IDLE + IDLE / 8 + 0.5, after


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_the_idle_timeout_fires_after_a_small_request_not_before(loop: str) -> None:
    """One small request taken as it came, its answer, then nothing: idle after IDLE from the
    answer (the last stamp), on the new code as on f667209's."""

    async def run(kind: str) -> float:
        async with _front(kind, None, idle_timeout=IDLE) as f:
            f.writer.write(b"GET / HTTP/1.1\r\n\r\n")
            await f.writer.drain()
            await _until(lambda: len(f.target.up) == 18, "the request up")
            await f.stream.write(b"HTTP/1.1 200 OK\r\n\r\n")
            assert await asyncio.wait_for(f.reader.readexactly(19), WAIT)
            start = time.monotonic()
            result = await f.result()
            assert result.idle and result.error == IDLE_ERROR
            return time.monotonic() - start

    for kind in KINDS:
        after = _run(loop, lambda kind=kind: run(kind))
        assert IDLE - 0.03 <= after <= IDLE + IDLE / 8 + 0.5, (kind, after)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("kind", ["f667209", "new"])
def test_small_reads_while_a_bulk_upload_trickles_up_go_after_it(loop: str, kind: str) -> None:
    """A bulk upload (by the sender, waiting for credit) that a slow target drains window by
    window, while the client keeps sending small pieces: each arrives while the sender waits,
    and credit comes in the same turns as the client's reads; the pieces must go up after the
    bulk, in order (not taken by try_write ahead of the sender when credit comes)."""

    async def run() -> None:
        async with _front(kind, None) as f:
            target = f.target
            target.reading.clear()
            bulk = bytes(range(251)) * (6 * WINDOW // 251)
            f.writer.write(bulk)
            await f.writer.drain()
            await asyncio.sleep(0.02)
            target.reading.set()
            pieces = b"".join(b"<%05d>" % i for i in range(3000))
            for at in range(0, len(pieces), 70):
                f.writer.write(pieces[at : at + 70])
                await f.writer.drain()
                await asyncio.sleep(0)
            want = bulk + pieces
            await _until(lambda: len(target.up) >= len(want), "all up")
            assert bytes(target.up) == want
            f.writer.write_eof()
            await _until(lambda: target.eof, "the EOF up")
            f.stream.write_eof()
            result = await f.result()
            assert result.error == ""
            assert result.bytes_up == len(want)

    _run(loop, run)
