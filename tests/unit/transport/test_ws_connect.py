"""The agent's WebSocket dial (:func:`ravenproxy.transport.ws_client.connect`, websockets'
sans-I/O client protocol without its asyncio client module), on real sockets: the tunnel's
mutual TLS against the server's connection class, and raw servers that answer the opening
handshake wrongly, late or not at all. Each failure is the error websockets' own client
raised, and the agent's log line for it says the same as before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import InvalidHandshake, InvalidMessage, InvalidStatus
from websockets.http11 import Request, Response
from websockets.utils import accept_key

from ravenproxy.agent.slot import describe_connect_error
from ravenproxy.pki import init_pki
from ravenproxy.transport.session import websocket_options
from ravenproxy.transport.tls import client_context, server_context
from ravenproxy.transport.ws_client import TunnelClientConnection, connect
from ravenproxy.wire.codes import SUBPROTOCOL
from ravenproxy.wire.config import WireConfig

WAIT = 10.0
LOG = logging.getLogger("tests.ws_connect")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path, agents=["edge-1"])
    return path


async def dial(uri: str, pki: Path | None, open_timeout: float = WAIT) -> TunnelClientConnection:
    """What the agent's slot does (agent/slot.py), with the test's certificates."""
    ctx = client_context(pki / "ca.crt", pki / "edge-1.crt", pki / "edge-1.key") if pki else None
    return await connect(
        uri,
        ssl=ctx,
        open_timeout=open_timeout,
        user_agent_header="ravenproxy-agent/edge-1",
        logger=LOG,
        **websocket_options(WireConfig()),
    )


async def test_a_tunnel_opens_over_mutual_tls_and_closes_with_its_code(pki: Path) -> None:
    seen: dict[str, object] = {}

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        seen["user_agent"] = ws.request.headers.get("User-Agent")
        seen["subprotocol"] = ws.subprotocol
        await ws.send(b"hello")
        with contextlib.suppress(Exception):
            await ws.recv()
        rcvd = ws.protocol.close_rcvd
        seen["close"] = (rcvd.code, rcvd.reason) if rcvd else None

    srv = server_context(pki / "ca.crt", pki / "server.crt", pki / "server.key")
    options = websocket_options(WireConfig())
    async with serve(handler, "127.0.0.1", 0, ssl=srv, **options) as server:
        port = server.sockets[0].getsockname()[1]
        client = await dial(f"wss://127.0.0.1:{port}", pki)
        try:
            assert client.subprotocol == SUBPROTOCOL
            got = await asyncio.wait_for(client.next_messages(), WAIT)
            assert got == [b"hello"] and client.frames_handled
        finally:
            await client.close(1000, "done")
        await asyncio.wait_for(client.wait_closed(), WAIT)
    assert seen == {
        "user_agent": "ravenproxy-agent/edge-1",
        "subprotocol": SUBPROTOCOL,
        "close": (1000, "done"),
    }


async def test_a_refused_upgrade_is_the_status_the_server_answered() -> None:
    def refuse(connection: ServerConnection, request: Request) -> Response:
        return connection.respond(HTTPStatus.FORBIDDEN, "no\n")

    async def handler(ws: ServerConnection) -> None:
        raise AssertionError("the upgrade was refused")

    options = websocket_options(WireConfig())
    async with serve(handler, "127.0.0.1", 0, process_request=refuse, **options) as server:
        port = server.sockets[0].getsockname()[1]
        with pytest.raises(InvalidStatus) as raised:
            await dial(f"ws://127.0.0.1:{port}", None)
    assert raised.value.response.status_code == 403
    assert describe_connect_error(raised.value) == "server answered HTTP 403"


# -- raw servers: what a broken or hostile peer answers -----------------------------------------
Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(answer: Answer) -> AsyncIterator[tuple[int, list[bytes]]]:
    """A TCP server that reads the request head, then lets ``answer`` write what it wants;
    it then reads until the client goes (the list gets what came after the head). On exit
    the connections it had are over (the client hung up: the test is that it does)."""
    after: list[bytes] = []
    handlers: list[asyncio.Task[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.append(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await answer(head, writer)
            after.append(await reader.read())
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], after
        await asyncio.wait_for(asyncio.gather(*handlers), WAIT)
    finally:
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        server.close()
        await server.wait_closed()


def switching(head: bytes, accept: str | None = None, protocol: str = SUBPROTOCOL) -> bytes:
    found = re.search(rb"Sec-WebSocket-Key: (\S+)", head)
    assert found is not None
    key = accept if accept is not None else accept_key(found.group(1).decode())
    headers = Headers(
        Upgrade="websocket",
        Connection="Upgrade",
        **{"Sec-WebSocket-Accept": key, "Sec-WebSocket-Protocol": protocol},
    )
    return b"HTTP/1.1 101 Switching Protocols\r\n" + headers.serialize()


async def test_a_wrong_accept_key_fails_the_handshake_and_the_connection() -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(switching(head, accept="d3JvbmcgYWNjZXB0IGtleQ=="))

    async with raw_server(answer) as (port, after):
        with pytest.raises(InvalidHandshake, match="Sec-WebSocket-Accept") as raised:
            await dial(f"ws://127.0.0.1:{port}", None)
    assert describe_connect_error(raised.value).startswith("WebSocket handshake failed: ")
    assert after == [b""], "the connection was not closed at once"


async def test_an_unexpected_subprotocol_fails_the_handshake() -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(switching(head, protocol="other.v9"))

    async with raw_server(answer) as (port, _):
        with pytest.raises(InvalidHandshake, match=r"other\.v9"):
            await dial(f"ws://127.0.0.1:{port}", None)


async def test_a_server_that_closes_without_answer_is_told_as_a_refused_certificate() -> None:
    """What a TLS 1.3 server that rejects the agent's certificate looks like to the agent."""

    async def answer(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with raw_server(answer) as (port, _):
        with pytest.raises(InvalidMessage) as raised:
            await dial(f"ws://127.0.0.1:{port}", None)
    assert isinstance(raised.value.__cause__, EOFError)
    assert "closed the connection during the handshake" in describe_connect_error(raised.value)


async def test_a_server_that_never_answers_times_out_and_is_hung_up_on() -> None:
    async def answer(head: bytes, writer: asyncio.StreamWriter) -> None:
        pass  # the head is read; nothing is answered

    async with raw_server(answer) as (port, after):
        with pytest.raises(TimeoutError, match="opening handshake") as raised:
            await dial(f"ws://127.0.0.1:{port}", None, open_timeout=0.3)
    assert after == [b""], "the connection was not closed"
    assert describe_connect_error(raised.value) == "timed out"


async def test_the_scheme_and_the_ssl_context_must_agree(pki: Path) -> None:
    with pytest.raises(ValueError, match="wss:// needs an ssl context"):
        await dial("wss://127.0.0.1:1", None)
    with pytest.raises(ValueError, match="ws:// takes none"):
        await dial("ws://127.0.0.1:1", pki)
