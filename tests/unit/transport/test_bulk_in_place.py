"""Bulk through a real session pair (loopback WebSocket, default limits), on several streams at
once as the relay sends it: the receiver keeps bulk DATA in place, as views of its read buffer,
and every such view is a large share of the buffer it keeps alive (the bound on memory pinned
by held views, ``frames.IN_PLACE_SHARE``)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from pathlib import Path

import pytest

from ravenproxy.transport.session import StreamClosedError, TunnelStream
from ravenproxy.wire.frames import IN_PLACE_SHARE
from ravenproxy.wire.outbox import OWN_MESSAGE
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_websocket import contexts, pki  # noqa: F401 (a fixture)

STREAMS = 8
EACH = 8 << 20
WRITE = 1 << 20  # what the relay's lent socket reads hand the tunnel at most


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "mtls"])
async def test_bulk_is_received_in_place_and_views_pin_a_bounded_buffer(
    pki: Path,  # noqa: F811 (the fixture)
    tls: bool,
) -> None:
    payload = os.urandom(EACH)
    chunks: list[bytes | memoryview] = []
    digests: list[bytes] = []

    async def sink(stream: TunnelStream) -> None:
        stream.accept()
        h = hashlib.sha256()
        while chunk := await stream.read():
            h.update(chunk)
            # Held to the end, as a stalled consumer holds them (the stream's credit is
            # returned as it is read, so this reads on).
            chunks.append(chunk)
        digests.append(h.digest())
        stream.write_eof()
        with contextlib.suppress(StreamClosedError):
            await stream.read()

    async def send(stream: TunnelStream) -> None:
        view = memoryview(payload).toreadonly()
        for pos in range(0, EACH, WRITE):
            await stream.write(view[pos : pos + WRITE])
        stream.write_eof()
        with contextlib.suppress(StreamClosedError):
            await stream.read()

    srv, cli = contexts(pki if tls else None)
    async with tunnel(on_open=sink, tls=(srv, cli) if srv and cli else None) as t:
        streams = [
            await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT) for _ in range(STREAMS)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*map(send, streams)), 4 * WAIT)
        finally:
            for stream in streams:
                stream.close()
    assert digests == [hashlib.sha256(payload).digest()] * STREAMS

    in_place = [c for c in chunks if isinstance(c, memoryview)]
    for chunk in in_place:
        assert chunk.readonly
        kept_alive = memoryview(chunk.obj).nbytes  # type: ignore[arg-type]
        assert kept_alive <= IN_PLACE_SHARE * len(chunk), (kept_alive, len(chunk))
    bulk = sum(len(c) for c in chunks if len(c) >= OWN_MESSAGE)
    kept = sum(len(c) for c in in_place)
    # Bulk frames are each alone in their message: nearly all the bulk stays in place (when
    # they were batched, most of it was copied).
    assert kept >= 0.9 * bulk, (kept, bulk)
    assert bulk >= STREAMS * EACH // 2, bulk
