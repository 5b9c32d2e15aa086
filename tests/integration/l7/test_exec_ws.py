"""``kubectl exec`` over WebSocket (v5.channel.k8s.io) through the upgrade path, with the real
``websockets`` client: bytes echo both ways, and closing either side closes the other."""

from __future__ import annotations

import asyncio
import json
import ssl

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.integration.l7.env import L7

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STDIN, STDOUT, ERROR = 0, 1, 3
PATH = "/exec/default/web-1/app?command=cat&stdin=true&stdout=true"


async def open_exec(l7: L7, secure: bool = False) -> ClientConnection:
    if secure:
        ctx = ssl.create_default_context(cafile=str(l7.ca))
        url = f"wss://127.0.0.1:{l7.https}{PATH}"
    else:
        ctx = None
        url = f"ws://127.0.0.1:{l7.http}{PATH}"
    ws = await connect(
        url,
        ssl=ctx,
        subprotocols=["v5.channel.k8s.io"],  # type: ignore[list-item]
        compression=None,
        proxy=None,
        max_size=None,
        open_timeout=10,
    )
    assert ws.subprotocol == "v5.channel.k8s.io"
    return ws


async def expect_stdout(ws: ClientConnection, size: int) -> bytes:
    got = b""
    while len(got) < size:
        msg = await asyncio.wait_for(ws.recv(), 10)
        assert isinstance(msg, bytes) and msg[0] == STDOUT, msg[:20]
        got += msg[1:]
    return got


@pytest.mark.parametrize("secure", [False, True], ids=["http-front", "https-terminated"])
async def test_exec_echoes_and_client_close_closes_the_kubelet_side(l7: L7, secure: bool) -> None:
    ws = await open_exec(l7, secure)
    try:
        await ws.send(bytes([STDIN]) + b"hello\n")
        assert await expect_stdout(ws, 6) == b"hello\n"
        big = bytes(range(256)) * 4096  # 1 MiB in one message, echoed back
        await ws.send(bytes([STDIN]) + big)
        assert await expect_stdout(ws, len(big)) == big
    finally:
        await asyncio.wait_for(ws.close(), 10)
    # The close went through to the kubelet, whose answering close came back.
    assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1000
    await asyncio.wait_for(ws.wait_closed(), 10)


async def test_kubelet_side_close_closes_the_client(l7: L7) -> None:
    ws = await open_exec(l7)
    await ws.send(bytes([STDIN]) + b"exit\n")
    status = await asyncio.wait_for(ws.recv(), 10)
    assert isinstance(status, bytes) and status[0] == ERROR
    assert json.loads(status[1:])["status"] == "Success"
    with pytest.raises(ConnectionClosed):
        await asyncio.wait_for(ws.recv(), 10)
    assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == 1000
    await asyncio.wait_for(ws.wait_closed(), 10)


async def test_streams_are_released_after_exec(l7: L7) -> None:
    before = (await l7.cluster.metrics())["ravenproxy_server_streams_open"]
    for _ in range(5):
        ws = await open_exec(l7)
        await ws.send(bytes([STDIN]) + b"x")
        assert await expect_stdout(ws, 1) == b"x"
        await ws.close()
    await l7.cluster.wait_metric("ravenproxy_server_streams_open", lambda v: v <= before)
