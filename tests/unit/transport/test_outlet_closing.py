"""What the outlet's write-through does to a tunnel transport that is closing (aborted, before
its ``connection_lost``): the write is dropped without a word, on every transport the tunnel runs
on. asyncio's own plain TCP transport drops it too, but logs "socket.send() raised exception." for
each such write from the fifth on (``LOG_THRESHOLD_FOR_CONNLOST_WRITES``): a dead peer's burst of
answers would log a warning per answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from ravenproxy.transport.session import TunnelStream
from ravenproxy.transport.tls_socket import TLSSocketTransport
from ravenproxy.transport.tunnel_stream import StreamClosedError
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import settle
from tests.unit.transport.test_websocket import contexts, pki  # noqa: F401 (a fixture)

WRITES = 10
"""Write-throughs between the abort and ``connection_lost``: asyncio logs from the fifth."""

Runner = Callable[[Coroutine[Any, Any, None]], None]
LOOPS: dict[str, Runner] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


async def _writes_after_abort(certs: Path | None) -> None:
    """The agent's end (``ws_client.connect``: the tunnel's TLS transport with ``certs``, else the
    loop's TCP one) aborted, then a stream it serves writes through it."""
    served: asyncio.Future[TunnelStream] = asyncio.get_running_loop().create_future()

    async def serve(stream: TunnelStream) -> None:
        stream.accept()
        served.set_result(stream)
        with contextlib.suppress(StreamClosedError):
            await stream.read()

    srv, cli = contexts(certs)
    async with tunnel(serve, tls=(srv, cli) if srv and cli else None) as t:
        await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        stream = await asyncio.wait_for(served, WAIT)
        await settle(t.edge)
        assert isinstance(t.edge_ws.transport, TLSSocketTransport) == (certs is not None)
        t.edge_ws.transport.abort()
        assert not t.edge_ws.data_closed  # connection_lost comes in a later callback
        for _ in range(WRITES):
            assert stream.try_write(b"dropped") == 7  # each written through, or queued
        await asyncio.wait_for(t.edge_run, WAIT)
        assert t.edge_ws.data_closed


@pytest.mark.parametrize(
    ("loop", "tls"),
    [
        pytest.param("asyncio", False, id="asyncio-tcp"),
        pytest.param("asyncio", True, id="asyncio-mtls"),
        pytest.param("uvloop", False, id="uvloop-tcp"),
        pytest.param("uvloop", True, id="uvloop-mtls"),
    ],
)
def test_writes_through_an_aborted_tunnel_log_nothing(
    pki: Path,  # noqa: F811 (the fixture)
    loop: str,
    tls: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    LOOPS[loop](_writes_after_abort(pki if tls else None))
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert logged == []
