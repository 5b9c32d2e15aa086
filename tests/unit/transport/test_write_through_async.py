"""The async :meth:`TunnelStream.write`'s small write on an idle tunnel written through
(:meth:`~ravenproxy.transport.outlet.Outlet._write_through`, as ``try_write`` writes it) against
the queued path (``send_data`` then ``_flush``): the same writes, ends, resets and queued PINGs
on two tunnels, one with the write through turned off, must put the same tunnel frames on the
wire in the same order (no frame overtakes a queued one), count the same windows and deliver
the same bytes (hypothesis over generated operations)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.transport.outlet import THROUGH
from ravenproxy.transport.session import Session, StreamClosedError, TunnelStream
from ravenproxy.wire.frames import Data, Ping, decode_message
from tests.unit.transport.test_direct_write import spy_queue
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import record, settle

Op = tuple[Any, ...]


def ws_messages(written: bytes) -> list[bytes]:
    """The payloads of the unmasked WebSocket frames in what the server side wrote."""
    out: list[bytes] = []
    pos = 0
    while pos < len(written):
        length, pos = written[pos + 1] & 0x7F, pos + 2
        if length == 126:
            length, pos = int.from_bytes(written[pos : pos + 2], "big"), pos + 2
        elif length == 127:
            length, pos = int.from_bytes(written[pos : pos + 8], "big"), pos + 8
        out.append(written[pos : pos + length])
        pos += length
    return out


def frames(writes: list[bytes]) -> list[Any]:
    """The tunnel frames written, in order: a PING's random payload left out, DATA frames in a
    row of one stream as one (how a write that waits for credit is cut depends on when the
    peer returns it, on either path)."""
    got: list[Any] = []
    for message in ws_messages(b"".join(writes)):
        for frame in decode_message(message, 1 << 24):
            if isinstance(frame, Ping):
                frame = replace(frame, payload=b"")
            elif isinstance(frame, Data):
                last = got[-1] if got else None
                if isinstance(last, Data) and last.stream_id == frame.stream_id and not last.fin:
                    frame = replace(frame, data=last.data + bytes(frame.data))
                    got.pop()
                else:
                    frame = replace(frame, data=bytes(frame.data))
            got.append(frame)
    return got


def payload(n: int, kind: str) -> bytes | memoryview:
    data = bytes(range(251)) * (n // 251 + 1)
    return data[:n] if kind == "bytes" else memoryview(data)[:n]


async def run(ops: list[Op], through: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    received: list[bytes] = []

    async def sink(stream: TunnelStream) -> None:
        stream.accept()
        with contextlib.suppress(StreamClosedError):
            while data := await stream.read():
                received.append(bytes(data))

    async with tunnel(on_open=sink) as t:
        cloud: Session = t.cloud
        taken: list[int] = []
        if not through:
            monkeypatch.setattr(cloud, "_write_through", lambda sid, data: False)
        else:
            direct = cloud._write_through

            def counted(sid: Any, data: bytes | memoryview) -> bool:
                took = direct(sid, data)
                if took:
                    taken.append(len(data))
                return took

            monkeypatch.setattr(cloud, "_write_through", counted)
        stream = await asyncio.wait_for(cloud.open_stream(TARGET), WAIT)
        await settle(cloud)
        writes = record(cloud)
        outcomes: list[Any] = []
        for op in ops:
            try:
                match op:
                    case ("write", n, kind):
                        await asyncio.wait_for(stream.write(payload(n, kind)), WAIT)
                        outcomes.append("ok")
                    case ("try", n, kind):
                        outcomes.append(stream.try_write(payload(n, kind)))
                    case ("ping",):
                        cloud.conn.ping()  # queued, not flushed: a write may not overtake it
                    case ("eof",):
                        stream.write_eof()
                    case ("reset",):
                        stream.reset()
                    case ("yield",):
                        await asyncio.sleep(0)
            except StreamClosedError as exc:
                outcomes.append(("closed", exc.code))
        cloud._flush()  # a PING queued last
        await settle(cloud)
        wire = frames(writes.writes)
        # What is left of the windows depends on when the peer returned credit, not compared
        # here: tests/unit/wire/test_direct_send.py compares the counts write by write.
        state = (outcomes, stream.bytes_out)
        async with asyncio.timeout(WAIT):  # what went arrived
            while sum(map(len, received)) < stream.bytes_out and not stream.closed:
                await asyncio.sleep(0.001)
        stream.close()
        return state, wire, b"".join(received), taken


writes_ = st.tuples(
    st.sampled_from(["write", "write", "try"]),
    st.one_of(st.integers(1, 40), st.sampled_from([THROUGH, THROUGH + 1, 3000, 70_000, 300_000])),
    st.sampled_from(["bytes", "bytes", "memoryview"]),
)
ops = st.lists(
    st.one_of(
        writes_,
        st.tuples(st.just("ping")),
        st.tuples(st.just("yield")),
        st.tuples(st.just("eof")),
        st.tuples(st.just("reset")),
    ),
    max_size=12,
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=ops)
@example(ops=[("write", 18, "bytes"), ("write", 5, "bytes"), ("eof",)])
@example(ops=[("ping",), ("write", 18, "bytes"), ("write", 5, "bytes")])
@example(ops=[("write", 300_000, "bytes"), ("write", 7, "bytes"), ("eof",)])
@example(ops=[("write", 7, "bytes"), ("reset",), ("write", 7, "bytes")])
@example(ops=[("eof",), ("write", 7, "bytes")])
def test_the_async_write_through_sends_what_the_queued_path_sends(
    ops: list[Op], monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        state, wire, got, taken = asyncio.run(run(ops, True, m))
    with monkeypatch.context() as m:
        queued_state, queued_wire, queued_got, _ = asyncio.run(run(ops, False, m))
    assert state == queued_state
    assert wire == queued_wire
    if ("reset",) not in ops:  # (what a reset stream's peer read before it is a matter of time)
        assert got == queued_got
    small = [op for op in ops if op[0] == "write" and op[2] == "bytes" and op[1] <= THROUGH]
    if ops[:1] == [("write", 18, "bytes")]:
        assert taken[:1] == [18]  # an idle tunnel's first small write: written through
    assert len(taken) <= len(small) + sum(1 for op in ops if op[0] == "try")


async def test_an_async_small_write_on_an_idle_tunnel_is_not_queued(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        writes = record(t.cloud)
        window = t.cloud.conn.send_window(stream.id)
        queued = spy_queue(t.cloud, monkeypatch)
        await stream.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert queued == []  # written through, never queued and taken back
        assert len(writes.writes) == 1 and writes.writes[0].endswith(b"HTTP/1.1 200 OK\r\n\r\n")
        assert t.cloud.conn.send_window(stream.id) == window - 19
        assert stream.bytes_out == 19
