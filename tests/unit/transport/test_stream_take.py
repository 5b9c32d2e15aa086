""":meth:`TunnelStream.on_readable`'s ``take``: a chunk that arrives while the stream holds none
is offered as it comes; taken, it counts as read (``bytes_in``, its credit returned as
:meth:`~TunnelStream.read_nowait` returns it); not taken, it is held and the callback called,
and no later chunk is offered before the held ones are read back (none overtakes another)."""

from __future__ import annotations

import asyncio

from ravenproxy.transport.session import TunnelStream
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import settle


async def test_taken_chunks_count_as_read_and_held_ones_go_first() -> None:
    events: list[tuple[str, bytes]] = []
    refuse = {b"two"}  # not taken as it comes: held, read back by the callback
    ready: asyncio.Future[TunnelStream] = asyncio.get_running_loop().create_future()

    async def handler(stream: TunnelStream) -> None:
        stream.accept()

        def take(chunk: bytes | memoryview) -> bool:
            events.append(("offered", bytes(chunk)))
            return bytes(chunk) not in refuse

        def readable() -> None:
            while (chunk := stream.read_nowait()) is not None and chunk:
                events.append(("read", bytes(chunk)))

        stream.on_readable(readable, take)
        ready.set_result(stream)
        await asyncio.sleep(WAIT)

    async with tunnel(on_open=handler) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        edge = await asyncio.wait_for(ready, WAIT)
        await settle(t.cloud)
        window = t.edge.conn.streams[edge.id].recv.available
        for chunk in (b"one", b"two", b"three", b"four"):
            assert stream.try_write(chunk) == len(chunk)
            await settle(t.cloud)
            await asyncio.sleep(0.02)
        edge.on_readable(None)
        edge.reset()
    # "two" is refused, held and read back by the callback at once; then "three" is offered
    # again as it comes (none held any more).
    assert events == [
        ("offered", b"one"),
        ("offered", b"two"),
        ("read", b"two"),
        ("offered", b"three"),
        ("offered", b"four"),
    ]
    assert edge.bytes_in == 3 + 3 + 5 + 4
    # Every byte's credit counted as read_nowait counts it (returned by half windows).
    recv = t.edge.conn.streams.get(edge.id)
    assert recv is None or recv.recv.available + recv.recv.unacked == window


async def test_a_chunk_is_not_offered_while_one_is_held() -> None:
    offered: list[bytes] = []
    ready: asyncio.Future[TunnelStream] = asyncio.get_running_loop().create_future()

    async def handler(stream: TunnelStream) -> None:
        stream.accept()

        def take(chunk: bytes | memoryview) -> bool:
            offered.append(bytes(chunk))
            return False  # a socket that takes nothing now: everything held

        stream.on_readable(lambda: None, take)  # a callback that reads nothing back
        ready.set_result(stream)
        await asyncio.sleep(WAIT)

    async with tunnel(on_open=handler) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        edge = await asyncio.wait_for(ready, WAIT)
        for chunk in (b"a", b"b", b"c"):
            assert stream.try_write(chunk) == 1
            await settle(t.cloud)
            await asyncio.sleep(0.02)
        assert offered == [b"a"]  # b and c arrived behind a held chunk: held, not offered
        assert edge.buffered == 3 and edge.bytes_in == 0
        assert [edge.read_nowait() for _ in range(3)] == [b"a", b"b", b"c"]
        assert edge.bytes_in == 3
        edge.reset()
