"""Review of splice3 on the server's side: :class:`FrontSplice` (moved to front_splice.py, its
``_pull`` asking ``_over`` and the socket's ``lost`` attribute, its chunks by ``_take``) on a
real front socket (:class:`SocketStream`, as the fronts accept) whose client stops reading.

The cloud's target floods the stream; the client reads nothing, so the front's transport
passes its high mark and the SocketStream passes ``pause_writing`` on to the splice. A thin
wrapper on the front's transport notes, at each write, whether the transport had said it was
paused (the SocketStream's ``write_paused``), had been written its EOF, or the splice had
ended. Then:

- ``read``: the client reads again: every byte arrives once, in order, then the EOF;
- ``reset``: the target resets the stream while the socket is paused: the splice ends;
- ``client``: the client resets its socket (SO_LINGER 0) while paused: the splice ends and the
  target's stream is reset;
- ``tunnel``: the tunnel's WebSocket is aborted while paused: the splice ends.

Holds on ebcf73b too (run there by hand). Break this catches (tried by hand on splice3's
code): ``pause_writing`` not stopping ``_take`` (chunks written while the front is paused).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from typing import Any

import pytest

from ravenproxy.transport import front_splice
from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.transport.socket_stream import SocketStream
from tests.unit.transport.test_front_splice import front
from tests.unit.transport.test_session import WAIT

CHUNK = 64 * 1024
TOTAL = 24 * 1024 * 1024
"""Past the front's pause mark (``READ_LIMIT``, 1 MiB), the kernel's buffers on both ends and
the tunnel's stream window."""


def _pattern(total: int) -> bytes:
    block = bytes(range(251))
    return (block * (total // len(block) + 1))[:total]


class _Watched:
    def __init__(self, real: Any, sock: SocketStream, splice: _NotedFrontSplice) -> None:
        self._real, self._sock, self._splice = real, sock, splice
        self.eof = False
        self.bad: list[str] = []
        self.writes = 0

    def write(self, data: Any) -> None:
        if self._sock.write_paused:
            self.bad.append("written while paused")
        if self.eof:
            self.bad.append("written after EOF")
        if self._splice.ended:
            self.bad.append("written after the end")
        self.writes += 1
        self._real.write(data)

    def write_eof(self) -> None:
        self.eof = True
        self._real.write_eof()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _NotedFrontSplice(front_splice.FrontSplice):
    __slots__ = ("ended", "pauses", "watched")
    made: list[_NotedFrontSplice] = []

    def __init__(self, sock: SocketStream, idle_timeout: float | None) -> None:
        super().__init__(sock, idle_timeout)
        self.ended = False
        self.pauses = 0
        self.watched = _Watched(sock.transport, sock, self)
        self.transport = self.watched  # type: ignore[assignment]
        _NotedFrontSplice.made.append(self)

    def pause_writing(self) -> None:
        self.pauses += 1
        super().pause_writing()

    def _finish(self, error: str) -> None:
        super()._finish(error)
        self.ended = True


async def _until(check: Any, what: str) -> None:
    for _ in range(int(WAIT / 0.005)):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within {WAIT}s: {what}")


@pytest.mark.parametrize("ending", ["read", "reset", "client", "tunnel"])
async def test_a_paused_front_is_written_nothing_and_its_ends_end_the_splice(
    ending: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(front_splice, "FrontSplice", _NotedFrontSplice)
    _NotedFrontSplice.made.clear()
    payload = _pattern(TOTAL)
    target: asyncio.Future[TunnelStream] = asyncio.get_running_loop().create_future()

    async def flood(stream: TunnelStream) -> None:
        stream.accept()
        target.set_result(stream)
        with contextlib.suppress(StreamClosedError):
            for at in range(0, TOTAL, CHUNK):
                await stream.write(payload[at : at + CHUNK])
            stream.write_eof()
            while await stream.read():
                pass

    async with front(flood) as (f,):
        stream = await asyncio.wait_for(target, WAIT)
        (splice,) = _NotedFrontSplice.made
        await _until(lambda: f.sock.write_paused, "the front pauses")
        await asyncio.sleep(0.05)  # the stream's chunks keep arriving meanwhile
        assert f.sock.write_paused
        watched = splice.watched
        loop = asyncio.get_running_loop()
        if ending == "read":
            got = bytearray()
            while data := await asyncio.wait_for(loop.sock_recv(f.client, 1 << 20), WAIT):
                got += data
            assert len(got) == TOTAL
            assert bytes(got) == payload
            f.client.shutdown(socket.SHUT_WR)
            result = await f.result()
            assert result.error == ""
            assert result.bytes_down == TOTAL
            assert watched.eof
        elif ending == "reset":
            stream.reset()
            result = await f.result()
            assert result.error
        elif ending == "client":
            f.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            f.client.close()
            result = await f.result()
            assert result.error
            with pytest.raises(StreamClosedError):
                for _ in range(10_000):
                    await asyncio.wait_for(stream.read(), WAIT)
        else:
            tunnel_ws = _tunnel_transport(stream)
            tunnel_ws.abort()
            result = await f.result()
            assert result.error
        assert splice.pauses >= 1
        assert watched.writes > 1
        assert watched.bad == []


def _tunnel_transport(stream: TunnelStream) -> Any:
    """The edge side's WebSocket transport, under the target's stream (aborted: the tunnel
    goes, as the cloud side sees it)."""
    return stream.session.ws.transport
