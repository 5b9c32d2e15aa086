"""The tunnel's WebSocket connections (our frame reader inside websockets' connections), on
real sockets: asyncio's loop and uvloop, plain TCP and the tunnel's mutual TLS, against each
other and against plain websockets peers."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import uvloop
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK

from ravenproxy.pki import init_pki
from ravenproxy.transport import ws_client
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.websocket import TunnelConnectionMixin
from ravenproxy.transport.ws_client import TunnelClientConnection
from ravenproxy.transport.ws_server import TunnelServerConnection

WAIT = 10.0
MAX = 1 << 20
SIZES = [0, 1, 125, 126, 65535, 65536, 300_000, MAX]
OPTIONS = {"compression": None, "ping_interval": None, "max_size": MAX}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path, agents=["edge-1"])
    return path


def contexts(pki: Path | None) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    if pki is None:
        return None, None
    srv = server_context(pki / "ca.crt", pki / "server.crt", pki / "server.key")
    cli = client_context(pki / "ca.crt", pki / "edge-1.crt", pki / "edge-1.key")
    return srv, cli


ServerSide = Callable[[ServerConnection], Awaitable[None]]


@contextlib.asynccontextmanager
async def pair(
    on_server: ServerSide,
    *,
    pki: Path | None = None,
    ours_server: bool = True,
    ours_client: bool = True,
) -> AsyncIterator[ClientConnection | TunnelClientConnection]:
    srv_ctx, cli_ctx = contexts(pki)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handler(ws: ServerConnection) -> None:
        try:
            await on_server(ws)
        finally:
            if not done.done():
                done.set_result(None)

    server_class = TunnelServerConnection if ours_server else None
    async with serve(
        handler, "127.0.0.1", 0, ssl=srv_ctx, create_connection=server_class, **OPTIONS
    ) as server:
        port = server.sockets[0].getsockname()[1]
        scheme = "wss" if pki else "ws"
        uri = f"{scheme}://127.0.0.1:{port}"
        if ours_client:  # the agent's connection (ravenproxy.transport.ws_client)
            async with await ws_client.connect(uri, ssl=cli_ctx, **OPTIONS) as ours:
                yield ours
        else:
            async with connect(
                uri,
                ssl=cli_ctx,
                server_hostname="127.0.0.1" if pki else None,
                proxy=None,
                **OPTIONS,
            ) as client:
                yield client
        await asyncio.wait_for(done, WAIT)


async def receive(
    ws: ServerConnection | ClientConnection | TunnelClientConnection, n: int
) -> list[bytes | str]:
    """``n`` messages, through our reader while it has them, then websockets."""
    got: list[bytes | str] = []
    if isinstance(ws, TunnelConnectionMixin):
        while len(got) < n and (batch := await ws.next_messages()) is not None:
            got += batch
    while len(got) < n:
        got.append(await ws.recv())
    return got


async def exchange(pki: Path | None) -> None:
    payloads = [bytes([i]) * size for i, size in enumerate(SIZES)]
    seen: dict[str, object] = {}

    async def on_server(ws: ServerConnection) -> None:
        got = await receive(ws, len(payloads))
        seen["server_got"] = got == payloads
        for message in got:
            await ws.send(message)
        # The client closes with a code and a reason: websockets still does the closing
        # handshake, and the reader hands over to it.
        assert isinstance(ws, TunnelConnectionMixin)
        seen["server_end"] = await ws.next_messages()
        with contextlib.suppress(ConnectionClosedOK):
            await ws.recv()
        rcvd = ws.protocol.close_rcvd
        seen["close"] = (rcvd.code, rcvd.reason) if rcvd else None
        seen["server_reader"] = ws.frames_handled

    async with pair(on_server, pki=pki) as client:
        assert isinstance(client, TunnelConnectionMixin)
        for message in payloads:
            await client.send(message)
        assert await asyncio.wait_for(receive(client, len(payloads)), WAIT) == payloads
        # websockets answers a PING the reader passed on.
        await asyncio.wait_for(await client.ping(b"are you there"), WAIT)
        assert client.frames_handled
        await client.close(1001, "going away now")
    assert seen == {
        "server_got": True,
        "server_end": None,
        "close": (1001, "going away now"),
        "server_reader": True,
    }


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
def test_messages_ping_and_close_on_asyncio_and_uvloop(pki: Path, tls: bool) -> None:
    for run in (asyncio.run, uvloop.run):
        run(asyncio.wait_for(exchange(pki if tls else None), 60))


async def test_a_fragmented_message_from_a_plain_client_arrives_whole() -> None:
    got: list[bytes | str] = []

    async def on_server(ws: ServerConnection) -> None:
        got.extend(await receive(ws, 2))

    async with pair(on_server, ours_client=False) as client:
        await client.send([b"a" * 70_000, b"b" * 10, b"c"])
        await client.send(b"after")
    assert got == [b"a" * 70_000 + b"b" * 10 + b"c", b"after"]


async def test_a_text_message_is_handed_to_websockets_in_order() -> None:
    got: list[bytes | str] = []

    async def on_server(ws: ServerConnection) -> None:
        got.extend(await receive(ws, 3))

    async with pair(on_server, ours_client=False) as client:
        await client.send(b"first")
        await client.send("text")
        await client.send(b"then binary")
    assert got == [b"first", "text", b"then binary"]


async def test_a_message_over_max_size_closes_with_1009() -> None:
    async def on_server(ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            await receive(ws, 1)

    async with pair(on_server, ours_client=False) as client:
        await client.send(bytes(MAX + 1))
        with pytest.raises(ConnectionClosed) as raised:
            await asyncio.wait_for(client.recv(), WAIT)
    assert raised.value.rcvd is not None and raised.value.rcvd.code == 1009


async def test_a_fragmented_message_over_max_size_closes_with_1009() -> None:
    async def on_server(ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            await receive(ws, 1)

    async with pair(on_server, ours_client=False) as client:
        await client.send([bytes(MAX), b"one too many"])
        with pytest.raises(ConnectionClosed) as raised:
            await asyncio.wait_for(client.recv(), WAIT)
    assert raised.value.rcvd is not None and raised.value.rcvd.code == 1009


async def test_our_client_reads_a_plain_server() -> None:
    async def on_server(ws: ServerConnection) -> None:
        for size in SIZES:
            await ws.send(bytes(size))
        await ws.send([b"x" * 100, b"y"])

    async with pair(on_server, ours_server=False) as client:
        got = await asyncio.wait_for(receive(client, len(SIZES) + 1), WAIT)
        assert isinstance(client, TunnelConnectionMixin) and client.frames_handled
    assert got == [bytes(size) for size in SIZES] + [b"x" * 100 + b"y"]


async def test_a_reader_that_does_not_read_pauses_the_socket() -> None:
    """At most max_queue messages wait in memory; the rest stays in the kernel and the sender
    blocks, as with websockets' own reader."""
    release = asyncio.Event()
    got: list[bytes | str] = []

    async def on_server(ws: ServerConnection) -> None:
        await release.wait()
        got.extend(await receive(ws, 64))

    async with pair(on_server, ours_client=False) as client:
        sent = 0
        with contextlib.suppress(TimeoutError):
            while sent < 64:
                await asyncio.wait_for(client.send(bytes(MAX)), 1.0)
                sent += 1
        assert sent < 64, "the server buffered every message"
        release.set()
        while sent < 64:
            await client.send(bytes(MAX))
            sent += 1
    assert len(got) == 64


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
async def test_an_idle_connection_holds_no_read_buffer_and_no_handshake_headers(
    pki: Path, tls: bool
) -> None:
    """Idle (small reads, all parsed): the reader lets its buffer go and reads into the shared
    scratch; a frame that read only begins is kept in a buffer of its own and arrives whole.
    The handshake's headers, let go, leave PING and the closing handshake working."""
    idle: list[int] = []
    got: list[bytes | str] = []
    sizes = [10, 10_000, 3, 300_000, 5]

    async def on_server(ws: ServerConnection) -> None:
        assert isinstance(ws, TunnelConnectionMixin)
        ws.forget_handshake()
        assert ws.request is not None and not ws.request.headers
        got.extend(await receive(ws, 1))
        idle.append(ws.read_buffer_size)
        got.extend(await receive(ws, len(sizes)))
        with contextlib.suppress(ConnectionClosedOK):
            await ws.recv()

    async with pair(on_server, pki=pki if tls else None) as client:
        assert isinstance(client, TunnelConnectionMixin)
        client.forget_handshake()
        await client.send(b"small")
        while not idle:
            await asyncio.sleep(0.01)
        for i, size in enumerate(sizes):
            await client.send(bytes([i]) * size)
            await asyncio.sleep(0.05)  # each message on an idle connection
        await asyncio.wait_for(await client.ping(b"still there"), WAIT)
        await client.close(1001, "bye")
    assert idle == [0]
    assert got == [b"small"] + [bytes([i]) * size for i, size in enumerate(sizes)]


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
async def test_a_bulk_transfer_keeps_its_buffer_between_messages_and_gives_it_back_after(
    pki: Path, tls: bool
) -> None:
    """A drained buffer that fits the frames being received is kept while they keep coming:
    given back after each large message, it was allocated again (zeroed) for the next and its
    first read copied into it. Once messages are small again, the buffer shrinks."""
    sizes: list[int] = []
    bulk, small = 6, 3

    async def on_server(ws: ServerConnection) -> None:
        assert isinstance(ws, TunnelConnectionMixin)
        for _ in range(bulk + small):
            [message] = await receive(ws, 1)
            sizes.append(ws.read_buffer_size)  # drained: the sender waits for our answer
            await ws.send(len(message).to_bytes(4, "big"))
        with contextlib.suppress(ConnectionClosedOK):
            await ws.recv()

    async with pair(on_server, pki=pki if tls else None) as client:
        for size in [MAX] * bulk + [100] * small:
            await client.send(bytes(size))
            [answer] = await asyncio.wait_for(receive(client, 1), WAIT)
            assert answer == size.to_bytes(4, "big")
        await client.close()
    assert all(size > MAX for size in sizes[:bulk]), sizes
    assert all(size <= MAX // 4 for size in sizes[bulk:]), sizes


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
async def test_lent_messages_stay_intact_while_held(pki: Path, tls: bool) -> None:
    """The client side receives large messages as views of its read buffer (no copy): a buffer
    is read into again only once no view of it is held, so messages kept while many more
    arrive are all intact; once let go, their buffers are read into again."""
    count = 24
    payloads = [bytes([i]) * (MAX if i % 2 else 300_000) for i in range(count)]

    async def on_server(ws: ServerConnection) -> None:
        for message in payloads:
            await ws.send(message)
        with contextlib.suppress(ConnectionClosedOK):
            await ws.recv()

    async with pair(on_server, pki=pki if tls else None) as client:
        assert isinstance(client, TunnelConnectionMixin)
        got = await asyncio.wait_for(receive(client, count), WAIT)
        assert any(isinstance(m, memoryview) and m.readonly for m in got)
        assert got == payloads
        buffers = {id(m.obj) for m in got if isinstance(m, memoryview)}
        assert len(buffers) > 1  # held views made the reader move on to other buffers
        await client.close()


class _WriteRaises:
    """A transport whose ``write`` sends the bytes, then raises (as a transport closed under the
    write does: uvloop's once its handle is closed, asyncio's after ``write_eof``)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        self._transport.write(data)
        raise RuntimeError("the transport closed under the write")

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


def _close_whose_write_raises(ws: TunnelConnectionMixin) -> tuple[bool, bool]:
    """``data_closed`` before and after a CLOSE whose write raised."""
    before = ws.data_closed
    transport = ws.transport
    ws.transport = _WriteRaises(transport)  # type: ignore[assignment]
    try:
        ws.protocol.send_close(1000, "bye")
        with pytest.raises(RuntimeError, match="closed under the write"):
            ws.send_data()
    finally:
        ws.transport = transport
    return before, ws.data_closed


@pytest.mark.parametrize("side", ["server", "client"])
async def test_a_close_whose_write_raised_still_says_no_data_may_follow(side: str) -> None:
    """``data_closed`` is kept where websockets' output leaves (``send_data``) on every exit:
    the CLOSE left OPEN before its write raised, and the flag would otherwise stay unset (and a
    write-through follow it) until ``connection_lost``."""

    flags: list[tuple[bool, bool]] = []

    async def on_server(ws: ServerConnection) -> None:
        assert isinstance(ws, TunnelConnectionMixin)
        if side == "server":
            flags.append(_close_whose_write_raises(ws))
        with contextlib.suppress(ConnectionClosed):
            await ws.recv()

    async with pair(on_server) as client:
        assert isinstance(client, TunnelConnectionMixin)
        if side == "client":
            flags.append(_close_whose_write_raises(client))
        with contextlib.suppress(ConnectionClosed):
            await asyncio.wait_for(client.recv(), WAIT)
    # What the outlet asks before a write-through: no DATA after that CLOSE, even so.
    assert flags == [(False, True)]
