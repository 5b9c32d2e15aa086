"""Sessions over a real WebSocket pair on loopback (no TLS): streams, errors, keepalive, tasks."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from ravenproxy.transport import ws_client
from ravenproxy.transport.flag import Flag
from ravenproxy.transport.session import (
    OpenError,
    Session,
    SessionConfig,
    StreamClosedError,
    StreamHandler,
    TunnelStream,
)
from ravenproxy.transport.websocket import MAX_READ
from ravenproxy.transport.ws_client import TunnelClientConnection
from ravenproxy.transport.ws_server import TunnelServerConnection
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.frames import (
    Data,
    Frame,
    GoAway,
    Ping,
    Settings,
    Target,
    decode_message,
    encode,
)

TARGET = Target("edge-1", "127.0.0.1", 10250)
WAIT = 5.0


@dataclass
class Pair:
    """``cloud`` (server_side=True) opens streams; ``edge`` (server_side=False) serves them."""

    cloud: Session
    edge: Session
    cloud_ws: ServerConnection
    edge_ws: TunnelClientConnection
    cloud_run: asyncio.Future[None]
    edge_run: asyncio.Task[None]


async def echo(stream: TunnelStream) -> None:
    stream.accept()
    while data := await stream.read():
        await stream.write(data)
    stream.write_eof()
    # Stay until the opener is done with the stream, so the close is theirs.
    with contextlib.suppress(StreamClosedError):
        await stream.read()


@contextlib.asynccontextmanager
async def tunnel(
    on_open: StreamHandler | None = echo,
    cloud_config: SessionConfig | None = None,
    edge_config: SessionConfig | None = None,
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
) -> AsyncIterator[Pair]:
    """``tls``: the server's and the client's contexts (plain TCP without)."""
    loop = asyncio.get_running_loop()
    cloud_session: asyncio.Future[tuple[Session, ServerConnection]] = loop.create_future()
    cloud_run: asyncio.Future[None] = loop.create_future()

    async def handler(ws: ServerConnection) -> None:
        session = Session(ws, server_side=True, config=cloud_config, name="cloud")
        cloud_session.set_result((session, ws))
        try:
            await session.run()
        finally:
            if not cloud_run.done():
                cloud_run.set_result(None)

    server = await serve(
        handler,
        "127.0.0.1",
        0,
        compression=None,
        ping_interval=None,
        create_connection=TunnelServerConnection,
        ssl=tls[0] if tls else None,
    )
    edge_run: asyncio.Task[None] | None = None
    edge_ws: TunnelClientConnection | None = None
    try:
        port = server.sockets[0].getsockname()[1]
        edge_ws = await ws_client.connect(
            f"{'wss' if tls else 'ws'}://127.0.0.1:{port}", ssl=tls[1] if tls else None
        )
        edge = Session(edge_ws, server_side=False, config=edge_config, on_open=on_open, name="edge")
        edge_run = asyncio.create_task(edge.run(), name="test-edge-session")
        cloud, cloud_ws = await asyncio.wait_for(cloud_session, WAIT)
        await asyncio.wait_for(asyncio.gather(cloud.wait_ready(), edge.wait_ready()), WAIT)
        yield Pair(cloud, edge, cloud_ws, edge_ws, cloud_run, edge_run)
    finally:
        if edge_ws is not None:
            await edge_ws.close()
        if edge_run is not None:
            await asyncio.wait_for(edge_run, WAIT)
        server.close()
        await asyncio.wait_for(server.wait_closed(), WAIT)


async def read_all(stream: TunnelStream) -> bytes:
    chunks = []
    while data := await stream.read():
        chunks.append(data)
    return b"".join(chunks)


async def test_open_echo_and_half_close() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert stream.target == TARGET
        await stream.write(b"hello")
        assert await asyncio.wait_for(stream.read(), WAIT) == b"hello"
        # Half-close: our EOF reaches the echo handler, whose EOF comes back after its data.
        await stream.write(b" world")
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b" world"
        assert stream.bytes_out == 11
        assert stream.bytes_in == 11
        stream.close()


async def test_bulk_data_both_ways_with_flow_control() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB: more than the initial 256 KiB window
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)

        async def send() -> None:
            await stream.write(payload)
            stream.write_eof()

        sender = asyncio.create_task(send())
        received = await asyncio.wait_for(read_all(stream), WAIT)
        await asyncio.wait_for(sender, WAIT)
        assert received == payload
        stream.close()


async def test_many_concurrent_streams() -> None:
    async with tunnel() as t:

        async def one(i: int) -> bytes:
            stream = await t.cloud.open_stream(TARGET)
            try:
                await stream.write(f"stream {i}".encode())
                stream.write_eof()
                return await read_all(stream)
            finally:
                stream.close()

        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(20))), WAIT)
        assert results == [f"stream {i}".encode() for i in range(20)]
        assert t.cloud.streams == {}


async def test_edge_handler_writes_first_and_closes() -> None:
    async def greeter(stream: TunnelStream) -> None:
        stream.accept()
        await stream.write(b"greetings from " + stream.target.node.encode())
        stream.write_eof()
        assert await stream.read() == b""

    async with tunnel(on_open=greeter) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"greetings from edge-1"
        stream.write_eof()
        stream.close()


async def test_reject_with_a_code_is_an_open_error() -> None:
    async def refuse(stream: TunnelStream) -> None:
        stream.reject(ErrorCode.REFUSED, "not in the allowlist")

    async with tunnel(on_open=refuse) as t:
        with pytest.raises(OpenError) as info:
            await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert info.value.code is ErrorCode.REFUSED
        assert info.value.message == "not in the allowlist"
        assert t.cloud.streams == {}


async def test_no_handler_refuses_streams() -> None:
    async with tunnel(on_open=None) as t:
        with pytest.raises(OpenError) as info:
            await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert info.value.code is ErrorCode.REFUSED


async def test_failing_handler_resets_the_stream() -> None:
    async def broken(stream: TunnelStream) -> None:
        stream.accept()
        raise RuntimeError("boom")

    async with tunnel(on_open=broken) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        with pytest.raises(StreamClosedError) as info:
            await asyncio.wait_for(stream.read(), WAIT)
        assert info.value.code is ErrorCode.INTERNAL_ERROR


async def test_open_timeout_when_the_peer_never_answers() -> None:
    answered = asyncio.Event()

    async def silent(stream: TunnelStream) -> None:
        await answered.wait()

    async with tunnel(on_open=silent, cloud_config=SessionConfig(open_timeout=0.3)) as t:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(OpenError) as info:
            await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert info.value.code is ErrorCode.OPEN_TIMEOUT
        assert 0.25 < loop.time() - started < 2
        assert t.cloud.streams == {}
        # Only the stream failed: the tunnel itself stays up.
        assert not t.cloud.closed
        answered.set()


async def test_open_timeout_argument_overrides_the_config() -> None:
    async def silent(stream: TunnelStream) -> None:
        await asyncio.Event().wait()

    async with tunnel(on_open=silent) as t:
        with pytest.raises(OpenError) as info:
            await asyncio.wait_for(t.cloud.open_stream(TARGET, timeout=0.1), WAIT)
        assert info.value.code is ErrorCode.OPEN_TIMEOUT


async def test_closing_the_websocket_fails_open_streams() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        reader = asyncio.create_task(stream.read())
        await asyncio.sleep(0.01)
        await t.edge_ws.close()
        with pytest.raises(StreamClosedError) as info:
            await asyncio.wait_for(reader, WAIT)
        assert info.value.code is ErrorCode.CONNECTION_LOST
        await asyncio.wait_for(t.cloud_run, WAIT)
        assert t.cloud.closed
        assert t.cloud.close_reason
        with pytest.raises(StreamClosedError) as info:
            await stream.write(b"late")
        assert info.value.code is ErrorCode.CONNECTION_LOST
        with pytest.raises(OpenError) as info:
            await t.cloud.open_stream(TARGET)
        assert info.value.code is ErrorCode.CONNECTION_LOST


async def test_session_close_names_its_reason() -> None:
    async with tunnel() as t:
        await t.cloud.close("server shutting down")
        await asyncio.wait_for(t.cloud_run, WAIT)
        await asyncio.wait_for(t.edge_run, WAIT)
        assert t.cloud.close_reason == "server shutting down"
        assert t.edge.closed and t.edge.close_reason


async def test_peer_close_reason_is_recorded() -> None:
    async with tunnel() as t:
        await t.cloud.close("server shutting down")
        await asyncio.wait_for(t.edge_run, WAIT)
        assert "1001" in t.edge.close_reason
        assert "server shutting down" in t.edge.close_reason


async def test_goaway_stops_new_streams_but_not_open_ones() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        t.edge.goaway("draining")
        for _ in range(100):
            if t.cloud.conn.goaway_received is not None:
                break
            await asyncio.sleep(0.01)
        assert t.cloud.conn.goaway_received is not None
        with pytest.raises(OpenError) as info:
            await t.cloud.open_stream(TARGET)
        assert info.value.code is ErrorCode.GOING_AWAY
        await stream.write(b"still here")
        assert await asyncio.wait_for(stream.read(), WAIT) == b"still here"
        stream.close()


async def test_keepalive_keeps_a_quiet_but_live_tunnel_open() -> None:
    fast = SessionConfig(ping_interval=0.1, dead_after=0.35)
    async with tunnel(cloud_config=fast, edge_config=fast) as t:
        await asyncio.sleep(0.8)
        assert not t.cloud.closed
        assert not t.edge.closed


async def test_keepalive_closes_when_the_peer_goes_silent() -> None:
    fast = SessionConfig(ping_interval=0.1, dead_after=0.35)
    async with tunnel(cloud_config=fast) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        # Nothing the edge sends arrives any more: to the cloud, the edge fell silent.
        t.cloud_ws.transport.pause_reading()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(t.cloud_run, WAIT)
        assert 0.2 < loop.time() - started < 2
        assert t.cloud.close_reason.startswith("peer silent")
        with pytest.raises(StreamClosedError) as info:
            await stream.read()
        assert info.value.code is ErrorCode.CONNECTION_LOST
        assert "peer silent" in info.value.message


async def test_a_ping_is_answered_at_once_on_an_idle_tunnel() -> None:
    """Not with the next keepalive (10 s by default): protocol sections 4.7 and 11."""
    async with tunnel() as t:
        initial = t.edge.conn.rtt
        t.edge.conn.ping()
        t.edge._flush()
        async with asyncio.timeout(2):
            while t.edge.conn.rtt == initial:  # changes when the ack arrives
                await asyncio.sleep(0.005)
        assert t.edge.conn.rtt < 0.5


async def test_a_peer_that_floods_and_never_reads_is_paused_then_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every PING asks for an answer; a peer that never reads them is read no further once
    the unsent answers pass the bound, and closed with ENHANCE_YOUR_CALM after the grace."""
    bound = 64 * 1024
    SMALL = 64 * 1024
    config = SessionConfig(wire=WireConfig(max_control_pending=bound), flood_grace=0.5)
    loop = asyncio.get_running_loop()
    cloud: asyncio.Future[Session] = loop.create_future()
    cloud_done: asyncio.Future[None] = loop.create_future()
    most_pending = 0

    async def handler(ws: ServerConnection) -> None:
        # Small socket buffers: the flood stalls after kilobytes, not after megabytes.
        ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
        session = Session(ws, server_side=True, config=config, name="cloud")
        cloud.set_result(session)
        try:
            await session.run()
        finally:
            cloud_done.set_result(None)

    async def watch(session: Session) -> None:
        nonlocal most_pending
        while not cloud_done.done():
            most_pending = max(most_pending, session.conn.control_pending)
            await asyncio.sleep(0.001)

    async with serve(
        handler,
        "127.0.0.1",
        0,
        compression=None,
        ping_interval=None,
        create_connection=TunnelServerConnection,
    ) as server:
        port = server.sockets[0].getsockname()[1]
        # max_queue=1: the client's WebSocket stops reading the socket as soon as one message
        # waits, and this test never asks it for one until the end.
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL)
        sock.connect(("127.0.0.1", port))
        async with connect(
            f"ws://127.0.0.1:{port}", sock=sock, compression=None, ping_interval=None, max_queue=1
        ) as flooder:
            await flooder.send(encode(Settings(())))
            session = await asyncio.wait_for(cloud, WAIT)
            watcher = asyncio.create_task(watch(session))
            pings = b"".join(encode(Ping(i.to_bytes(8, "big"))) for i in range(64 * 1024 // 20))
            sent, stalled = 0, False
            while sent < 256 * 1024 * 1024 and not cloud_done.done():
                try:
                    await asyncio.wait_for(flooder.send(pings), 1.0)
                except TimeoutError:
                    stalled = True
                    break
                except ConnectionClosed:
                    break
                sent += len(pings)
            assert stalled, f"the server read all {sent} bytes"
            async with asyncio.timeout(WAIT):
                while "peer floods control frames, closing" not in caplog.text:
                    await asyncio.sleep(0.01)
            # Given up on: now read what did go out, up to the GOAWAY and the close.
            messages: list[bytes] = []
            with contextlib.suppress(ConnectionClosed):
                async for message in flooder:  # decoded later: keep up with the server
                    assert isinstance(message, bytes)
                    messages.append(message)
            assert flooder.close_code == 1008
            await asyncio.wait_for(cloud_done, WAIT)
            await watcher
            assert session.error is ErrorCode.ENHANCE_YOUR_CALM
            assert session.close_reason.startswith("protocol error ENHANCE_YOUR_CALM")
            # Paused at the bound, give or take the answers to one message.
            assert most_pending <= bound + len(pings)
    frames: list[Frame] = [f for m in messages for f in decode_message(m, 16 * 1024 * 1024)]
    goaways = [f for f in frames if isinstance(f, GoAway)]
    assert [g.code for g in goaways] == [ErrorCode.ENHANCE_YOUR_CALM]


async def test_a_peer_that_reads_again_in_time_gets_every_answer_and_stays() -> None:
    """Reading pauses while the unsent answers are over the bound, the rest of the read round
    held back; once the peer reads again they go out, what was held back is taken, and every
    PING is answered, in order, on a tunnel still open."""
    bound = 16 * 1024
    SMALL = 32 * 1024
    config = SessionConfig(wire=WireConfig(max_control_pending=bound), flood_grace=30)
    loop = asyncio.get_running_loop()
    cloud: asyncio.Future[Session] = loop.create_future()
    cloud_done: asyncio.Future[None] = loop.create_future()
    held = 0

    async def handler(ws: ServerConnection) -> None:
        for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, option, SMALL)
        session = Session(ws, server_side=True, config=config, name="cloud")
        cloud.set_result(session)
        try:
            await session.run()
        finally:
            cloud_done.set_result(None)

    async def watch(session: Session) -> None:
        nonlocal held
        while not cloud_done.done():
            if session._held is not None:
                held += 1
            await asyncio.sleep(0.001)

    async with serve(
        handler,
        "127.0.0.1",
        0,
        compression=None,
        ping_interval=None,
        create_connection=TunnelServerConnection,
    ) as server:
        port = server.sockets[0].getsockname()[1]
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL)
        sock.connect(("127.0.0.1", port))
        async with connect(
            f"ws://127.0.0.1:{port}", sock=sock, compression=None, ping_interval=None, max_queue=1
        ) as peer:
            await peer.send(encode(Settings(())))
            session = await asyncio.wait_for(cloud, WAIT)
            watcher = asyncio.create_task(watch(session), name="test-watch-held")
            count = 100_000

            async def send_pings() -> None:
                for first in range(0, count, 2000):
                    pings = [encode(Ping(i.to_bytes(8, "big"))) for i in range(first, first + 2000)]
                    await peer.send(b"".join(pings))

            sender = asyncio.create_task(send_pings(), name="test-send-pings")
            try:
                async with asyncio.timeout(WAIT):  # the peer reads nothing meanwhile
                    while not held:
                        await asyncio.sleep(0.01)
            except TimeoutError:
                sender.cancel()
                raise
            acks: list[bytes] = []
            async with asyncio.timeout(WAIT):
                while len(acks) < count:
                    message = await peer.recv()
                    assert isinstance(message, bytes)
                    for frame in decode_message(message, 16 * 1024 * 1024):
                        if isinstance(frame, Ping) and frame.ack:
                            acks.append(frame.payload)
            await asyncio.wait_for(sender, WAIT)
            assert acks == [i.to_bytes(8, "big") for i in range(count)]
            assert not session.closed and session.error is None
        await asyncio.wait_for(cloud_done, WAIT)
        await watcher


