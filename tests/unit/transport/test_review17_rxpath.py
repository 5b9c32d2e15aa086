"""Review of the rxpath cuts (issue 15): the guarantees each moved, pinned where they now live.

- The outlet asks the reader's ``data_closed`` (not websockets' state) before writing through:
  it must be set on every way out of OPEN, our parser's protocol error and the peer's EOF
  included, before any later write-through.
- ``one_small`` joins the frame in one go: the same bytes :func:`batched` makes.
- The parser compares the MASK bit with the side's bit: the same verdict as ``bool() != masked``.
- The TLS transport's read readiness calls ``_read(True)``: while reading is paused nothing is
  delivered; a buffer the protocol lends as a memoryview is held by no view once delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from ravenproxy.transport.frame_batch import COALESCE, batched, one_small
from ravenproxy.transport.tunnel_stream import StreamClosedError
from ravenproxy.transport.wsframes import MESSAGE, Failure, FrameParser, Handover
from tests.unit.transport.test_session import TARGET, WAIT, tunnel
from tests.unit.transport.test_session_writes import record, settle
from tests.unit.transport.test_tls_socket import Recorder, blob, connected
from tests.unit.transport.test_tls_socket import pki as pki

# -- data_closed: every way out of OPEN ----------------------------------------------------------


async def _left_open(ws: object) -> None:
    async with asyncio.timeout(WAIT):
        while ws.protocol.state is State.OPEN:  # type: ignore[attr-defined]
            await asyncio.sleep(0)


@pytest.mark.parametrize(
    "end",
    [
        "a text frame (our parser's protocol error)",
        "an unmasked frame from the client (the MASK bit)",
        "the peer's EOF without a CLOSE",
    ],
)
async def test_no_data_is_written_through_once_the_websocket_left_open(end: str) -> None:
    """The server's reader fails the connection itself (websockets' fail(), then our
    send_data) or websockets takes the peer's EOF: in the callback that leaves OPEN the reader
    says no DATA may follow, and a small write made then is not written through (RFC 6455
    5.5.1: nothing after the CLOSE; after an EOF, nothing to a dead peer)."""
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        assert not t.cloud_ws.data_closed
        edge = t.edge_ws.transport
        if end.startswith("a text"):
            edge.write(Frame(Opcode.TEXT, b"x").serialize(mask=True, extensions=[]))
        elif end.startswith("an unmasked"):
            edge.write(Frame(Opcode.BINARY, b"x").serialize(mask=False, extensions=[]))
        else:
            edge.write_eof()
        await _left_open(t.cloud_ws)
        # The first turn it is seen out of OPEN: the flag was set where it left it.
        assert t.cloud_ws.data_closed
        writes = record(t.cloud)
        stream.try_write(b"late")
        await asyncio.sleep(0.05)
        assert writes.writes == []


# -- one_small: batched's bytes -------------------------------------------------------------------


def _unmasked(frame: bytes) -> tuple[int, int, bytes]:
    """(first byte, MASK bit, payload) of one frame of under 64 KiB."""
    b0, b1 = frame[0], frame[1]
    size, at = b1 & 0x7F, 2
    if size == 126:
        size, at = int.from_bytes(frame[2:4], "big"), 4
    if b1 & 0x80:
        key, at = frame[at : at + 4], at + 4
        payload = bytes(c ^ key[i % 4] for i, c in enumerate(frame[at : at + size]))
    else:
        payload = bytes(frame[at : at + size])
    assert at + size == len(frame)
    return b0, b1 & 0x80, payload


_pieces = st.lists(
    st.one_of(st.binary(max_size=700), st.binary(max_size=700).map(memoryview)),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(_pieces, st.booleans())
def test_one_small_frames_a_message_as_batched_does(pieces: list[bytes], mask: bool) -> None:
    size = sum(map(len, pieces))
    small = one_small([pieces], mask=mask)
    if size >= COALESCE - 16:
        assert small is None
        return
    assert small is not None and len(small) == 1
    general = b"".join(bytes(p) for frames in batched([pieces], mask=mask) for p in frames)
    mine = bytes(small[0])
    if not mask:
        assert mine == general
    assert _unmasked(mine) == _unmasked(general) == (0x82, 0x80 if mask else 0, b"".join(pieces))


# -- the MASK bit --------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300), st.booleans(), st.booleans())
def test_a_frame_is_handed_over_exactly_when_its_mask_bit_is_not_the_sides(
    payload: bytes, masked: bool, sent_masked: bool
) -> None:
    parser = FrameParser(masked=masked, max_size=1 << 20)
    frame = Frame(Opcode.BINARY, payload).serialize(mask=sent_masked, extensions=[])
    events, _ = parser.parse(frame, lend=False, offset=0, stop=len(frame))
    # A frame masked against the side's rule is not ours to read: websockets takes the
    # connection over (and fails it).
    failed = any(isinstance(e, Failure | Handover) for e in events)
    assert failed == (bool(frame[1] & 0x80) != masked)  # the rule before the cut
    if not failed:
        assert [bytes(e) for e in events if isinstance(e, MESSAGE)] == [payload]


# -- the TLS transport's read readiness ---------------------------------------------------------


async def test_read_readiness_while_paused_delivers_nothing(pki: Path) -> None:
    """``_read(True)`` is what the loop calls on read readiness: with reading paused (a
    registration not yet updated, a readiness already in the loop's batch) it reads nothing
    into the protocol, as _on_readable's check did."""
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        server.transport.pause_reading()
        client.transport.write(b"x" * 5000)
        await asyncio.sleep(0.1)  # in the server's socket
        server.transport._read(True)
        assert server.received == 0
        server.transport.resume_reading()
        await server.until(5000)


class _Lender(Recorder):
    """Lends slices of its buffer as memoryviews (as the tunnel's reader does) and notes, at
    each get_buffer, whether any view of it is still alive (the reader's getrefcount test)."""

    def __init__(self, bufsize: int) -> None:
        super().__init__(bufsize)
        self.held: list[int] = []
        self._alone = sys.getrefcount(self.buf)

    def get_buffer(self, sizehint: int) -> memoryview:
        self.held.append(sys.getrefcount(self.buf) - self._alone)
        return memoryview(self.buf)[: len(self.buf)]


@pytest.mark.parametrize(
    ("size", "sent"),
    [(1000, 8000), (64000, 400000)],
    ids=["one-read-fills-it (rxpath 347e1ab)", "reads-of-records (since before)"],
)
async def test_a_lent_buffer_is_held_by_no_view_of_the_transport_at_the_next_round(
    pki: Path,
    size: int,
    sent: int,
) -> None:
    """A read round fills a lent buffer and delivers it; the next round's get_buffer must find
    no view of the transport still holding that buffer: the tunnel's reader takes a reference
    more for a message still held by its receiver and swaps buffers for nothing. _read drops
    ``view`` and ``given`` at the round's end, not ``into``: the last read's view (a slice when
    several SSL_reads filled the buffer; since 347e1ab, the protocol's own view when one read
    filled it, which 691ee7b had released). Fix: ``del view, given, into``."""
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        lender = _Lender(size)
        lender.transport = server.transport
        server.transport.set_protocol(lender)
        try:
            server.transport.pause_reading()
            client.transport.write(blob(sent))
            await asyncio.sleep(0.1)  # in the socket: read in rounds that fill the buffer
            server.transport.resume_reading()
            await lender.until(sent)
        finally:
            server.transport.set_protocol(server)  # its connection_lost, for connected()
        assert len(lender.held) >= sent // size and set(lender.held) == {0}


# -- data after the peer's CLOSE ----------------------------------------------------------------


async def test_data_the_peer_sends_after_its_close_reaches_no_stream() -> None:
    """RFC 6455 5.5.1: after its CLOSE the peer sends no data frame; one that comes anyway,
    even in the same read as the CLOSE (the reader parses a read's frames in buffer_updated and
    stops at the CLOSE), is not delivered to the stream it names."""
    async with tunnel() as t:
        stream = await asyncio.wait_for(t.cloud.open_stream(TARGET), WAIT)
        await settle(t.cloud)
        await settle(t.edge)
        edge_conn = t.edge.conn
        edge_conn.send_data(stream.id, b"late")  # a DATA message, built but not sent
        (message,) = edge_conn.outbox.take_pieces()
        data = Frame(Opcode.BINARY, b"".join(message)).serialize(mask=True, extensions=[])
        close = Frame(Opcode.CLOSE, b"\x03\xe8").serialize(mask=True, extensions=[])
        fed: list[bytes] = []

        def taken() -> None:  # each chunk as it arrives (a reset later drops what is buffered)
            with contextlib.suppress(StreamClosedError):
                while (chunk := stream.read_nowait()) is not None and chunk:
                    fed.append(bytes(chunk))

        stream.on_readable(taken)
        t.edge_ws.transport.write(close + data)  # one write: one read, most likely
        await _left_open(t.cloud_ws)
        await asyncio.sleep(0.05)
        assert fed == []


@pytest.mark.parametrize("state", ["shutdown draining to FIN", "a write waiting for reading"])
async def test_read_readiness_serves_what_else_it_is_for_first(
    pki: Path, monkeypatch: pytest.MonkeyPatch, state: str
) -> None:
    """Read readiness is also the shutdown's wait for the peer's FIN and a write's wait for
    a TLS record to read: ``_read(True)`` hands it to them first (as _on_readable did); only
    a transport simply reading reads for the protocol."""
    async with connected(pki) as (client, server):
        assert client.transport is not None and server.transport is not None
        transport = server.transport
        transport.pause_reading()
        client.transport.write(b"x" * 100)
        await asyncio.sleep(0.1)  # in the server's socket, unread
        calls: list[str] = []
        monkeypatch.setattr(transport, "_drain_to_fin", lambda: calls.append("drain"))
        monkeypatch.setattr(transport, "_flush", lambda: calls.append("flush"))
        monkeypatch.setattr(transport, "_reading_paused", False)  # no read scheduled
        if state.startswith("shutdown"):
            monkeypatch.setattr(transport, "_shutdown", 2)
            transport._read(True)
            assert calls == ["drain"] and server.received == 0
        else:
            monkeypatch.setattr(transport, "_write_wants_read", True)
            transport._read(True)
            assert calls == ["flush"] and server.received == 100  # then read: it is reading
