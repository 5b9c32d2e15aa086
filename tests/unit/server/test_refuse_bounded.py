"""A refusal's or a 101's write to a client that reads nothing ends within --idle-timeout
(gendrain): ``_refuse`` and ``_switch`` awaited a bare ``writer.drain()``, so a client that
stopped reading held the connection's task, its buffers and its front slot for as long as it
kept the socket open (an answer's writes were bounded by --idle-timeout already).

The front is the server's real HTTP front (:class:`~ravenproxy.server.app.ProxyServer`'s), over
a real loopback TCP connection whose buffers are small (the client's receive buffer, the
server's send buffer) and an answer larger than they and the transport's high mark hold: the
client sends its request and reads nothing."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ravenproxy.model.inventory import parse_inventory
from ravenproxy.model.store import ModelStore
from ravenproxy.pki import init_pki
from ravenproxy.server.accept import streams
from ravenproxy.server.app import ProxyServer
from ravenproxy.server.http_proxy import HttpProxy
from ravenproxy.server.settings import ServerSettings

pytestmark = pytest.mark.timeout(60)

IDLE = 0.5
BIG = 300 * 1024  # more than the kernel's buffers (made small) and the transport's high mark

INVENTORY = """\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {name: gw}
spec:
  endpoints:
  - {nodeName: cloud-1, type: proxy}
---
apiVersion: v1
kind: Node
metadata: {name: cloud-1, labels: {raven.openyurt.io/gateway: gw}}
status:
  addresses: [{type: InternalIP, address: 127.0.0.1}]
"""


def _proxy(base: Path, *allow: str) -> HttpProxy:
    init_pki(base, ("localhost",), ())
    (base / "inv.yaml").write_text(INVENTORY)
    s = ServerSettings.from_mapping(
        {
            "inventory": str(base / "inv.yaml"),
            "ca_file": str(base / "ca.crt"),
            "cert_file": str(base / "server.crt"),
            "key_file": str(base / "server.key"),
            "node_name": "cloud-1",  # cloud-1 is dialled directly: no agent needed
            "idle_timeout": IDLE,
            "max_header_size": 2 * BIG,
            "allow": allow,
        }
    )
    return ProxyServer(s, ModelStore(parse_inventory(INVENTORY))).http_front.proxy


@contextlib.asynccontextmanager
async def _served(proxy: HttpProxy) -> AsyncIterator[tuple[socket.socket, asyncio.Task[None]]]:
    """A client socket that reads little (4 KiB receive buffer) connected to the front over
    loopback TCP, the server's side sending little (4 KiB send buffer); the front's task."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(client, listener.getsockname())
        conn, _ = listener.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        reader, writer = await streams(conn, limit=64 * 1024)
        task = asyncio.create_task(proxy.serve(reader, writer))
        try:
            yield client, task
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            writer.transport.abort()
    finally:
        client.close()
        listener.close()


async def _ends_within_idle(client: socket.socket, task: asyncio.Task[None]) -> None:
    """The front's task ends within a few --idle-timeout, the client unread and still there;
    the connection is gone (the client sees its end after what it was sent)."""
    start = time.monotonic()
    done, _ = await asyncio.wait([task], timeout=IDLE * 8)
    assert done, "the front still writes to a client that reads nothing"
    assert time.monotonic() - start >= IDLE * 0.9
    loop = asyncio.get_running_loop()
    got = 0
    with contextlib.suppress(ConnectionResetError):
        async with asyncio.timeout(5):
            while chunk := await loop.sock_recv(client, 65536):
                got += len(chunk)
    assert got < BIG  # its answer could not end whole: reset, not closed as if complete


async def test_a_refusal_to_a_client_that_reads_nothing_ends_within_idle_timeout(
    tmp_path: Path,
) -> None:
    """404 for an unknown node whose name is long: the answer says it, larger than the
    buffers."""
    name = "n" * BIG
    async with _served(_proxy(tmp_path)) as (client, task):
        request = f"GET /x HTTP/1.1\r\nHost: {name}\r\n\r\n".encode()
        await asyncio.get_running_loop().sock_sendall(client, request)
        await _ends_within_idle(client, task)


async def test_a_refusal_read_by_its_client_is_whole(tmp_path: Path) -> None:
    """The same refusal to a client that reads it in small steps: whole, saying why, then the
    connection's end (the bound is for a client that takes nothing)."""
    name = "n" * (BIG // 4)
    loop = asyncio.get_running_loop()
    async with _served(_proxy(tmp_path)) as (client, task):
        await loop.sock_sendall(client, f"GET /x HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
        answer = bytearray()
        async with asyncio.timeout(20):
            while chunk := await loop.sock_recv(client, 8192):
                answer += chunk
                await asyncio.sleep(IDLE / 25)
        assert answer.startswith(b"HTTP/1.1 404 ")
        head, _, body = bytes(answer).partition(b"\r\n\r\n")
        assert body.startswith(name.encode()) and body.endswith(b"unknown node\n")
        assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)
        client.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(task, 1.0)


async def test_a_101_to_a_client_that_reads_nothing_ends_within_idle_timeout(
    tmp_path: Path,
) -> None:
    """An upgrade the target accepts with a head larger than the buffers (cookies, say)."""
    answered = asyncio.Event()

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            + b"X-Big: "
            + b"b" * BIG
            + b"\r\n\r\n"
        )
        await writer.drain()
        answered.set()
        await reader.read()  # until the front closes it
        writer.close()

    server = await asyncio.start_server(target, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with _served(_proxy(tmp_path, f"127.0.0.1:{port}")) as (client, task):
            request = (
                f"GET /ws HTTP/1.1\r\nHost: cloud-1:{port}\r\nConnection: Upgrade\r\n"
                "Upgrade: websocket\r\n\r\n"
            ).encode()
            await asyncio.get_running_loop().sock_sendall(client, request)
            await asyncio.wait_for(answered.wait(), 5)  # the front took its 101 (no refusal)
            await _ends_within_idle(client, task)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /x HTTP/1.1\r\nHost: nowhere\r\n\r\n",
        b"CONNECT nowhere:80 HTTP/1.1\r\nHost: nowhere:80\r\n\r\ntunnel bytes sent early",
        b"POST /x HTTP/1.1\r\nHost: nowhere\r\nContent-Length: 100000\r\n\r\npart of it",
        b"GET /x HTTP/1.1\r\nHost: nowhere\r\n\r\nGET /y HTTP/1.1\r\nHost: edge\r\n\r\n",
    ],
    ids=["get", "connect-optimistic", "body-midway", "pipelined"],
)
async def test_a_refused_plain_tcp_client_gets_why_and_its_end_at_once(
    tmp_path: Path, request_bytes: bytes
) -> None:
    """Not a wait of the lingering close's 5 s silence (LINGER_TIMEOUT) for the client: on
    plain TCP the front half-closes after the refusal, so a client that reads to EOF has it
    at once, whether it has more to send or not, while it keeps its side open (the front
    lingers, reading what it still sends, until it closes: then at once too)."""
    loop = asyncio.get_running_loop()
    async with _served(_proxy(tmp_path)) as (client, task):
        start = time.monotonic()
        await loop.sock_sendall(client, request_bytes)
        answer = bytearray()
        async with asyncio.timeout(5):
            while chunk := await loop.sock_recv(client, 65536):
                answer += chunk
        assert time.monotonic() - start < 1.0
        assert answer.startswith(b"HTTP/1.1 404 ") and answer.endswith(b"unknown node\n")
        assert not task.done()  # lingering: the client's side is open
        client.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(task, 1.0)
