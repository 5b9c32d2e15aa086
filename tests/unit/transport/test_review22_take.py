"""Review of branch agentside's splice change: a chunk that arrives on the stream while it holds
none is offered to :meth:`Splice._take` and written to the socket as it comes
(:meth:`TunnelStream.on_readable`'s ``take``), not held, called back for and read back by
:meth:`Splice._readable`.

Differentially, on real sessions over a loopback WebSocket: the same generated traffic — chunks
the cloud side writes, its end, its reset; the socket's write buffer passing its high mark
(``pause_writing`` from inside ``write``, as asyncio's transports call it) and draining; a
socket write that fails; the socket lost — goes to a splice as the branch starts it and to one
started as 812de76 started it (``_OldSplice.start``, verbatim: ``on_readable`` without
``take``). After each step the socket was written the same chunks, in the same order, with the
same EOF; at the end the splice's result (bytes down, error), its state, the stream's count of
bytes read and what it holds, and the credit the cloud side got back are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.transport.splice import Splice
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import settle


class _OldSplice(Splice):
    """812de76's :meth:`Splice.start`, verbatim."""

    def start(self, stream: TunnelStream) -> None:
        """Splice ``stream`` (accepted) to the socket: what the socket sent meanwhile goes up."""
        self.stream = stream
        stream.on_readable(self._readable)
        if self._pending and self._sender is None and not self._done.done():
            self._send_pending()
        self._send_eof()
        self._readable(drain=True)


class _Socket:
    """A dialled socket's transport: keeps what is written; past ``high`` buffered bytes it
    pauses the protocol from inside ``write`` (as asyncio's do); :meth:`drain` empties it and
    resumes it; a write can be made to fail."""

    def __init__(self, high: int) -> None:
        self.protocol: Splice | None = None
        self.written: list[bytes] = []
        self.eof = False
        self.high = high
        self.buffered = 0
        self.paused = False
        self.fail_next = False
        self.closing = False

    def write(self, data: bytes | memoryview) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError("boom")
        self.written.append(bytes(data))
        self.buffered += len(data)
        if self.buffered > self.high and not self.paused:
            self.paused = True
            assert self.protocol is not None
            self.protocol.pause_writing()

    def drain(self) -> None:
        self.buffered = 0
        if self.paused:
            self.paused = False
            assert self.protocol is not None
            self.protocol.resume_writing()

    def can_write_eof(self) -> bool:
        return True

    def is_closing(self) -> bool:
        return self.closing

    def write_eof(self) -> None:
        self.eof = True

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


Op = tuple[Any, ...]
_OPS = st.one_of(
    st.tuples(st.just("send"), st.binary(min_size=1, max_size=3000)),
    st.tuples(st.just("send"), st.binary(min_size=1, max_size=40)),
    st.tuples(st.sampled_from(["drain", "fail", "eof", "reset", "lost", "wait"])),
)


async def _run(cls: type[Splice], ops: list[Op], high: int) -> list[Any]:
    seen: list[Any] = []
    ready: asyncio.Future[tuple[Splice, TunnelStream, _Socket]] = (
        asyncio.get_running_loop().create_future()
    )

    async def on_open(stream: TunnelStream) -> None:
        stream.accept()
        splice, sock = cls(), _Socket(high)
        sock.protocol = splice
        splice.transport = sock  # type: ignore[assignment]
        splice.start(stream)
        ready.set_result((splice, stream, sock))
        await asyncio.sleep(WAIT * 4)

    async with tunnel(on_open) as t:
        cloud = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        splice, edge, sock = await asyncio.wait_for(ready, WAIT)
        ended = False
        for op in ops:
            kind = op[0]
            if kind == "send" and not ended:
                with contextlib.suppress(StreamClosedError):
                    await asyncio.wait_for(cloud.write(op[1]), 0.5)
            elif kind == "eof" and not ended:
                cloud.write_eof()
                ended = True
            elif kind == "reset" and not ended:
                cloud.reset()
                ended = True
            elif kind == "drain":
                sock.drain()
            elif kind == "fail":
                sock.fail_next = True
            elif kind == "lost" and not splice._lost:
                splice.connection_lost(None)
            await settle(t.cloud)
            await asyncio.sleep(0.003 if kind != "wait" else 0.03)
            seen.append((op[0], list(sock.written), sock.eof, splice._over, edge.bytes_in))
        await asyncio.sleep(0.03)
        sid = cloud.id
        window = t.cloud.conn.send_window(sid) if sid in t.cloud.conn.streams else None
        held = t.edge.conn.streams.get(edge.id)  # the credit not yet returned, and returned
        recv = (held.recv.available, held.recv.unacked) if held is not None else None
        edge_conn = (t.edge.conn._conn_recv.available, t.edge.conn._conn_recv.unacked)
        seen.append(
            (
                splice.result.bytes_down,
                splice.result.error,
                splice._over,
                splice._down_done,
                splice._write_paused,
                edge.bytes_in,
                edge.buffered,
                window,
                t.cloud.conn._conn_send.available,
                recv,
                edge_conn,
            )
        )
        if not ended:
            cloud.reset()
    return seen


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_OPS, min_size=1, max_size=12), st.sampled_from([10, 2000, 1 << 20]))
@example([("send", b"a" * 50), ("send", b"b"), ("drain",), ("send", b"c"), ("eof",)], 10)
@example([("fail",), ("send", b"a"), ("send", b"b")], 1 << 20)
@example([("send", b"a" * 50), ("send", b"b"), ("reset",), ("drain",)], 10)
@example([("lost",), ("send", b"a"), ("send", b"b")], 1 << 20)
def test_take_passes_chunks_on_as_812de76s_callback_did(ops: list[Op], high: int) -> None:
    async def both() -> tuple[list[Any], list[Any]]:
        return await _run(_OldSplice, ops, high), await _run(Splice, ops, high)

    old, new = asyncio.run(both())
    assert new == old