async def test_no_tasks_left_after_run_returns() -> None:
    before = asyncio.all_tasks()
    blocked = asyncio.Event()

    async def hang(stream: TunnelStream) -> None:
        stream.accept()
        await blocked.wait()

    async with tunnel(on_open=hang) as t:
        streams = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(3)]
        session_tasks = {
            task
            for task in asyncio.all_tasks()
            if (task.get_name() or "").startswith(("tunnel-", "stream:"))
        }
        assert len([x for x in session_tasks if x.get_name().startswith("stream:edge")]) == 3
        await t.edge_ws.close()
        await asyncio.wait_for(t.edge_run, WAIT)
        await asyncio.wait_for(t.cloud_run, WAIT)
        assert all(s.closed for s in streams)
        assert t.edge.streams == {} and t.cloud.streams == {}
        await asyncio.sleep(0)
        assert all(task.done() for task in session_tasks)
    await asyncio.sleep(0)
    leftover = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert not [task for task in leftover if not task.done()], leftover


async def test_messages_are_taken_in_the_read_callback_not_by_waking_the_reader() -> None:
    """The cloud's reader task waits on one future while an echo stream carries 20 small
    messages, each after the tunnel went idle: the read callback took them (a reader woken per
    read round waited on a new future each time)."""
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await asyncio.sleep(0.01)
        waiting = t.cloud_ws._rd.waiter
        assert waiting is not None and not waiting.done()
        for _ in range(20):
            await asyncio.sleep(0.005)
            await stream.write(b"GET / HTTP/1.1\r\n\r\n")
            assert await asyncio.wait_for(stream.read(), WAIT) == b"GET / HTTP/1.1\r\n\r\n"
        assert t.cloud_ws._rd.waiter is waiting and not waiting.done()
        stream.close()


