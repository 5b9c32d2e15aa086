"""Fuzzing the frame decoder and a whole Connection with hostile input (hypothesis).

Whatever a peer sends, the only errors are the protocol's typed ones (a :class:`WireError`,
in practice a :class:`ProtocolError` carrying the code the GOAWAY announces), nothing hangs, and
what we keep or queue stays proportional to what we were sent. Example counts are fixed so the
whole module runs in a few seconds in CI.
"""

from __future__ import annotations

import struct
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ravenproxy.wire import events as ev
from ravenproxy.wire.codes import ErrorCode, FrameType, Setting
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.errors import ProtocolError, WireError
from ravenproxy.wire.frames import (
    HEADER,
    HEADER_SIZE,
    MIN_FRAME_SIZE,
    Data,
    Frame,
    GoAway,
    Open,
    OpenResult,
    Ping,
    Reset,
    Settings,
    Target,
    WindowUpdate,
    decode_message,
    encode,
)
from ravenproxy.wire.streams import State

from .harness import FakeClock, frames_of

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(
    max_examples=300,
    # Generous for a loaded CI machine, yet a decoder that loops or blows up trips it.
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Few stream ids, so frames hit live, closed and never-opened streams alike.
sids = st.integers(0, 12)
stream_sids = st.integers(1, 12)
short_texts = st.text(max_size=12)
codes = st.integers(0, 20).map(ErrorCode.parse)
settings_frames = st.builds(
    Settings,
    st.lists(
        st.tuples(st.sampled_from([*Setting, 0, 9]), st.integers(0, 2**32 - 1)), max_size=5
    ).map(tuple),
)
stream_frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(
        Open,
        stream_sids,
        st.integers(0, 2**31 - 1),
        st.builds(Target, short_texts, short_texts, st.integers(0, 65535)),
    ),
    st.builds(OpenResult, stream_sids, codes, st.integers(0, 2**31 - 1), short_texts),
    st.builds(Data, stream_sids, st.binary(max_size=64), st.booleans()),
    st.builds(WindowUpdate, sids, st.integers(1, 2**31 - 1)),
    st.builds(Reset, stream_sids, codes, short_texts),
    st.builds(Ping, st.binary(min_size=8, max_size=8), st.booleans()),
    st.builds(GoAway, sids, codes, short_texts),
)
"""Frames after SETTINGS: valid one by one, though not always in a valid order."""
plausible_frames = st.one_of(settings_frames, stream_frames)


