"""When a session's output reaches its transport (transport/outlet.py): small output on an idle
tunnel in the turn that queued it (no writer task step) unless more input waits in the loop
turn (transport/readiness.py: a burst is one write), what a read round queues in one write,
back-pressure through the writer."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from websockets.protocol import State

from ravenproxy.transport import readiness
from ravenproxy.transport.frame_batch import COALESCE, WRITE_THROUGH
from ravenproxy.transport.session import Session, TunnelStream
from ravenproxy.wire.codes import ErrorCode
from tests.unit.transport.test_session import TARGET, WAIT, read_all, tunnel
from tests.unit.transport.test_websocket import contexts, pki  # noqa: F401 (a fixture)


class Recorder:
    """A session's transport, every ``writelines`` call recorded (the rest passed through)."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.writes: list[bytes] = []

    def writelines(self, pieces: Iterable[bytes | bytearray | memoryview]) -> None:
        pieces = list(pieces)
        self.writes.append(b"".join(pieces))
        self._transport.writelines(pieces)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def record(session: Session) -> Recorder:
    recorder = Recorder(session.ws.transport)
    session.ws.transport = recorder  # type: ignore[misc]  # the session looks it up per write
    return recorder


async def settle(session: Session) -> None:
    """Until the session's writer waits for output (idle)."""
    async with asyncio.timeout(WAIT):
        while session._wake_writer is None or session.conn.outbox.pending_bytes:
            await asyncio.sleep(0.001)


async def test_a_small_write_on_an_idle_tunnel_goes_out_in_the_writers_callers_turn() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        writes = record(t.cloud)
        assert stream.try_write(b"GET / HTTP/1.1\r\n\r\n") == 18
        # No await since: written by the caller, not by a writer task's step to come.
        assert len(writes.writes) == 1
        assert b"GET / HTTP/1.1" in writes.writes[0]
        assert t.cloud.conn.outbox.pending_bytes == 0
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"GET / HTTP/1.1\r\n\r\n"


async def echo_by_callback(stream: TunnelStream) -> None:
    """As the agent's splice: each chunk answered from the read callback that delivered it."""
    stream.accept()
    done = asyncio.get_running_loop().create_future()

    def readable() -> None:
        data = stream.read_nowait()
        if data:
            assert stream.try_write(bytes(data)) == len(data)
        elif data == b"" and not done.done():
            stream.write_eof()
            done.set_result(None)

    stream.on_readable(readable)
    await done


async def test_what_a_read_round_queues_goes_out_in_one_write() -> None:
    """Three streams' DATA in one read round, each answered by its read callback (a flush
    each): the three answers are one write at the round's end, not one write per flush."""
    async with tunnel(on_open=echo_by_callback) as t:
        streams = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(3)]
        await settle(t.edge)
        writes = record(t.edge)
        t.cloud._deferred = True  # the three DATA frames in one message, one write
        for i, stream in enumerate(streams):
            assert stream.try_write(b"ask %d" % i) == 5
        t.cloud._deferred = False
        t.cloud._flush()
        async with asyncio.timeout(WAIT):
            while not writes.writes:
                await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # nothing else follows
        assert len(writes.writes) == 1  # (masked: its bytes are read back below)
        for i, stream in enumerate(streams):
            stream.write_eof()
            assert await asyncio.wait_for(read_all(stream), WAIT) == b"ask %d" % i