async def test_a_burst_is_taken_one_read_round_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight streams send 4 MiB at once: the cloud takes the messages in batches of one read
    round each (the largest read and the message it completes, at most), with the loop
    running other work between them, not all at once."""
    loop = asyncio.get_running_loop()
    turns = 0
    stop = False

    def tick() -> None:
        nonlocal turns
        turns += 1
        if not stop:
            loop.call_soon(tick)

    batches: list[tuple[int, int]] = []  # (loop turn, bytes) of each read round taken
    real = Session._on_messages

    def recording(self: Session, batch: list[bytes | memoryview]) -> None:
        if self.name == "cloud":
            batches.append((turns, sum(len(m) for m in batch)))
        real(self, batch)

    monkeypatch.setattr(Session, "_on_messages", recording)

    async def blast(stream: TunnelStream) -> None:
        stream.accept()
        for _ in range(512):
            await stream.write(b"x" * 1024)
        stream.write_eof()
        with contextlib.suppress(StreamClosedError):
            await stream.read()

    async with tunnel(on_open=blast) as t:
        streams = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(8)]
        batches.clear()
        tick()
        try:
            got = await asyncio.wait_for(asyncio.gather(*(read_all(s) for s in streams)), WAIT)
        finally:
            stop = True
        assert [len(g) for g in got] == [512 * 1024] * 8
        for stream in streams:
            stream.close()
    largest = MAX_READ + t.cloud.config.wire.max_message_size
    assert max(size for _, size in batches) <= largest
    assert batches[-1][0] > batches[0][0], batches  # other work ran in between


async def test_a_message_of_several_data_frames_reaches_each_stream_in_order() -> None:
    """A read round's message holding DATA frames for two streams (the peer's writer batched
    them, as under load), one stream twice: each frame reaches its stream, in order; a frame
    for a stream the session already let go of returns its credit at once. Then a message
    with a PING between two DATA frames: the general path, the same chunks."""
    served: list[TunnelStream] = []

    async def hold(stream: TunnelStream) -> None:
        stream.accept()
        served.append(stream)
        with contextlib.suppress(StreamClosedError):
            await asyncio.Event().wait()

    async with tunnel(on_open=hold) as t:
        opened = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(3)]
        while len(served) < 3:
            await asyncio.sleep(0.001)
        first, second, gone = (s.id for s in served)
        t.edge.streams.pop(gone)  # let go by the session, still open in the wire state
        conn_recv = t.edge.conn._conn_recv
        unacked = conn_recv.unacked

        def data(sid: int, payload: bytes) -> bytes:
            return encode(Data(sid, payload))

        t.edge._on_messages(
            [data(first, b"one") + data(second, b"two") + data(gone, b"gone") + data(first, b"3")]
        )
        assert [s.read_nowait() for s in served[:2]] == [b"one", b"two"]
        assert served[0].read_nowait() == b"3"
        assert served[0].read_nowait() is None and served[1].read_nowait() is None
        # "gone"'s credit at once, the others' as they were read.
        assert conn_recv.unacked == unacked + len(b"gone") + len(b"onetwo3")

        t.edge._on_messages([data(first, b"four") + encode(Ping(b"12345678")) + data(second, b"5")])
        assert [s.read_nowait() for s in served[:2]] == [b"four", b"5"]
        for stream in opened:
            stream.close()


def test_session_config_validation() -> None:
    with pytest.raises(ValueError):
        SessionConfig(ping_interval=0)
    with pytest.raises(ValueError):
        SessionConfig(ping_interval=5, dead_after=5)
    with pytest.raises(ValueError):
        SessionConfig(open_timeout=0)
    with pytest.raises(ValueError):
        SessionConfig(flood_grace=0)


async def test_a_flag_wakes_every_waiter_but_a_cancelled_one() -> None:
    """The session's flags (asyncio.Event's set/clear/wait, no waiter deque held): one waiter
    cancelled leaves the others waiting, a set wakes them all, a set flag does not block."""
    flag = Flag()
    assert flag.waiter is None  # nobody waits: the session's writer skips set()
    waiters = [asyncio.create_task(flag.wait(), name=f"flag-waiter:{i}") for i in range(3)]
    try:
        await asyncio.sleep(0)
        assert flag.waiter is not None
        waiters[0].cancel()
        await asyncio.sleep(0)
        assert waiters[0].cancelled()
        assert not any(w.done() for w in waiters[1:])
        flag.set()
        await asyncio.wait_for(asyncio.gather(*waiters[1:]), 1)
        assert flag.is_set() and flag.waiter is None
        await asyncio.wait_for(flag.wait(), 1)  # set: returns at once
        flag.clear()
        late = asyncio.create_task(flag.wait(), name="flag-waiter:late")
        waiters.append(late)
        await asyncio.sleep(0.01)
        assert not late.done()
        flag.set()
        await asyncio.wait_for(late, 1)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)


@pytest.mark.parametrize("direction", ["read", "write"])
async def test_a_waiter_cancelled_as_the_stream_wakes_it_gets_its_cancellation(
    direction: str,
) -> None:
    """A task waiting to read (or for send credit) is cancelled, and in the same callback the
    stream is reset, which wakes its waiters and drops their list: the task must end with its
    CancelledError. It used to raise AttributeError ('NoneType' object has no attribute
    'remove'): the waiter looked for the stream's list again after the await, gone by then."""

    async def hold(stream: TunnelStream) -> None:
        stream.accept()  # and never read: the opener's writes soon run out of credit
        with contextlib.suppress(StreamClosedError):
            await asyncio.sleep(WAIT)

    async with tunnel(on_open=hold) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        if direction == "read":
            waiter = asyncio.create_task(stream.read())
        else:
            waiter = asyncio.create_task(stream.write(b"x" * (4 * 1024 * 1024)))
        for _ in range(200):  # until it waits on the stream
            await asyncio.sleep(0.01)
            if stream._read_waiters or stream._write_waiters:
                break
        assert stream._read_waiters or stream._write_waiters
        waiter.cancel()
        stream.reset()  # same callback: its waiters are woken, their list dropped
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiter, WAIT)
