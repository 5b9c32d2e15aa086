"""A tunnel connection's attribute loads stay specialized (see reader_state.py): Python 3.11
keeps an instance's attributes in shared-key values only up to 29 of them; a connection that
sets more gets a dict of its own, on which every attribute load takes the slower hinted lookup
and no method load specializes. The reader's state is in a slotted object of its own, so both
ends' connections (websockets' server connection with our reader, the agent's own client)
stay under the bound, and the reader's loads are slot loads."""

from __future__ import annotations

import asyncio
import dis
import sys
from pathlib import Path

import pytest

from ravenproxy.transport.reader_state import ReaderState
from ravenproxy.transport.tls_socket import TLSSocketTransport
from ravenproxy.transport.websocket import TunnelConnectionMixin
from tests.unit.transport.test_session import TARGET, WAIT, read_all, tunnel
from tests.unit.transport.test_websocket import contexts, pki  # noqa: F401 (a fixture)


# One function each: a load specializes for one type (another's misses it).
def _load_cloud(ws: TunnelConnectionMixin) -> object:
    return ws.data_closed


def _load_edge(ws: TunnelConnectionMixin) -> object:
    return ws.data_closed


def _load_state(state: ReaderState) -> object:
    return state.buf


def loaded_by(function: object, arg: object) -> str:
    """The specialized form of ``function``'s one attribute load, once run on ``arg``."""
    for _ in range(64):  # past the adaptive counter: the load specializes, or gives up
        function(arg)  # type: ignore[operator]
    [load] = [i for i in dis.get_instructions(function, adaptive=True) if "ATTR" in i.opname]
    return load.opname


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="Python 3.11's specializations")
async def test_both_ends_connections_keep_their_attributes_in_shared_key_values() -> None:
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert stream.try_write(b"ping") == 4
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"ping"
        for load, ws in ((_load_cloud, t.cloud_ws), (_load_edge, t.edge_ws)):
            # (vars() only after the look: it makes the dict)
            assert loaded_by(load, ws) == "LOAD_ATTR_INSTANCE_VALUE", (
                f"{type(ws).__name__} sets {len(vars(ws))} attributes: at most 29 stay in "
                "shared-key values (keep the reader's state in ReaderState)"
            )
            assert loaded_by(_load_state, ws._rd) == "LOAD_ATTR_SLOT"


def _load_transport(transport: TLSSocketTransport) -> object:
    return transport._queued


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="Python 3.11's specializations")
async def test_the_tls_transport_keeps_its_attributes_in_shared_key_values(
    pki: Path,  # noqa: F811 (the fixture)
) -> None:
    """The TLS transport's attributes too (both ends, every read and write): its rare state
    (a close underway, the peer's EOF, a read scheduled) is the class's until set."""
    srv, cli = contexts(pki)
    async with tunnel(tls=(srv, cli)) as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        assert stream.try_write(b"ping") == 4
        stream.write_eof()
        assert await asyncio.wait_for(read_all(stream), WAIT) == b"ping"
        transport = t.edge_ws.transport
        assert isinstance(transport, TLSSocketTransport)
        assert loaded_by(_load_transport, transport) == "LOAD_ATTR_INSTANCE_VALUE", (
            f"TLSSocketTransport sets {len(vars(transport))} attributes: at most 29 stay in "
            "shared-key values (give the rare ones class defaults)"
        )
