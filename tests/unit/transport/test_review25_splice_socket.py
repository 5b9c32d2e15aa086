"""The agent's :class:`Splice` writing chunks as they arrive (:meth:`Splice._take`) on a real
loopback socket to a target that stops reading (written by review25 for splice3's ``_sink``,
one derived state for the four flags and the transport, since taken out again).

The agent's splice is dialled to a real TCP target (``loop.create_connection``, as the agent's
``dial_protocol``) over a real in-process tunnel session; its transport is the loop's own,
which calls ``pause_writing`` / ``resume_writing`` on the splice when its buffer passes the
high mark (:func:`~ravenproxy.transport.relay.tune`: ``READ_LIMIT``). A thin wrapper on that
transport notes the splice's state at each write. The cloud side sends more than the socket
and its buffer hold while the target reads nothing, so the socket pauses; then:

- ``eof``: the target reads again: every byte arrives once, in order, then the EOF;
- ``reset``: the cloud resets the stream while the socket is paused: the splice ends (its
  error says so), the target's socket is closed, nothing is written after;
- ``tunnel``: the tunnel's WebSocket is aborted while the socket is paused: the splice ends;
- ``target``: the target aborts its socket while the splice is paused: the splice ends and the
  cloud's stream is reset.

In each: no chunk written while the socket is paused (by its transport's word), after the
EOF was written, after the socket was lost or after the splice ended.

Holds on ebcf73b too (run there by hand). Break this catches (tried by hand on splice3's
code): ``pause_writing`` not stopping ``_take`` (chunks written while paused: 4 of 4 fail).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import pytest

from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.transport.splice import Splice
from tests.unit.transport.test_session import TARGET, WAIT, tunnel

CHUNK = 64 * 1024
TOTAL = 12 * 1024 * 1024
"""Past the socket's pause mark (``READ_LIMIT``, 1 MiB) and what the kernel buffers (sizes
kept small below), and the tunnel's stream window."""


def _pattern(total: int) -> bytes:
    block = bytes(range(251))
    return (block * (total // len(block) + 1))[:total]


class _Watched:
    """The loop's transport, noting the splice's state at each write (``log``)."""

    def __init__(self, real: asyncio.Transport, splice: _NotedSplice) -> None:
        self._real, self._splice = real, splice
        self.eof = False
        self.bad: list[str] = []
        self.writes = 0

    def write(self, data: Any) -> None:
        splice = self._splice
        if splice.paused_by_transport:
            self.bad.append("written while paused")
        if self.eof:
            self.bad.append("written after EOF")
        if splice.lost:
            self.bad.append("written after the socket was lost")
        if splice.ended:
            self.bad.append("written after the end")
        self.writes += 1
        self._real.write(data)

    def write_eof(self) -> None:
        self.eof = True
        self._real.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _NotedSplice(Splice):
    """The agent's splice; what its transport told it, noted apart from its own flags."""

    __slots__ = ("ended", "lost", "paused_by_transport", "pauses", "watched")

    def __init__(self) -> None:
        super().__init__()
        self.paused_by_transport = False
        self.pauses = 0
        self.lost = False
        self.ended = False
        self.watched: _Watched | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        self.watched = _Watched(transport, self)  # type: ignore[arg-type]
        super().connection_made(self.watched)  # type: ignore[arg-type]

    def pause_writing(self) -> None:
        self.paused_by_transport = True
        self.pauses += 1
        super().pause_writing()

    def resume_writing(self) -> None:
        self.paused_by_transport = False
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        super().connection_lost(exc)

    def _finish(self, error: str) -> None:
        super()._finish(error)
        self.ended = True


async def _until(check: Any, what: str) -> None:
    for _ in range(int(WAIT / 0.005)):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within {WAIT}s: {what}")


@pytest.mark.parametrize("ending", ["eof", "reset", "tunnel", "target"])
async def test_a_paused_socket_is_written_nothing_and_its_ends_end_the_splice(
    ending: str,
) -> None:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
        loop.create_future()
    )

    async def on_target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result((reader, writer))

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)  # (the accepted one's too)
    listener.bind(("127.0.0.1", 0))
    target = await asyncio.start_server(on_target, sock=listener, limit=8192)
    port = listener.getsockname()[1]
    spliced: asyncio.Future[tuple[_NotedSplice, asyncio.Task[Any]]] = loop.create_future()

    async def on_open(stream: TunnelStream) -> None:
        _, splice = await loop.create_connection(_NotedSplice, "127.0.0.1", port)
        stream.accept()
        splice.start(stream)
        waiting = asyncio.ensure_future(splice.wait())
        spliced.set_result((splice, waiting))
        with contextlib.suppress(Exception):
            # shielded: the session's end cancels its handlers; the splice is to end of itself
            await asyncio.shield(waiting)

    payload = _pattern(TOTAL)
    try:
        async with tunnel(on_open) as t:
            cloud = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
            splice, waiting = await asyncio.wait_for(spliced, WAIT)
            reader, writer = await asyncio.wait_for(accepted, WAIT)

            async def send() -> None:
                with contextlib.suppress(StreamClosedError):
                    for at in range(0, TOTAL, CHUNK):
                        await cloud.write(payload[at : at + CHUNK])
                    cloud.write_eof()

            sender = asyncio.create_task(send())
            await _until(lambda: splice.paused_by_transport, "the socket pauses")
            await asyncio.sleep(0.05)  # the stream's chunks keep arriving meanwhile
            assert splice.paused_by_transport
            watched = splice.watched
            assert watched is not None
            if ending == "eof":
                got = await asyncio.wait_for(reader.read(-1), WAIT * 2)  # to its EOF
                assert len(got) == TOTAL
                assert got == payload
                writer.write_eof()  # the target's end too: the splice ends with both
                await asyncio.wait_for(sender, WAIT)
                await asyncio.wait_for(asyncio.shield(waiting), WAIT)
                assert splice.result.error == "" or splice.result.error is None
                assert splice.result.bytes_down == TOTAL
                assert watched.eof
            elif ending == "reset":
                cloud.reset()
                await asyncio.wait_for(asyncio.shield(waiting), WAIT)
                assert splice.result.error
                assert await asyncio.wait_for(_read_to_end(reader), WAIT) < TOTAL
            elif ending == "tunnel":
                t.cloud_ws.transport.abort()
                await asyncio.wait_for(asyncio.shield(waiting), WAIT)
                assert splice.result.error
            else:
                writer.transport.abort()
                await asyncio.wait_for(asyncio.shield(waiting), WAIT)
                assert splice.result.error
                with pytest.raises(StreamClosedError):
                    await asyncio.wait_for(_drain_stream(cloud), WAIT)
            assert splice.pauses >= 1
            assert watched.writes > 1
            assert watched.bad == []
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, StreamClosedError):
                await sender
            cloud.close()
            writer.close()
    finally:
        target.close()
        await target.wait_closed()


async def _read_to_end(reader: asyncio.StreamReader) -> int:
    n = 0
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(1 << 20):
            n += len(data)
    return n


async def _drain_stream(stream: TunnelStream) -> None:
    while await stream.read():
        pass
    await stream.read()  # past its end: a reset stream raises