@st.composite
def hostile_messages(draw: st.DrawFn, valid_weight: int = 1) -> bytes:
    """One WebSocket message: random bytes, or valid frames, possibly damaged. A higher
    ``valid_weight`` gives more undamaged messages, which get deeper into a connection."""
    kinds = ["random", "mutated", "relength", "truncated"] + ["frames"] * valid_weight
    kind = draw(st.sampled_from(kinds))
    if kind == "random":
        return draw(st.binary(max_size=300))
    frames = stream_frames if valid_weight > 1 else plausible_frames
    raw = bytearray(b"".join(encode(f) for f in draw(st.lists(frames, max_size=6))))
    if not raw or kind == "frames":
        return bytes(raw)
    if kind == "mutated":
        for _ in range(draw(st.integers(1, 6))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
    elif kind == "relength":
        # Lie in the first header's length field: short, long, or far beyond the message.
        struct.pack_into("!I", raw, 8, draw(st.integers(0, 2**32 - 1)))
    else:
        del raw[draw(st.integers(0, len(raw) - 1)) :]
    return bytes(raw)


def payload_size(frame: Frame) -> int:
    match frame:
        case Data():
            return len(frame.data)
        case Ping():
            return len(frame.payload)
        case Open():
            return len(frame.target.node.encode()) + len(frame.target.host.encode())
        case OpenResult() | Reset():
            return len(frame.message.encode())
        case GoAway():
            return len(frame.reason.encode())
        case Settings():
            return 6 * len(frame.values)
    return 0


# -- the decoder ------------------------------------------------------------------------------


@FUZZ
@given(hostile_messages(), st.sampled_from([MIN_FRAME_SIZE, 16 * 1024 * 1024]))
def test_decoder_raises_only_protocol_errors_and_never_amplifies(
    message: bytes, max_frame_size: int
) -> None:
    try:
        frames = decode_message(message, max_frame_size)
    except ProtocolError as exc:
        assert isinstance(exc.code, ErrorCode) and exc.code is not ErrorCode.OK
        return
    # Everything decoded was in the message: one header per frame, payloads no larger.
    assert len(frames) * HEADER_SIZE <= len(message)
    assert sum(payload_size(f) for f in frames) <= len(message)


@FUZZ
@given(st.lists(hostile_messages(), min_size=1, max_size=5))
def test_decoder_on_concatenated_messages(messages: list[bytes]) -> None:
    """Frames that straddle the seams of several messages glued together."""
    try:
        decode_message(b"".join(messages), MIN_FRAME_SIZE)
    except ProtocolError:
        pass


def test_a_frame_claiming_a_huge_payload_is_refused_before_anything_is_allocated() -> None:
    header = HEADER.pack(FrameType.DATA, 0, 0, 1, 2**32 - 1)
    with pytest.raises(ProtocolError):
        decode_message(header + b"x" * 100, 16 * 1024 * 1024)


# -- a whole connection -----------------------------------------------------------------------

CONFIG = WireConfig(max_frame_size=MIN_FRAME_SIZE, max_concurrent_streams=4)
OUT_PER_IN = 4
"""Our answers never outweigh what asked for them by more than this (an OPEN of 22 bytes gets
an OPEN_RESULT with a reason, a DATA of 12 bytes a WINDOW_UPDATE of 16), plus a constant."""
OUT_CONSTANT = 2048  # our SETTINGS and one GOAWAY with a clipped reason


@FUZZ
@given(
    st.booleans(),
    st.booleans(),
    st.lists(hostile_messages(valid_weight=12), min_size=1, max_size=12),
    st.data(),
)
def test_connection_survives_hostile_peers(
    server_side: bool,
    settings_first: bool,
    messages: list[bytes],
    data: st.DataObject,
) -> None:
    clock = FakeClock()
    conn = Connection(server_side=server_side, config=CONFIG, clock=clock)
    if settings_first:  # most peers get past the first check, to reach the deeper ones
        messages = [encode(Settings(((Setting.MAX_FRAME_SIZE, MIN_FRAME_SIZE),))), *messages]
    received = 0
    sent = 0
    failure: WireError | None = None
    for message in messages:
        received += len(message)
        clock.advance(0.01)
        try:
            events = conn.receive_message(message)
        except WireError as exc:
            assert isinstance(exc, ProtocolError), exc
            event(f"connection error {exc.code.name}")  # --hypothesis-show-statistics
            failure = exc
            break
        # Play the application: accept or refuse what is asked, consume what arrives.
        for happened in events:
            event(f"event {type(happened).__name__}")
            if isinstance(happened, ev.StreamOpenRequested):
                stream = conn.streams.get(happened.stream_id)
                if stream is not None and stream.state is State.OPENING_REMOTE:
                    if data.draw(st.booleans()):
                        conn.accept_stream(happened.stream_id)
                    else:
                        conn.reject_stream(happened.stream_id, ErrorCode.REFUSED, "no")
            elif isinstance(happened, ev.DataReceived):
                conn.consumed(happened.stream_id, len(happened.data))
        assert conn.open_streams <= CONFIG.max_concurrent_streams
        assert conn.pending_bytes <= OUT_PER_IN * received + OUT_CONSTANT
        if data.draw(st.booleans()):  # the writer takes the queue now and then
            sent += sum(len(m) for m in conn.data_to_send())
            assert conn.should_read
    if failure is not None:
        # A connection error: closed, GOAWAY with the error's code queued, input ignored.
        assert conn.closed
        goaways = [f for f in frames_of(conn.data_to_send()) if isinstance(f, GoAway)]
        assert goaways and goaways[-1].code is failure.code
        assert conn.receive_message(encode(Ping(b"12345678"))) == []


class Application:
    """What the session does with a connection's events: accept or refuse what the peer
    opens, consume what arrives. Its choices come from hypothesis."""

    def __init__(self, conn: Connection, data: st.DataObject) -> None:
        self.conn = conn
        self.data = data

    def handle(self, events: list[ev.Event]) -> None:
        for happened in events:
            event(f"event {type(happened).__name__}")  # --hypothesis-show-statistics
            if isinstance(happened, ev.StreamOpenRequested):
                stream = self.conn.streams.get(happened.stream_id)
                if stream is not None and stream.state is State.OPENING_REMOTE:
                    if self.data.draw(st.booleans()):
                        self.conn.accept_stream(happened.stream_id)
                    else:
                        self.conn.reject_stream(happened.stream_id, ErrorCode.REFUSED, "no")
            elif isinstance(happened, ev.DataReceived):
                self.conn.consumed(happened.stream_id, len(happened.data))


PEER_ACTIONS = ["open"] * 3 + ["data"] * 6 + ["fin", "reset", "ping", "goaway"]
DAMAGE = ["none"] * 8 + ["mutate", "truncate", "inject", "drop", "duplicate"]


@FUZZ
@given(st.booleans(), st.data())
def test_connection_survives_a_damaged_conversation(server_side: bool, data: st.DataObject) -> None:
    """An honest peer drives real traffic (opens, data, half-closes, resets, pings, drains);
    on its way some messages are damaged, dropped, repeated, or get hostile frames injected.
    This reaches the states random bytes never get to (live streams, windows, drains)."""
    clock = FakeClock()
    conn = Connection(server_side=server_side, config=CONFIG, clock=clock)
    peer = Connection(server_side=not server_side, config=CONFIG, clock=clock)
    app = Application(conn, data)
    received = 0
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        clock.advance(0.01)
        action = data.draw(st.sampled_from(PEER_ACTIONS), label="action")
        live = [s for s in peer.streams if peer.send_window(s) > 0 or action != "data"]
        sid = data.draw(st.sampled_from(live), label="stream") if live else None
        try:  # the honest peer's own API refuses what it may not do; that is not our concern
            if action == "open":
                peer.open_stream(Target("edge-1", "127.0.0.1", 10250))
            elif action == "data" and sid is not None:
                size = min(peer.send_window(sid), data.draw(st.integers(0, 3000)))
                peer.send_data(sid, b"d" * size, fin=data.draw(st.booleans()))
            elif action == "fin" and sid is not None:
                peer.end_stream(sid)
            elif action == "reset" and sid is not None:
                peer.reset_stream(sid, ErrorCode.CANCEL)
            elif action == "ping":
                peer.ping()
            elif action == "goaway":
                peer.goaway()
        except WireError:
            pass
        for message in peer.data_to_send():
            damage = data.draw(st.sampled_from(DAMAGE), label="damage")
            event(f"damage {damage}")
            raw = bytearray(message)
            if damage == "drop":
                continue
            if damage == "mutate":
                raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
            elif damage == "truncate":
                del raw[data.draw(st.integers(0, len(raw) - 1)) :]
            elif damage == "inject":
                raw += encode(data.draw(plausible_frames))
            copies = 2 if damage == "duplicate" else 1
            for _ in range(copies):
                received += len(raw)
                try:
                    app.handle(conn.receive_message(bytes(raw)))
                except WireError as exc:
                    assert isinstance(exc, ProtocolError), exc
                    event(f"connection error {exc.code.name}")
                    assert conn.closed
                    goaways = [f for f in frames_of(conn.data_to_send()) if isinstance(f, GoAway)]
                    assert goaways and goaways[-1].code is exc.code
                    return
        assert conn.open_streams <= CONFIG.max_concurrent_streams
        assert conn.pending_bytes <= OUT_PER_IN * received + OUT_CONSTANT
        # Our answers reach the peer undamaged; what it makes of them after damage is its own
        # business (it may well call them a protocol error, and then the conversation ends).
        try:
            for message in conn.data_to_send():
                peer.receive_message(message)
        except ProtocolError:
            return
        assert conn.should_read
