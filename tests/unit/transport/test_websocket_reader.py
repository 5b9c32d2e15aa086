"""The tunnel's frame reader driven as a transport drives it (get_buffer, bytes read into what
it offers, buffer_updated), with no socket: any frame stream, cut at any points, comes out as
sent, through the thread's shared scratch buffer, a connection's own buffer and lent views,
while the scratch is overwritten after every read (as another connection's read would)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode
from websockets.protocol import Side, State

from ravenproxy.transport import websocket
from ravenproxy.transport.websocket import MIN_READ, TunnelConnectionMixin
from ravenproxy.transport.wsframes import LEND_MIN, FrameParser

LIMIT = 1 << 18


class Reader(TunnelConnectionMixin):
    """The reader, OPEN and reading frames, with what it hands to websockets kept."""

    def __init__(self, masked: bool) -> None:
        self._init_reader()
        self.protocol = SimpleNamespace(
            state=State.OPEN, side=Side.SERVER if masked else Side.CLIENT
        )
        self.transport = SimpleNamespace(pause_reading=lambda: None, resume_reading=lambda: None)
        self.max_queue_high = None
        self.to_websockets: list[bytes] = []
        self._rd.mode = websocket._FRAMES
        self._rd.parser = FrameParser(masked=masked, max_size=LIMIT)

    def _websockets_receive(self, data: bytes) -> None:
        self.to_websockets.append(data)


_payloads = st.one_of(
    st.binary(max_size=MIN_READ + 200),
    st.builds(
        lambda n, b: bytes([b]) * n, st.integers(LEND_MIN - 2, LEND_MIN + 2000), st.integers(0, 255)
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            _payloads, st.integers(0, MIN_READ + 200), st.one_of(st.none(), st.binary(max_size=125))
        ),
        max_size=8,
    ),
    st.booleans(),
    st.lists(st.integers(1, 3 * MIN_READ), min_size=1, max_size=40),
)
def test_any_stream_read_in_any_pieces_comes_out_as_sent(
    sent: list[tuple[bytes, int, bytes | None]], masked: bool, pieces: list[int]
) -> None:
    wire = bytearray()
    messages: list[bytes] = []
    pings: list[bytes] = []
    for payload, split, ping in sent:
        cut = split % (len(payload) + 1)
        if 0 < cut < len(payload):  # two fragments, a PING between them
            wire += Frame(Opcode.BINARY, payload[:cut], fin=False).serialize(
                mask=masked, extensions=[]
            )
        else:
            cut = 0
        if ping is not None:
            raw = Frame(Opcode.PING, ping).serialize(mask=masked, extensions=[])
            wire += raw
            pings.append(raw)
        opcode = Opcode.CONT if cut else Opcode.BINARY
        wire += Frame(opcode, payload[cut:]).serialize(mask=masked, extensions=[])
        messages.append(payload)
    reader = Reader(masked)
    scratch = websocket._scratch.buf
    at, i = 0, 0
    while at < len(wire):
        view = reader.get_buffer(-1)
        n = min(len(view), pieces[i % len(pieces)], len(wire) - at)
        i += 1
        view[:n] = wire[at : at + n]
        at += n
        reader.buffer_updated(n)
        scratch[:] = b"\xee" * len(scratch)  # another connection's read
    assert [bytes(m) for m in reader._rd.messages] == messages
    assert reader.to_websockets == pings
    assert reader._rd.start == reader._rd.end
