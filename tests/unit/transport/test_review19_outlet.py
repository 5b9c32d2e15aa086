"""Review of txpath's write-through (issue 15): the probe asked once a burst (``Readiness.seen``,
one flag for every session of the loop, cleared by the first late flush) and the idle writer
told by ``_wake_writer`` alone. What must hold, as at 3466b61: a burst across tunnels is one
write per tunnel at the turn's end, a lone write after it is written through in its caller's
turn again (``seen`` never outlives its turn, not even when the session that set it dies
first), the idle writer woken exactly when the write-through cannot write (nothing stuck,
nothing written twice, nothing out of order), whatever mix of sizes and turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvloop

from ravenproxy.transport.frame_batch import WRITE_THROUGH
from ravenproxy.transport.readiness import Readiness
from ravenproxy.transport.session import TunnelStream
from tests.unit.transport.test_session import TARGET, WAIT, Pair, read_all, tunnel
from tests.unit.transport.test_session_writes import fronts, record, settle, wait_writes
from tests.unit.transport.test_websocket import contexts, pki  # noqa: F401 (a fixture)


@contextlib.asynccontextmanager
async def two_tunnels(certs: Path | None = None) -> AsyncIterator[tuple[Pair, Pair]]:
    """Two tunnels on this loop: plain TCP, or the tunnel's mTLS (our TLS transport) with
    ``certs``."""
    srv, cli = contexts(certs)
    tls = (srv, cli) if srv and cli else None
    async with tunnel(tls=tls) as one, tunnel(tls=tls) as two:
        yield one, two


async def quiet(probe: Readiness) -> None:
    """Until no watched socket of this loop (both ends of each tunnel are in it) has input
    waiting: a write then goes through in its caller's turn."""
    async with asyncio.timeout(WAIT):
        while probe.soon or probe.poll(0, 1):
            await asyncio.sleep(0.001)


async def _opened(t: Pair, n: int) -> list[TunnelStream]:
    return [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(n)]


async def _take(stream: TunnelStream, n: int) -> bytes:
    """The next ``n`` bytes the stream received (waited for)."""
    got = bytearray()
    async with asyncio.timeout(WAIT):
        while len(got) < n:
            data = await stream.read()
            assert data, f"the stream ended after {len(got)} of {n} bytes"
            got += data
    assert len(got) == n, f"{len(got) - n} bytes more than asked for"
    return bytes(got)


async def _echoed(streams: list[TunnelStream], sent: list[bytes]) -> None:
    for stream, data in zip(streams, sent, strict=True):
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == data


async def test_a_burst_across_two_tunnels_is_one_write_each_and_seen_ends_with_the_turn() -> None:
    """Fronts of two tunnels readable in one loop turn: the first poll says more, every later
    write of the turn (the other tunnel's too) waits for the turn's end, each tunnel writes
    once; then a lone write on either is written through in its caller's turn."""
    await _burst()


def test_the_burst_under_uvloop() -> None:
    uvloop.run(_burst())


async def _burst() -> None:
    async with two_tunnels() as (one, two):
        first, second = await _opened(one, 2), await _opened(two, 2)
        async with fronts([*first, *second]) as made:
            await settle(one.cloud)
            await settle(two.cloud)
            probe = one.cloud._probe
            assert probe is two.cloud._probe  # one per loop: the flag is shared
            writes_one, writes_two = record(one.cloud), record(two.cloud)
            for i, (client, _) in enumerate(made):  # no await between: one poll sees all
                client.send(b"ask %d" % i)
            await wait_writes(writes_one, 1)
            await wait_writes(writes_two, 1)
            assert len(writes_one.writes) == 1 and len(writes_two.writes) == 1
            # In the order the fronts were read (the loop's order of their events).
            assert 0 <= writes_one.writes[0].find(b"ask 0") < writes_one.writes[0].find(b"ask 1")
            assert 0 <= writes_two.writes[0].find(b"ask 2") < writes_two.writes[0].find(b"ask 3")
            assert not probe.seen
            # The echoes back first (arriving, they are input of this loop: a write beside them
            # waits for the turn's end); taken, nothing is on its way.
            for i, stream in enumerate([*first, *second]):
                assert await _take(stream, 5) == b"ask %d" % i
            await quiet(probe)
            assert second[1].try_write(b"lone") == 4
            assert len(writes_two.writes) == 2  # in this turn, no await since
            # (Its bytes make tunnel two's agent end, in this loop, readable: more input.)
            assert await _take(second[1], 4) == b"lone"
            await quiet(probe)
            assert first[0].try_write(b"lone") == 4
            assert len(writes_one.writes) == 2
        await _echoed([*first, *second], [b"lone", b"", b"", b""])


