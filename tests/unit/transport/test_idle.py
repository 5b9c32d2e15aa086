"""IdleWatch: the one idleness mechanism of relayed connections, and the relay closing an idle
connection while a busy one lives on (real sockets on loopback)."""

from __future__ import annotations

import asyncio
import time

import pytest

from ravenproxy.transport.bytestream import SocketByteStream
from ravenproxy.transport.idle import _Sweep
from ravenproxy.transport.relay import IDLE_ERROR, IdleTimeout, IdleWatch, relay


async def test_an_untouched_block_is_cancelled_after_the_timeout() -> None:
    watch = IdleWatch(0.2)
    started = time.monotonic()
    with pytest.raises(IdleTimeout) as info:
        async with watch:
            await asyncio.sleep(10)
    assert 0.15 <= time.monotonic() - started < 2
    assert info.value.timeout == 0.2


async def test_touches_keep_it_alive_until_they_stop() -> None:
    watch = IdleWatch(0.2)
    started = time.monotonic()
    with pytest.raises(IdleTimeout):
        async with watch:
            for _ in range(10):  # 0.5 s of activity, never 0.2 s without
                await asyncio.sleep(0.05)
                watch.touch()
            assert time.monotonic() - started >= 0.45
            await asyncio.sleep(10)
    assert time.monotonic() - started < 2


async def test_no_timeout_never_fires_and_errors_pass_unchanged() -> None:
    async with IdleWatch(None):
        await asyncio.sleep(0.05)
    with pytest.raises(ValueError):
        async with IdleWatch(5):
            raise ValueError("inside")
    # Once guarded, guarded again (one block after another), then left alone.
    watch = IdleWatch(0.1)
    async with watch:
        pass
    with pytest.raises(IdleTimeout):
        async with watch:
            await asyncio.sleep(5)


