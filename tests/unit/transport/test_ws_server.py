"""The tunnel listener (:func:`ravenproxy.transport.ws_server.serve`): websockets' server over
the socket-driven TLS transport, on loopback with the tunnel's real mutual TLS and the agent's
real dial. A tunnel opens and closes; a refused handshake is told to the observer and the
listener serves on; a client that never says a word neither holds up the others (the handshake
runs off the accept path) nor outlives the open timeout; closing stops accepting and
``wait_closed`` waits for the tunnels still up; an address in use is an error naming it."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest
from websockets.asyncio.server import Server, ServerConnection
from websockets.exceptions import ConnectionClosed

from ravenproxy.pki import init_pki
from ravenproxy.transport import tls_socket, ws_server
from ravenproxy.transport.session import websocket_options
from ravenproxy.transport.tls import follow_current, server_context
from ravenproxy.transport.ws_client import TunnelClientConnection, connect
from ravenproxy.transport.ws_server import TunnelServerConnection
from ravenproxy.wire.codes import SUBPROTOCOL
from ravenproxy.wire.config import WireConfig

from .test_listener import NoIPv6Socket
from .test_ws_connect import LOG, WAIT, dial


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki")
    init_pki(path, agents=["edge-1"])
    return path


async def echo(ws: ServerConnection) -> None:
    assert ws.transport.get_extra_info("peercert")  # the agent's verified certificate
    assert isinstance(ws, TunnelServerConnection)  # binary messages come by our frame reader
    while (batch := await ws.next_messages()) is not None:
        for message in batch:
            await ws.send(bytes(message))


def listen(
    pki: Path, handler: object = echo, **kwargs: object
) -> tuple[Server, list[ssl.SSLError]]:
    refused: list[ssl.SSLError] = []
    ctx = server_context(pki / "ca.crt", pki / "server.crt", pki / "server.key")
    server = ws_server.serve(
        handler,  # type: ignore[arg-type]
        "127.0.0.1",
        0,
        ssl=ctx,
        on_handshake_error=refused.append,
        server_header="ravenproxy",
        logger=LOG,
        **websocket_options(WireConfig()),
        **kwargs,  # type: ignore[arg-type]
    )
    return server, refused


async def test_a_tunnel_opens_echoes_and_closes(pki: Path) -> None:
    server, refused = listen(pki)
    async with server:
        port = server.sockets[0].getsockname()[1]
        client = await dial(f"wss://127.0.0.1:{port}", pki)
        try:
            assert isinstance(client.transport, tls_socket.TLSSocketTransport)
            assert client.subprotocol == SUBPROTOCOL
            assert client.response is not None
            assert client.response.headers["Server"] == "ravenproxy"
            (conn,) = server.connections
            assert isinstance(conn.transport, tls_socket.TLSSocketTransport)
            payload = bytes(range(256)) * 4096  # 1 MiB, one message
            await client.send(payload)
            got = await asyncio.wait_for(client.next_messages(), WAIT)
            assert got is not None and b"".join(bytes(m) for m in got) == payload
        finally:
            await client.close(1000, "done")
        await asyncio.wait_for(client.wait_closed(), WAIT)
    assert refused == []
    assert server.sockets == ()


async def test_a_refused_handshake_is_observed_and_the_listener_serves_on(pki: Path) -> None:
    server, refused = listen(pki)
    async with server:
        port = server.sockets[0].getsockname()[1]
        anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # no client certificate
        anonymous.load_verify_locations(pki / "ca.crt")
        with pytest.raises((ConnectionError, ssl.SSLError, OSError, EOFError, Exception)):
            ws = await connect(
                f"wss://127.0.0.1:{port}",
                ssl=anonymous,
                open_timeout=WAIT,
                user_agent_header="test",
                logger=LOG,
                **websocket_options(WireConfig()),
            )
            await ws.close()
        assert len(refused) == 1
        assert "certificate" in str(refused[0]).lower()
        client = await dial(f"wss://127.0.0.1:{port}", pki)
        await client.close()
        await asyncio.wait_for(client.wait_closed(), WAIT)
    assert len(refused) == 1


async def test_a_silent_client_holds_up_no_one_and_is_dropped_after_the_open_timeout(
    pki: Path,
) -> None:
    server, refused = listen(pki, open_timeout=1.0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        silent = socket.socket()
        silent.setblocking(False)
        try:
            await loop.sock_connect(silent, ("127.0.0.1", port))
            client = await dial(f"wss://127.0.0.1:{port}", pki)  # while the silent one waits
            await client.close()
            await asyncio.wait_for(client.wait_closed(), WAIT)
            # The open timeout ends the silent one's handshake: the server closes it.
            async with asyncio.timeout(WAIT):
                assert await loop.sock_recv(silent, 10) == b""
        finally:
            silent.close()
    assert refused == []


async def test_closing_stops_accepting_and_waits_for_the_tunnels_up(pki: Path) -> None:
    release = asyncio.Event()

    async def hold(ws: ServerConnection) -> None:
        await release.wait()

    server, _ = listen(pki, hold)
    await server
    port = server.sockets[0].getsockname()[1]
    client: TunnelClientConnection | None = None
    try:
        client = await dial(f"wss://127.0.0.1:{port}", pki)
        server.close(close_connections=False)
        closed = asyncio.create_task(server.wait_closed(), name="test-wait-closed")
        await asyncio.sleep(0.2)
        assert not closed.done()  # the tunnel is still up
        with pytest.raises(OSError):
            await dial(f"wss://127.0.0.1:{port}", pki)
        release.set()  # the handler returns: websockets closes the tunnel
        await asyncio.wait_for(closed, WAIT)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(client.recv(), WAIT)
    finally:
        release.set()
        server.close()
        await server.wait_closed()
        if client is not None:
            client.transport.abort()
            await client.wait_closed()


async def test_an_address_in_use_is_an_error_naming_it(pki: Path) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(OSError, match=r"127\.0\.0\.1"):
            await ws_server.bind("127.0.0.1", taken.getsockname()[1], 100)
    finally:
        taken.close()


async def test_every_interface_on_a_host_without_ipv6_listens_on_ipv4(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As asyncio's create_server: a family the host lacks is skipped, not a failed start."""
    monkeypatch.setattr(socket, "socket", NoIPv6Socket)
    sockets = await ws_server.bind(None, 0, 100)
    try:
        assert [s.family for s in sockets] == [socket.AF_INET]
        assert sockets[0].getsockname()[0] == "0.0.0.0"
    finally:
        for sock in sockets:
            sock.close()


