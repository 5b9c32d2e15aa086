"""A stream's small write on an idle tunnel written through without the outbox
(:meth:`~ravenproxy.transport.outlet.Outlet._write_through`), and every other write on the
queued path as before: output already queued (control frames included) goes first, a write too
large for one small frame and a write while the writer is busy are queued."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ravenproxy.transport.outlet import THROUGH
from ravenproxy.transport.session import Session
from ravenproxy.wire.codes import FrameType
from tests.unit.transport.test_session import TARGET, WAIT, read_all, tunnel
from tests.unit.transport.test_session_writes import record, settle


def spy_queue(session: Session, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the DATA frames the session's outbox is given."""
    queued: list[int] = []
    outbox = session.conn.outbox
    data = outbox.data

    def counted(header: bytes, payload: Any) -> None:
        queued.append(len(payload))
        data(header, payload)

    monkeypatch.setattr(outbox, "data", counted)
    return queued


async def test_a_small_write_on_an_idle_tunnel_is_not_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        queued = spy_queue(t.cloud, monkeypatch)
        writes = record(t.cloud)
        window = t.cloud.conn.send_window(stream.id)
        assert stream.try_write(b"GET / HTTP/1.1\r\n\r\n") == 18
        assert queued == []  # written through, never queued and taken back
        assert len(writes.writes) == 1 and writes.writes[0].endswith(b"GET / HTTP/1.1\r\n\r\n")
        assert t.cloud.conn.send_window(stream.id) == window - 18  # counted as send_upto counts
        assert stream.bytes_out == 18
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"GET / HTTP/1.1\r\n\r\n"


async def test_queued_control_output_goes_before_the_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        queued = spy_queue(t.cloud, monkeypatch)
        writes = record(t.cloud)
        t.cloud.conn.ping()  # a control frame queued, not yet flushed
        ping = t.cloud.conn.outbox.pending_bytes
        assert ping > 0
        assert stream.try_write(b"after the ping") == 14
        assert queued == [14]  # the queued path: it may not overtake the PING
        assert len(writes.writes) == 1
        sent = writes.writes[0]
        # One message: the PING, then the DATA frame (a WebSocket header of 2 bytes).
        assert len(sent) == 2 + ping + 12 + 14 and sent[2] == FrameType.PING
        assert sent[2 + ping] == FrameType.DATA and sent.endswith(b"after the ping")
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"after the ping"


@pytest.mark.parametrize("size", [THROUGH, THROUGH + 1])
async def test_only_a_small_frame_skips_the_outbox(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        queued = spy_queue(t.cloud, monkeypatch)
        writes = record(t.cloud)
        payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
        assert stream.try_write(payload) == size
        assert queued == ([] if size == THROUGH else [size])
        assert len(writes.writes) == 1 and writes.writes[0].endswith(payload)
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == payload


async def test_a_write_while_the_writer_is_busy_is_queued_behind_its_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        t.cloud_ws.pause_writing()
        try:
            assert stream.try_write(b"first") == 5  # the writer's: the transport is paused
            await asyncio.sleep(0.05)  # the writer took it and waits for the drain
            assert t.cloud._wake_writer is None
        finally:
            t.cloud_ws.resume_writing()
        queued = spy_queue(t.cloud, monkeypatch)
        assert stream.try_write(b"second") in (0, 6)
        assert queued in ([], [6])
        if t.cloud._wake_writer is None:  # still busy: queued, not written through
            assert queued == [6]
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"firstsecond"


@pytest.mark.parametrize("how", ["try_write", "write"])
async def test_a_bursts_later_writes_are_queued_once_and_go_out_together(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load: the probe says more input waits in this turn, so the burst's first write is
    queued for the turn's end; the later ones (other streams) are queued behind it by the
    write-through path itself (no ``send_upto``, one set of checks), in order, and the whole
    burst goes out in one write at the turn's end."""
    async with tunnel() as t:
        streams = [await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(3)]
        await settle(t.cloud)
        queued = spy_queue(t.cloud, monkeypatch)
        upto: list[int] = []
        send_upto = t.cloud.conn.send_upto
        monkeypatch.setattr(
            t.cloud.conn, "send_upto", lambda *a: upto.append(a[0]) or send_upto(*a)
        )
        writes = record(t.cloud)
        probe = t.cloud._probe
        more = object()
        probe.soon.add(more)  # a burst's first event: more input waits in this turn
        try:
            for i, stream in enumerate(streams):
                if how == "try_write":
                    assert stream.try_write(b"request %d" % i) == 9
                else:
                    await stream.write(b"request %d" % i)  # returns at once: nothing awaited
        finally:
            probe.soon.discard(more)
        assert queued == [9, 9, 9] and upto == []
        assert writes.writes == []  # left for the turn's end
        await asyncio.sleep(0)
        assert len(writes.writes) == 1
        sent = writes.writes[0]
        assert [sent.index(b"request %d" % i) for i in range(3)] == sorted(
            sent.index(b"request %d" % i) for i in range(3)
        )
        for i, stream in enumerate(streams):
            stream.write_eof()
            assert await asyncio.wait_for(read_all(stream), WAIT) == b"request %d" % i