async def test_cancelling_from_outside_stays_a_cancellation() -> None:
    async def guarded() -> None:
        async with IdleWatch(5):
            await asyncio.sleep(10)

    task = asyncio.create_task(guarded())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_watches_share_one_timer_and_each_expires_at_its_own_time() -> None:
    """Watches of one timeout are checked by one timer per loop (not one each): each still
    expires after its own idle time, a busy one lives on, and nothing is left armed after."""
    loop = asyncio.get_running_loop()
    expired: dict[str, float] = {}

    async def idle(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        started = loop.time()
        with pytest.raises(IdleTimeout):
            async with IdleWatch(0.3):
                await asyncio.sleep(10)
        expired[name] = loop.time() - started

    async def busy() -> None:
        async with IdleWatch(0.3) as watch:
            for _ in range(12):  # 0.6 s of activity: past the idle ones' expiry
                await asyncio.sleep(0.05)
                watch.touch()

    tasks = [
        asyncio.create_task(idle("first", 0)),
        asyncio.create_task(idle("later", 0.15)),
        asyncio.create_task(busy()),
    ]
    await asyncio.sleep(0.05)
    assert len([k for k in _Sweep._all if k[0] is loop]) == 1  # one sweep for all three
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    # Each after its own 0.3 s (the later one did not go with the first one's check), and not
    # much later than that: the busy one keeps the checks coming at most every 0.3/8 s.
    assert 0.25 <= expired["first"] < 1.0
    assert 0.25 <= expired["later"] < 1.0
    # Nothing left armed once the sweep's timer (due within 0.3 s) found it empty.
    await asyncio.sleep(0.4)
    assert not [k for k in _Sweep._all if k[0] is loop]


async def test_relay_closes_an_idle_connection_not_a_busy_one() -> None:
    results: list[object] = []

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    target_server = await asyncio.start_server(target, "127.0.0.1", 0)
    target_port = target_server.sockets[0].getsockname()[1]

    async def front(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        upstream = SocketByteStream(up_reader, up_writer)
        results.append(await relay(upstream, reader, writer, idle_timeout=0.3))

    front_server = await asyncio.start_server(front, "127.0.0.1", 0)
    port = front_server.sockets[0].getsockname()[1]
    try:
        idle = await asyncio.open_connection("127.0.0.1", port)
        busy = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        while time.monotonic() - started < 1.0:
            busy[1].write(b"x")
            assert await asyncio.wait_for(busy[0].readexactly(1), 2) == b"x"
            await asyncio.sleep(0.1)
        assert await asyncio.wait_for(idle[0].read(), 2) == b""  # closed for idleness
        busy[1].write(b"y")
        assert await asyncio.wait_for(busy[0].readexactly(1), 2) == b"y"
        busy[1].close()
        idle[1].close()
        for _ in range(50):
            if len(results) == 2:
                break
            await asyncio.sleep(0.05)
        idles = [r for r in results if getattr(r, "idle", False)]
        assert len(idles) == 1 and getattr(idles[0], "error", "") == IDLE_ERROR
    finally:
        front_server.close()
        target_server.close()
        await front_server.wait_closed()
        await target_server.wait_closed()


async def test_retime_switches_the_timeout_of_the_guarded_block() -> None:
    # One watch for a connection that waits by turns: a long timeout between requests, a short
    # one while an answer is awaited (the HTTP fronts' callback path).
    watch = IdleWatch(5)
    started = time.monotonic()
    with pytest.raises(IdleTimeout) as info:
        async with watch:
            await asyncio.sleep(0.3)  # under 5 s: nothing happens
            watch.retime(0.2)  # the clock restarts now, with the short timeout
            await asyncio.sleep(10)
    assert 0.45 <= time.monotonic() - started < 2.5
    assert info.value.timeout == 0.2
    # Back to the long one: the short one no longer applies.
    async with watch:
        watch.retime(5)
        await asyncio.sleep(0.5)
    # A watch made without a timeout can be given one while it guards.
    watch = IdleWatch(None)
    with pytest.raises(IdleTimeout):
        async with watch:
            watch.retime(0.1)
            await asyncio.sleep(5)


async def test_retimed_longer_it_stays_in_its_sweep_and_expires_by_its_own_timeout() -> None:
    """A keep-alive connection switches between two timeouts per request: given a longer one,
    a watch stays with the shorter one's timer (no other timer armed), which expires it by
    its own, longer timeout; given a shorter one again, it still expires by that."""
    loop = asyncio.get_running_loop()
    watch = IdleWatch(0.2)
    started = loop.time()
    with pytest.raises(IdleTimeout) as info:
        async with watch:
            watch.retime(0.8)
            assert [k[1] for k in _Sweep._all if k[0] is loop] == [0.2]
            await asyncio.sleep(10)
    assert 0.75 <= loop.time() - started < 2.5
    assert info.value.timeout == 0.8
    started = loop.time()
    with pytest.raises(IdleTimeout) as info:
        async with watch:  # entered with 0.8: that sweep
            watch.retime(0.2)  # shorter: moved to a sweep that checks soon enough
            await asyncio.sleep(10)
    assert 0.15 <= loop.time() - started < 0.7
    assert info.value.timeout == 0.2


async def test_a_watch_by_turns_expires_by_the_turn_it_is_in() -> None:
    """``turns``: the timeout is the turn's, asked when the sweep looks (a turn is a stamp, no
    retime); the watch waits in the sweep of its ``timeout``, the shorter turn's, which is
    what checks it soon enough for either."""
    loop = asyncio.get_running_loop()
    turn = {"now": 0.8}
    watch = IdleWatch(0.2, lambda: turn["now"])
    started = loop.time()
    with pytest.raises(IdleTimeout) as info:
        async with watch:
            assert [k[1] for k in _Sweep._all if k[0] is loop] == [0.2]
            await asyncio.sleep(10)  # the long turn: not expired at the sweep's first look
    assert 0.75 <= loop.time() - started < 2.5
    assert info.value.timeout == 0.8
    started = loop.time()
    with pytest.raises(IdleTimeout) as info:
        async with watch:
            await asyncio.sleep(0.5)
            turn["now"] = 0.2  # the short turn from a stamp now
            watch.touch()
            await asyncio.sleep(10)
    assert 0.65 <= loop.time() - started < 1.5
    assert info.value.timeout == 0.2 and watch.timeout_now() == 0.2