async def test_no_family_at_all_is_an_error_naming_the_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "socket", NoIPv6Socket)
    with pytest.raises(OSError, match=r"::1.*Address family not supported"):
        await ws_server.bind("::1", 0, 100)


async def test_the_sni_switch_serves_the_current_credentials(pki: Path, tmp_path: Path) -> None:
    """follow_current on the listening context: each handshake gets the current context."""
    other = tmp_path / "other"
    init_pki(other, agents=["edge-1"])
    current = {"ctx": server_context(pki / "ca.crt", pki / "server.crt", pki / "server.key")}
    listening = server_context(other / "ca.crt", other / "server.crt", other / "server.key")
    follow_current(listening, lambda: current["ctx"])
    server = ws_server.serve(
        echo,
        "127.0.0.1",
        0,
        ssl=listening,
        logger=LOG,
        **websocket_options(WireConfig()),
    )
    async with server:
        port = server.sockets[0].getsockname()[1]
        # The listening context's own CA would refuse this client: the switch let it in.
        client = await dial(f"wss://127.0.0.1:{port}", pki)
        await client.close()
        await asyncio.wait_for(client.wait_closed(), WAIT)


async def test_a_tcp_health_check_is_not_a_refusal(pki: Path) -> None:
    server, refused = listen(pki)
    async with server:
        port = server.sockets[0].getsockname()[1]
        for _ in range(3):  # connect and go, as a load balancer's TCP check does
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
        client = await dial(f"wss://127.0.0.1:{port}", pki)
        await client.close()
        await asyncio.wait_for(client.wait_closed(), WAIT)
    assert refused == []