@pytest.mark.parametrize("end", ["abort", "eof"])
async def test_seen_ends_with_its_turn_when_the_session_that_set_it_dies_first(end: str) -> None:
    """A poll says more (made to, here) and the session leaves its output for the turn's end;
    its tunnel goes down in the same turn. Its late flush still ends the turn's "more input":
    the other tunnel's next lone write is written through in its caller's turn."""
    async with two_tunnels() as (one, two):
        (doomed,), (alive,) = await _opened(one, 1), await _opened(two, 1)
        await settle(one.cloud)
        await settle(two.cloud)
        probe = one.cloud._probe
        ends = (one.cloud_ws, one.edge_ws)
        writes_one, writes_two = record(one.cloud), record(two.cloud)
        poll = probe.poll
        probe.poll = lambda *_: [(0, 1)]  # "more input"
        try:
            assert doomed.try_write(b"deferred") == 8
        finally:
            probe.poll = poll
        assert writes_one.writes == [] and probe.seen
        if end == "abort":
            one.cloud_ws.transport.abort()
        else:
            one.edge_ws.transport.write_eof()
        for _ in range(3):
            await asyncio.sleep(0)
        assert not probe.seen
        # (Tunnel one's ends, in this loop, readable until they have seen the end: more input.)
        # Until both are closed (out of the probe: nothing of tunnel one on its way any more).
        async with asyncio.timeout(WAIT):
            while any(ws.transport.get_extra_info("socket").fileno() >= 0 for ws in ends):
                await asyncio.sleep(0.001)
        await quiet(probe)
        assert not probe.seen
        assert alive.try_write(b"lone") == 4
        assert len(writes_two.writes) == 1 and b"lone" in writes_two.writes[0]
        await _echoed([alive], [b"lone"])


async def test_the_idle_writer_is_woken_once_and_written_through_output_is_not_repeated() -> None:
    """A small write goes through; bulk then wakes the writer (it cannot write through);
    small writes made before the writer ran wait for it (in order, after the bulk); once the
    writer is idle again a small write goes through. The peer echoes each byte once, in
    order."""
    async with tunnel() as t:
        (stream,) = await _opened(t, 1)
        await settle(t.cloud)
        writes = record(t.cloud)
        assert stream.try_write(b"small 1.") == 8
        assert len(writes.writes) == 1 and t.cloud._wake_writer is not None
        bulk = b"B" * WRITE_THROUGH
        assert stream.try_write(bulk) == len(bulk)
        assert stream.try_write(b"small 2.") == 8
        assert len(writes.writes) == 1  # the writer's: after the bulk, not before it
        await settle(t.cloud)
        # Its echo back first: arriving, it is input of this loop (the tunnel's cloud end),
        # and a write beside it waits for the turn's end. The writer being idle says nothing
        # about the echo (a loaded machine's late step ends settle() in the middle of it).
        # Taken, nothing is on its way: no credit goes back for 16 KiB (half a window).
        assert await _take(stream, 8 + len(bulk) + 8) == b"small 1." + bulk + b"small 2."
        await quiet(t.cloud._probe)
        after_writer = len(writes.writes)
        assert after_writer >= 2
        assert stream.try_write(b"small 3.") == 8
        assert len(writes.writes) == after_writer + 1
        await _echoed([stream], [b"small 3."])


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
@pytest.mark.parametrize("seed", range(8))
async def test_any_mix_of_writes_turns_and_bursts_arrives_once_in_order(
    pki: Path,  # noqa: F811 (the fixture)
    seed: int,
    tls: bool,
) -> None:
    """Writes of every size on streams of two tunnels, front bursts among them, with any number
    of loop turns between: each stream's bytes come back once, in order; nothing is left
    queued; the turn's "more input" is over once the loop went idle."""
    await _mix(pki if tls else None, seed)


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
@pytest.mark.parametrize("seed", range(4))
def test_the_mix_under_uvloop(pki: Path, seed: int, tls: bool) -> None:  # noqa: F811
    """The same under uvloop, the server's and the agent's loop, whose turn is ordered
    otherwise (the ready callbacks, the late flushes among them, in its idle phase, before
    the poll whose I/O callbacks run in the poll phase; timers first)."""
    uvloop.run(_mix(pki if tls else None, 100 + seed))


async def _mix(certs: Path | None, seed: int) -> None:
    rng = random.Random(seed)
    async with two_tunnels(certs) as (one, two):
        streams = [*(await _opened(one, 2)), *(await _opened(two, 2))]
        sent = [bytearray() for _ in streams]
        async with fronts(streams) as made:
            await settle(one.cloud)
            await settle(two.cloud)
            for step in range(60):
                action = rng.randrange(4)
                if action == 0:  # a burst: several fronts readable in one turn
                    for i in rng.sample(range(len(made)), rng.randrange(1, len(made) + 1)):
                        data = b"<%d.%d>" % (seed, step) * rng.randrange(1, 4)
                        made[i][0].send(data)
                        sent[i] += data
                    await asyncio.sleep(0.002)
                else:
                    i = rng.randrange(len(streams))
                    size = rng.choice([1, 10, 300, 1500, WRITE_THROUGH - 20, WRITE_THROUGH + 5])
                    data = bytes([65 + step % 26]) * size
                    assert streams[i].try_write(data) == len(data)
                    sent[i] += data
                for _ in range(rng.randrange(3)):
                    await asyncio.sleep(0)
            await asyncio.sleep(0.05)
            await settle(one.cloud)
            await settle(two.cloud)
            assert not one.cloud._probe.seen
        await _echoed(streams, [bytes(s) for s in sent])