@pytest.mark.parametrize(
    "size",
    # Frames of 12 + size bytes: a header from the table (under 126), the 16-bit length, and
    # one too large for one_frame (COALESCE - 16 and over) yet under WRITE_THROUGH, which the
    # write-through frames by writes() instead.
    [1, 113, 114, COALESCE - 29, COALESCE - 28, WRITE_THROUGH - 13],
)
async def test_a_lone_frame_written_through_arrives_whole_both_ways(size: int) -> None:
    """A write-through of one DATA frame (Outbox.take_one, then one_frame or writes()), the
    server side's unmasked and the agent side's masked echo of it: one write each, the bytes
    as sent."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    async with tunnel(on_open=echo_by_callback) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        await settle(t.edge)
        cloud, edge = record(t.cloud), record(t.edge)
        assert stream.try_write(payload) == size
        assert len(cloud.writes) == 1 and t.cloud.conn.outbox.pending_bytes == 0
        echoed = bytearray()
        async with asyncio.timeout(WAIT):
            while len(echoed) < size:
                echoed += await stream.read()
        assert bytes(echoed) == payload
        assert len(edge.writes) == 1  # the echo: written through by the edge's read callback
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b""


async def test_a_paused_transport_leaves_the_write_to_the_writer_which_waits_for_drain() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        writes = record(t.cloud)
        t.cloud_ws.pause_writing()  # as the transport does over its high-water mark
        try:
            assert stream.try_write(b"first") == 5
            assert writes.writes == []  # not written through while paused
            await asyncio.sleep(0.05)
            # The writer wrote it and waits for the transport to drain: what is queued
            # meanwhile stays queued.
            assert len(writes.writes) == 1
            assert stream.try_write(b"second") == 6
            await asyncio.sleep(0.05)
            assert len(writes.writes) == 1
            assert t.cloud.conn.outbox.pending_bytes > 0
        finally:
            t.cloud_ws.resume_writing()
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"firstsecond"
        assert len(writes.writes) >= 2


class Asker(asyncio.Protocol):
    """A front connection, as the server's: each read is written to its tunnel stream in the
    read callback (its socket counted in the loop's readiness probe, as the fronts' are)."""

    def __init__(self, stream: TunnelStream) -> None:
        self.stream = stream
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        readiness.watch(transport)

    def data_received(self, data: bytes) -> None:
        assert self.stream.try_write(data) == len(data)


@contextlib.asynccontextmanager
async def fronts(streams: list[TunnelStream]) -> AsyncIterator[list[tuple[socket.socket, Asker]]]:
    """A connected socket pair per stream: (the client's end, the front's protocol)."""
    loop = asyncio.get_running_loop()
    made: list[tuple[socket.socket, Asker]] = []
    try:
        for stream in streams:
            client, front = socket.socketpair()
            _, asker = await loop.connect_accepted_socket(functools.partial(Asker, stream), front)
            made.append((client, asker))
        yield made
    finally:
        for client, asker in made:
            client.close()
            if asker.transport is not None:
                asker.transport.close()
        await asyncio.sleep(0)


async def wait_writes(writes: Recorder, n: int) -> None:
    async with asyncio.timeout(WAIT):
        while len(writes.writes) < n:
            await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)  # nothing else follows


async def test_a_burst_of_requests_in_one_loop_turn_goes_out_in_one_write() -> None:
    """Two fronts' requests readable in one loop turn: the first callback sees the second
    socket still readable and leaves its output queued; the second writes both in one write
    (written through by each, the burst was two writes: more reads and writes per request)."""
    async with tunnel() as t:
        streams = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(2)]
        async with fronts(streams) as made:
            await settle(t.cloud)
            writes = record(t.cloud)
            for i, (client, _) in enumerate(made):  # no await between: one poll sees both
                client.send(b"ask %d" % i)
            await wait_writes(writes, 1)
            assert len(writes.writes) == 1
            assert b"ask 0" in writes.writes[0] and b"ask 1" in writes.writes[0]
        for i, stream in enumerate(streams):
            stream.write_eof()
            assert await asyncio.wait_for(read_all(stream), WAIT) == b"ask %d" % i


async def test_a_burst_asks_the_probe_once_and_goes_out_in_one_write_at_its_end() -> None:
    """Three fronts' requests readable in one loop turn: the first write's poll says more input,
    and the turn's later writes wait for its end without a poll each (they polled once a
    write: ~900 instructions, mostly the GIL's release and take); all three go out in one
    write at the turn's end, and the next turn's lone request is asked about and written
    through again."""
    async with tunnel() as t:
        streams = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(3)]
        async with fronts(streams) as made:
            await settle(t.cloud)
            writes = record(t.cloud)
            probe = t.cloud._probe
            poll = probe.poll
            polls: list[int] = []  # the polls made by each read callback of the burst
            inside = [False]

            def counted(*args: Any) -> Any:
                if inside[0]:
                    polls[-1] += 1
                return poll(*args)

            def watched(asker: Asker) -> None:
                feed = asker.data_received

                def received(data: bytes) -> None:
                    polls.append(0)
                    inside[0] = True
                    try:
                        feed(data)
                    finally:
                        inside[0] = False

                asker.data_received = received  # type: ignore[method-assign]

            for _, asker in made:
                watched(asker)
            probe.poll = counted  # type: ignore[misc]
            try:
                for i, (client, _) in enumerate(made):  # no await between: one poll sees all
                    client.send(b"ask %d" % i)
                await wait_writes(writes, 1)
                assert polls == [1, 0, 0]
                assert not probe.seen  # cleared at the turn's end
                assert len(writes.writes) == 1
                assert all(b"ask %d" % i in writes.writes[0] for i in range(3))
                made[0][0].send(b"alone")
                await wait_writes(writes, 2)
                assert polls[3:] == [1]
                assert len(writes.writes) == 2 and b"alone" in writes.writes[1]
            finally:
                probe.poll = poll  # type: ignore[misc]
        for stream, sent in zip(streams, (b"ask 0alone", b"ask 1", b"ask 2"), strict=True):
            stream.write_eof()
            assert await asyncio.wait_for(read_all(stream), WAIT) == sent


async def test_a_lone_request_is_written_in_its_read_callback() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        async with fronts([stream]) as made:
            await settle(t.cloud)
            writes = record(t.cloud)
            seen: list[int] = []
            asker = made[0][1]
            feed = asker.data_received

            def received(data: bytes) -> None:
                feed(data)
                seen.append(len(writes.writes))  # written by then, in this callback

            asker.data_received = received  # type: ignore[method-assign]
            made[0][0].send(b"GET / HTTP/1.1\r\n\r\n")
            await wait_writes(writes, 1)
            assert seen == [1]
            assert len(writes.writes) == 1
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"GET / HTTP/1.1\r\n\r\n"


async def test_a_paused_socket_with_input_waiting_leaves_the_write_to_after_the_turn() -> None:
    """A watched socket that stays readable (its reading paused, its data unread) means more
    input to the probe: the output waits for the turn's end, and is then written (never
    left queued)."""
    async with tunnel() as t:
        streams = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(2)]
        async with fronts(streams) as made:
            await settle(t.cloud)
            paused = made[1][1].transport
            assert paused is not None
            paused.pause_reading()
            made[1][0].send(b"unread")
            await asyncio.sleep(0.05)
            writes = record(t.cloud)
            assert streams[0].try_write(b"first") == 5
            assert writes.writes == []  # not in the caller's turn: more input waits
            await wait_writes(writes, 1)
            assert len(writes.writes) == 1 and b"first" in writes.writes[0]
            assert t.cloud.conn.outbox.pending_bytes == 0
            paused.resume_reading()  # its bytes go up now: one more write
            await wait_writes(writes, 2)
        for stream, sent in zip(streams, (b"first", b"unread"), strict=True):
            stream.write_eof()
            assert await asyncio.wait_for(read_all(stream), WAIT) == sent


async def test_a_closed_probe_leaves_small_writes_to_the_turns_end() -> None:
    """The app closes the loop's probe at shutdown while sessions may still write (the outlet
    asks it inline, not through Readiness.more_input): a closed probe means "more input may
    wait", so the write goes out at the turn's end, and the write that queued it raises
    nothing."""
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        t.cloud._probe.close()
        writes = record(t.cloud)
        assert stream.try_write(b"GET / HTTP/1.1\r\n\r\n") == 18
        assert writes.writes == []  # not in the caller's turn: the probe cannot say
        await wait_writes(writes, 1)
        assert len(writes.writes) == 1 and b"GET / HTTP/1.1" in writes.writes[0]
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"GET / HTTP/1.1\r\n\r\n"


async def test_no_data_is_written_through_once_a_close_frame_went_out() -> None:
    """Once the WebSocket left OPEN (its CLOSE sent by websockets' output path), a small write
    is not written through after that CLOSE (RFC 6455 5.5.1: no data frame after it); the
    reader's ``data_closed`` says so without asking websockets' state property each write,
    and it is false while the tunnel is open (else nothing would be written through)."""
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        assert not t.cloud_ws.data_closed
        t.cloud_ws.protocol.send_close(1000, "bye")
        t.cloud_ws.send_data()
        assert t.cloud_ws.data_closed
        writes = record(t.cloud)
        assert stream.try_write(b"late") == 4  # queued: the test could see a write
        await asyncio.sleep(0.05)
        assert writes.writes == []


@pytest.mark.parametrize("end", ["the peer's CLOSE answered", "the connection lost"])
async def test_the_reader_says_no_data_may_follow_once_its_websocket_left_open(end: str) -> None:
    """``data_closed`` (what the outlet asks before writing through) on the other ways out of
    OPEN: websockets' answer to the peer's CLOSE (written by its output path, in the read
    callback that handed it the CLOSE), the connection lost without a closing handshake."""
    async with tunnel() as t:
        await settle(t.cloud)
        assert not t.cloud_ws.data_closed and not t.edge_ws.data_closed
        if end == "the connection lost":
            t.edge_ws.transport.abort()
        else:
            t.edge_ws.protocol.send_close(1000, "bye")
            t.edge_ws.send_data()
        async with asyncio.timeout(WAIT):
            while t.cloud_ws.protocol.state is State.OPEN:
                await asyncio.sleep(0.001)
        assert t.cloud_ws.data_closed


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
async def test_a_write_through_on_an_aborted_transport_raises_nothing(
    pki: Path,  # noqa: F811 (the fixture)
    tls: bool,
) -> None:
    """The outlet does not ask ``is_closing()`` before writing through: between an abort and
    ``connection_lost`` (which sets ``data_closed``) the write reaches a closing transport,
    which drops it (our TLS transport; uvloop's ignores it until the handler is closed), and
    the session ends as lost; after ``connection_lost`` nothing is written at all."""
    srv, cli = contexts(pki if tls else None)
    async with tunnel(tls=(srv, cli) if srv and cli else None) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        t.cloud_ws.transport.abort()
        assert not t.cloud_ws.data_closed  # connection_lost comes in a later callback
        assert stream.try_write(b"dropped") == 7
        await asyncio.wait_for(t.cloud_run, WAIT)
        assert t.cloud_ws.data_closed
        assert stream.try_write(b"after") == 0


async def test_nothing_is_written_through_once_the_session_stopped_its_writer() -> None:
    """A connection error stops the writer first, so that nothing follows the GOAWAY it sends
    (``_close_with_error``); a small write meanwhile is not written through either: the outlet
    asks ``_wake_writer`` alone (not the future's ``done()``), which the session clears where it
    cancels the writer."""
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        writes = record(t.cloud)
        conn = t.cloud.conn
        take = conn.data_to_send
        seen: list[int] = []

        def data_to_send() -> Any:  # asked right after the writer's cancel, in the same step
            assert t.cloud._writer_task is not None and t.cloud._writer_task.cancelling()
            assert stream.try_write(b"late") == 4
            seen.append(len(writes.writes))
            return take()

        conn.data_to_send = data_to_send  # type: ignore[method-assign]
        await asyncio.wait_for(t.cloud._close_with_error(ErrorCode.PROTOCOL_ERROR), WAIT)
        assert seen == [0]  # left queued (sent by the close), not written in the caller's turn
