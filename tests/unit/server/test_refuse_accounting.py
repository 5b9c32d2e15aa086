"""How a refusal to a client that takes none of it is accounted (loose): once, by its status,
routed or not; its client's drain cut (--idle-timeout) is not also an idle ``request`` relay —
the refusal is the server's own answer, counted when it was made, not a relayed one — and a
504 (its target idle: counted once as such) is not counted idle a second time. Until this test
a routed refusal (a 502 from the target's dial, say) to such a client was counted as its status
and as an idle relay, an unrouted one (404) only as its status, and a 504 idle twice.

The front is the server's real HTTP front over a real loopback TCP connection whose kernel
buffers are filled first (the test writes into the server's side until it takes no more) and
whose transport pauses at any byte it holds (its high mark 0): a refusal of a few hundred bytes
then waits for a client that reads nothing, as one larger than the buffers would (no routed
refusal is: its body names a node and a short reason)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ravenproxy.server.accept import streams
from ravenproxy.server.http_proxy import HttpProxy
from tests.unit.server.test_refuse_bounded import IDLE, _proxy

pytestmark = pytest.mark.timeout(60)


def _sample(proxy: HttpProxy, name: str, **labels: str) -> float:
    return proxy.ctx.metrics.registry.get_sample_value(name, labels) or 0.0


def _idle(proxy: HttpProxy) -> float:
    return _sample(proxy, "ravenproxy_server_idle_timeouts_total", front="http", relay="request")


def _requests(proxy: HttpProxy, status: int) -> float:
    name = "ravenproxy_server_front_requests_total"
    return _sample(proxy, name, front="http", status=str(status))


def _fill(conn: socket.socket) -> int:
    """Write into ``conn`` until it takes no more; how much it took."""
    sent = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            sent += conn.send(b"\0" * 65536)
    return sent


@contextlib.asynccontextmanager
async def _stuck(proxy: HttpProxy, request: bytes) -> AsyncIterator[asyncio.Task[None]]:
    """``request`` sent by a client that reads nothing, to a front whose socket takes nothing
    more (its kernel buffers full) and whose transport pauses at once; the front's task."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(client, listener.getsockname())
        conn, _ = listener.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        conn.setblocking(False)
        while _fill(conn):  # until a moment later it still takes nothing (acks free room)
            await asyncio.sleep(0.05)
        reader, writer = await streams(conn, limit=64 * 1024)
        writer.transport.set_write_buffer_limits(high=0)
        task = asyncio.create_task(proxy.serve(reader, writer))
        try:
            await loop.sock_sendall(client, request)
            done, _ = await asyncio.wait([task], timeout=IDLE * 12)
            assert done, "the front still waits for a client that reads nothing"
            yield task
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            writer.transport.abort()
    finally:
        client.close()
        listener.close()


@contextlib.asynccontextmanager
async def _target(*, answer: bool) -> AsyncIterator[int]:
    """A target on cloud-1 (127.0.0.1: dialled by the server itself) that takes the request
    and never answers (``answer`` False), or a port nothing listens on (True: the dial fails)."""
    if answer:
        with socket.create_server(("127.0.0.1", 0)) as closed:
            port = closed.getsockname()[1]
        yield port
        return

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_routed_refusal_is_counted_once_by_its_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The target's dial fails (nothing listens): 502 to a client that reads nothing."""
    async with _target(answer=True) as port:
        proxy = _proxy(tmp_path, f"127.0.0.1:{port}")
        request = f"GET /x HTTP/1.1\r\nHost: cloud-1:{port}\r\n\r\n".encode()
        with caplog.at_level(logging.DEBUG, logger="ravenproxy"):
            async with _stuck(proxy, request):
                pass
    assert _requests(proxy, 502) == 1
    assert _idle(proxy) == 0
    assert "idle connection closed" not in caplog.text
    assert "the client took none of its refusal" in caplog.text


async def test_an_unrouted_refusal_is_counted_the_same_way(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = _proxy(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="ravenproxy"):
        async with _stuck(proxy, b"GET /x HTTP/1.1\r\nHost: nowhere\r\n\r\n"):
            pass
    assert _requests(proxy, 404) == 1
    assert _idle(proxy) == 0
    assert "the client took none of its refusal" in caplog.text


async def test_a_504_then_a_stuck_client_is_counted_idle_once(tmp_path: Path) -> None:
    """The target is idle (504, counted as an idle request), then the client takes none of the
    504: not counted again."""
    async with _target(answer=False) as port:
        proxy = _proxy(tmp_path, f"127.0.0.1:{port}")
        request = f"GET /x HTTP/1.1\r\nHost: cloud-1:{port}\r\n\r\n".encode()
        async with _stuck(proxy, request):
            pass
    assert _requests(proxy, 504) == 1
    assert _idle(proxy) == 1
