"""Two sans-I/O connections wired back to back, driven with bytes and a fake clock."""

from __future__ import annotations

import struct

import pytest

from ravenproxy.wire import events as ev
from ravenproxy.wire.codes import ErrorCode, FrameType, Setting
from ravenproxy.wire.config import KIB, MIB, WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.errors import (
    FlowControlError,
    FrameSizeError,
    GoingAwayError,
    ProtocolError,
    StreamError,
    StreamLimitError,
    WindowExceeded,
)
from ravenproxy.wire.frames import (
    HEADER_SIZE,
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

from .harness import TARGET, FakeClock, Pair, frames_of

# -- settings ---------------------------------------------------------------------------------


def test_settings_exchange() -> None:
    config = WireConfig(
        max_frame_size=32 * KIB,
        max_concurrent_streams=7,
        initial_stream_window=128 * KIB,
        max_stream_window=1 * MIB,
        connection_window=4 * MIB,
    )
    pair = Pair(server_config=config, settle=False)
    first = decode_message(pair.server.data_to_send()[0], 1 << 24)
    assert first == [
        Settings(
            (
                (Setting.MAX_FRAME_SIZE, 32 * KIB),
                (Setting.MAX_CONCURRENT_STREAMS, 7),
                (Setting.INITIAL_STREAM_WINDOW, 128 * KIB),
                (Setting.CONNECTION_WINDOW, 4 * MIB),
            )
        )
    ]
    assert pair.agent.receive_message(encode(first[0])) == [
        ev.SettingsReceived(
            {
                "MAX_FRAME_SIZE": 32 * KIB,
                "MAX_CONCURRENT_STREAMS": 7,
                "INITIAL_STREAM_WINDOW": 128 * KIB,
                "CONNECTION_WINDOW": 4 * MIB,
            }
        )
    ]
    assert pair.agent.peer_max_frame_size == 32 * KIB
    assert pair.agent.peer_max_streams == 7


def test_unknown_settings_are_ignored() -> None:
    conn = Connection(server_side=False)
    events = conn.receive_message(encode(Settings(((0x99, 1), (Setting.MAX_FRAME_SIZE, 20000)))))
    assert events == [ev.SettingsReceived({"MAX_FRAME_SIZE": 20000})]


@pytest.mark.parametrize("value", [16 * KIB - 1, 16 * MIB + 1])
def test_max_frame_size_setting_out_of_range(value: int) -> None:
    conn = Connection(server_side=False)
    with pytest.raises(ProtocolError):
        conn.receive_message(encode(Settings(((Setting.MAX_FRAME_SIZE, value),))))


def test_connection_window_setting_out_of_range() -> None:
    conn = Connection(server_side=False)
    with pytest.raises(ProtocolError):
        conn.receive_message(encode(Settings(((Setting.CONNECTION_WINDOW, 2**31),))))


def test_settings_twice_is_a_protocol_error() -> None:
    pair = Pair()
    with pytest.raises(ProtocolError):
        pair.agent.receive_message(encode(Settings(())))


def _goaway_sent(conn: Connection) -> GoAway:
    frames = [f for f in frames_of(conn.data_to_send()) if isinstance(f, GoAway)]
    assert len(frames) == 1
    return frames[0]


@pytest.mark.parametrize(
    "frame",
    [
        Ping(b"12345678"),
        Open(1, 100, TARGET),
        Data(1, b"x"),
        WindowUpdate(0, 1),
        GoAway(0, ErrorCode.OK),
    ],
    ids=lambda f: type(f).__name__,
)
def test_first_frame_not_settings(frame: Frame) -> None:
    conn = Connection(server_side=False)
    conn.data_to_send()  # our own SETTINGS
    with pytest.raises(ProtocolError) as info:
        conn.receive_message(encode(frame))
    assert info.value.code is ErrorCode.PROTOCOL_ERROR
    assert conn.closed
    goaway = _goaway_sent(conn)
    assert goaway.code is ErrorCode.PROTOCOL_ERROR
    assert goaway.last_stream_id == 0
    assert conn.receive_message(encode(Settings(()))) == []  # closed: input is ignored


def test_unknown_frame_types_before_and_after_settings_are_ignored() -> None:
    unknown = struct.pack("!BBHII", 0x30, 0, 0, 0, 3) + b"abc"
    conn = Connection(server_side=False)
    events = conn.receive_message(unknown + encode(Settings(())) + unknown)
    assert events == [ev.SettingsReceived({})]


def test_several_frames_in_one_message() -> None:
    conn = Connection(server_side=False)
    events = conn.receive_message(encode(Settings(())) + encode(Open(1, 1000, TARGET)))
    assert events == [ev.SettingsReceived({}), ev.StreamOpenRequested(1, TARGET)]


# -- stream lifecycle -------------------------------------------------------------------------


@pytest.mark.parametrize("opener_is_server", [True, False], ids=["server-opens", "agent-opens"])
def test_open_accept_data_half_close_both_ways(opener_is_server: bool) -> None:
    pair = Pair()
    opener = pair.server if opener_is_server else pair.agent
    acceptor = pair.peer(opener)
    sid = opener.open_stream(TARGET)
    assert sid % 2 == (1 if opener_is_server else 0)
    assert pair.transfer(opener) == [ev.StreamOpenRequested(sid, TARGET)]
    assert acceptor.streams[sid].state is State.OPENING_REMOTE
    assert opener.send_window(sid) == 0  # no credit before OPEN_RESULT
    acceptor.accept_stream(sid)
    assert acceptor.send_window(sid) == 256 * KIB  # the window carried by OPEN
    assert pair.transfer(acceptor) == [ev.StreamAccepted(sid)]
    assert opener.send_window(sid) == 256 * KIB  # the window carried by OPEN_RESULT

    opener.send_data(sid, b"request")
    assert pair.transfer(opener) == [ev.DataReceived(sid, b"request")]
    acceptor.send_data(sid, b"response", fin=True)
    assert acceptor.streams[sid].state is State.HALF_CLOSED_LOCAL
    assert pair.transfer(acceptor) == [ev.DataReceived(sid, b"response"), ev.StreamEnded(sid)]
    assert opener.streams[sid].state is State.HALF_CLOSED_REMOTE
    opener.send_data(sid, b"more")  # the other direction is still open
    assert pair.transfer(opener) == [ev.DataReceived(sid, b"more")]
    opener.end_stream(sid)
    assert sid not in opener.streams
    assert pair.transfer(opener) == [ev.StreamEnded(sid)]
    assert sid not in acceptor.streams
    assert opener.open_streams == acceptor.open_streams == 0


def test_stream_ids_increase_by_two() -> None:
    pair = Pair()
    assert [pair.server.open_stream(TARGET) for _ in range(3)] == [1, 3, 5]
    assert [pair.agent.open_stream(TARGET) for _ in range(3)] == [2, 4, 6]


@pytest.mark.parametrize("code", [c for c in ErrorCode if c is not ErrorCode.OK])
def test_reject_with_each_code(code: ErrorCode) -> None:
    pair = Pair()
    sid = pair.server.open_stream(TARGET)
    pair.transfer(pair.server)
    pair.agent.reject_stream(sid, code, "nope: é")
    assert pair.transfer(pair.agent) == [ev.StreamRejected(sid, code, "nope: é")]
    assert pair.server.open_streams == pair.agent.open_streams == 0


def test_reject_needs_an_error_code_and_a_pending_stream() -> None:
    pair = Pair()
    sid = pair.server.open_stream(TARGET)
    pair.transfer(pair.server)
    with pytest.raises(ValueError):
        pair.agent.reject_stream(sid, ErrorCode.OK)
    with pytest.raises(StreamError):
        pair.server.reject_stream(sid, ErrorCode.REFUSED)  # our own stream
    pair.agent.accept_stream(sid)
    with pytest.raises(StreamError):
        pair.agent.accept_stream(sid)
    with pytest.raises(StreamError):
        pair.agent.reject_stream(sid, ErrorCode.REFUSED)


def test_long_messages_are_clipped() -> None:
    pair = Pair()
    sid = pair.server.open_stream(TARGET)
    pair.transfer(pair.server)
    pair.agent.reject_stream(sid, ErrorCode.DIAL_FAILED, "é" * 1000)
    (event,) = pair.transfer(pair.agent)
    assert isinstance(event, ev.StreamRejected)
    assert event.message == "é" * 256  # 512 bytes, cut on a character boundary


@pytest.mark.parametrize("resetter_is_opener", [True, False])
def test_reset_both_ways(resetter_is_opener: bool) -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    resetter = pair.server if resetter_is_opener else pair.agent
    resetter.reset_stream(sid, ErrorCode.CANCEL, "client went away")
    assert sid not in resetter.streams
    resetter.reset_stream(sid, ErrorCode.CANCEL)  # idempotent
    assert pair.transfer(resetter) == [ev.StreamReset(sid, ErrorCode.CANCEL, "client went away")]
    assert pair.server.open_streams == pair.agent.open_streams == 0
    with pytest.raises(StreamError):
        pair.peer(resetter).send_data(sid, b"x")


def test_data_in_flight_after_reset_is_dropped_and_connection_credit_comes_back() -> None:
    small = WireConfig(
        initial_stream_window=128 * KIB,
        max_stream_window=128 * KIB,
        connection_window=256 * KIB,
    )
    pair = Pair(server_config=small, agent_config=small)
    sid = pair.open(pair.server)
    pair.server.send_data(sid, bytes(128 * KIB))
    in_flight = pair.server.data_to_send()
    pair.agent.reset_stream(sid, ErrorCode.CANCEL)
    # The DATA crosses the RESET: the agent drops it without an event or an error.
    assert [pair.agent.receive_message(m) for m in in_flight] == [[]] * len(in_flight)
    server_events, _ = pair.pump()
    # Credit is a control frame and travels ahead of the RESET, which keeps its stream order.
    assert server_events == [ev.WindowUpdated(0), ev.StreamReset(sid, ErrorCode.CANCEL, "")]
    # The whole connection window is usable again: two fresh streams take 128 KiB each.
    a, b = pair.open(pair.server), pair.open(pair.server)
    pair.server.send_data(a, bytes(128 * KIB))
    assert pair.server.send_window(b) == 128 * KIB


def test_open_timeout_reset_crosses_the_accept() -> None:
    pair = Pair()
    sid = pair.server.open_stream(TARGET)
    pair.transfer(pair.server)
    pair.agent.accept_stream(sid)
    pair.agent.send_data(sid, b"early bytes")
    in_flight = pair.agent.data_to_send()
    pair.server.reset_stream(sid, ErrorCode.OPEN_TIMEOUT, "no answer")
    # OPEN_RESULT and DATA for a stream we reset are ignored.
    assert [pair.server.receive_message(m) for m in in_flight] == [[]] * len(in_flight)
    assert pair.transfer(pair.server) == [ev.StreamReset(sid, ErrorCode.OPEN_TIMEOUT, "no answer")]
    assert pair.server.open_streams == pair.agent.open_streams == 0


def test_frames_for_closed_streams_are_ignored() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    pair.server.reset_stream(sid, ErrorCode.CANCEL)
    pair.pump()
    for frame in (
        WindowUpdate(sid, 10),
        Reset(sid, ErrorCode.CANCEL),
        OpenResult(sid, ErrorCode.OK, 10),
        Data(sid, b"late", fin=True),
    ):
        assert pair.server.receive_message(encode(frame)) == []
    # A skipped peer id below the highest one seen counts as closed too.
    pair.agent.open_stream(TARGET)  # 2
    pair.agent.open_stream(TARGET)  # 4
    pair.transfer(pair.agent)
    assert pair.server.streams.keys() == {2, 4}
    pair.server.reject_stream(2, ErrorCode.REFUSED)
    assert pair.server.receive_message(encode(Reset(2, ErrorCode.CANCEL))) == []


def test_unknown_error_code_in_reset_reads_as_internal_error() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    raw = struct.pack("!BBHIIH", FrameType.RESET, 0, 0, sid, 2, 4242)
    assert pair.server.receive_message(raw) == [ev.StreamReset(sid, ErrorCode.INTERNAL_ERROR, "")]


# -- peer protocol violations -----------------------------------------------------------------


def _assert_connection_error(conn: Connection, message: bytes, error: type[ProtocolError]) -> None:
    with pytest.raises(error) as info:
        conn.receive_message(message)
    assert conn.closed
    assert _goaway_sent(conn).code is info.value.code


def test_open_with_wrong_parity() -> None:
    pair = Pair()
    _assert_connection_error(pair.agent, encode(Open(2, 10, TARGET)), ProtocolError)
    _assert_connection_error(pair.server, encode(Open(1, 10, TARGET)), ProtocolError)


@pytest.mark.parametrize("sid", [4, 2])
def test_open_reusing_an_id(sid: int) -> None:
    pair = Pair()
    pair.agent.open_stream(TARGET)
    pair.agent.open_stream(TARGET)
    pair.transfer(pair.agent)
    with pytest.raises(ProtocolError):
        pair.server.receive_message(encode(Open(sid, 10, TARGET)))
    goaway = _goaway_sent(pair.server)
    assert (goaway.code, goaway.last_stream_id) == (ErrorCode.PROTOCOL_ERROR, 4)


def test_open_with_port_zero() -> None:
    pair = Pair()
    _assert_connection_error(pair.agent, encode(Open(1, 10, Target("n", "h", 0))), ProtocolError)


@pytest.mark.parametrize(
    "frame",
    [
        Data(7, b"x"),
        Data(8, b"x"),
        WindowUpdate(7, 1),
        Reset(8, ErrorCode.CANCEL),
        OpenResult(9, ErrorCode.OK, 10),
    ],
    ids=repr,
)
def test_frame_for_a_never_opened_stream(frame: Frame) -> None:
    pair = Pair()
    _assert_connection_error(pair.server, encode(frame), ProtocolError)


def test_data_before_open_result_and_after_fin() -> None:
    pair = Pair()
    sid = pair.server.open_stream(TARGET)
    pair.transfer(pair.server)
    _assert_connection_error(pair.server, encode(Data(sid, b"x")), ProtocolError)
    pair = Pair()
    sid = pair.open(pair.server)
    pair.agent.end_stream(sid)
    pair.pump()
    _assert_connection_error(pair.server, encode(Data(sid, b"x")), ProtocolError)


def test_open_result_for_a_peer_opened_stream() -> None:
    pair = Pair()
    sid = pair.agent.open_stream(TARGET)
    pair.transfer(pair.agent)
    _assert_connection_error(pair.server, encode(OpenResult(sid, ErrorCode.OK, 1)), ProtocolError)


def test_peer_sending_beyond_its_stream_window() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    chunk = 64 * KIB
    frames = b"".join(encode(Data(sid, bytes(chunk))) for _ in range(256 * KIB // chunk))
    assert len(pair.agent.receive_message(frames)) == 4  # exactly the window is fine
    _assert_connection_error(pair.agent, encode(Data(sid, b"!")), FlowControlError)


def test_peer_sending_beyond_the_connection_window() -> None:
    tight = WireConfig(
        initial_stream_window=128 * KIB, max_stream_window=128 * KIB, connection_window=128 * KIB
    )
    pair = Pair(agent_config=tight)
    a, b = pair.open(pair.server), pair.open(pair.server)
    pair.agent.receive_message(encode(Data(a, bytes(64 * KIB))) + encode(Data(a, bytes(63 * KIB))))
    _assert_connection_error(pair.agent, encode(Data(b, bytes(KIB + 1))), FlowControlError)


def test_peer_data_larger_than_our_max_frame_size() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    _assert_connection_error(
        pair.agent, encode(Data(sid, bytes(pair.agent.config.max_frame_size + 1))), FrameSizeError
    )


@pytest.mark.parametrize("stream_level", [True, False])
def test_window_update_overflow(stream_level: bool) -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    target = sid if stream_level else 0
    _assert_connection_error(pair.server, encode(WindowUpdate(target, 2**31 - 1)), FlowControlError)


# -- local misuse -----------------------------------------------------------------------------


def test_local_errors() -> None:
    pair = Pair()
    with pytest.raises(StreamError):
        pair.server.send_data(99, b"x")
    with pytest.raises(ValueError):
        pair.server.open_stream(Target("n", "h", 0))
    with pytest.raises(ValueError):
        pair.server.open_stream(Target("n", "h", 65536))
    sid = pair.open(pair.server)
    window = pair.server.send_window(sid)
    with pytest.raises(WindowExceeded) as info:
        pair.server.send_data(sid, bytes(window + 1))
    assert info.value.code is ErrorCode.FLOW_CONTROL_ERROR
    pair.server.send_data(sid, bytes(window))
    assert pair.server.send_window(sid) == 0
    pair.server.end_stream(sid)  # FIN needs no credit
    assert pair.server.send_window(sid) == 0
    with pytest.raises(StreamError):
        pair.server.send_data(sid, b"x")


def test_consumed_is_harmless_for_nothing_or_unknown_streams() -> None:
    pair = Pair()
    assert not pair.server.consumed(1, 0)
    assert not pair.server.consumed(1, -5)
    assert pair.server.pending_bytes == 0


def test_consumed_says_whether_it_queued_credit() -> None:
    # The session flushes after consumed() only when it says so: it must say so every time.
    pair = Pair()
    sid = pair.open(pair.server)
    pair.agent.send_data(sid, bytes(200 * KIB))
    pair.transfer(pair.agent)
    assert not pair.server.consumed(sid, 10)  # a small read: no WINDOW_UPDATE yet
    assert pair.server.pending_bytes == 0
    reads = 0
    while not pair.server.consumed(sid, 8 * KIB):
        reads += 1
        assert pair.server.pending_bytes == 0
    assert 0 < reads < 200 // 8  # credit went back before the data was all read
    assert pair.server.pending_bytes > 0
    assert all(isinstance(f, WindowUpdate) for f in frames_of(pair.server.data_to_send()))


# -- limits -----------------------------------------------------------------------------------


def test_max_concurrent_streams() -> None:
    pair = Pair(agent_config=WireConfig(max_concurrent_streams=2), settle=False)
    # Before the agent's SETTINGS arrive the server assumes the default of 100, so the third
    # OPEN goes out and the agent answers it with TOO_MANY_STREAMS.
    sids = [pair.server.open_stream(TARGET) for _ in range(3)]
    server_events, agent_events = pair.pump()
    assert [e for e in agent_events if isinstance(e, ev.StreamOpenRequested)] == [
        ev.StreamOpenRequested(sids[0], TARGET),
        ev.StreamOpenRequested(sids[1], TARGET),
    ]
    rejected = [e for e in server_events if isinstance(e, ev.StreamRejected)]
    assert len(rejected) == 1
    assert (rejected[0].stream_id, rejected[0].code) == (sids[2], ErrorCode.TOO_MANY_STREAMS)
    # Now the server knows the limit and enforces it locally.
    assert pair.server.peer_max_streams == 2
    with pytest.raises(StreamLimitError) as info:
        pair.server.open_stream(TARGET)
    assert info.value.code is ErrorCode.TOO_MANY_STREAMS
    pair.agent.reject_stream(sids[0], ErrorCode.REFUSED)
    pair.pump()
    assert pair.server.open_stream(TARGET) == 7


def test_pending_and_half_closed_streams_count_towards_the_limit() -> None:
    pair = Pair(agent_config=WireConfig(max_concurrent_streams=1))
    sid = pair.open(pair.server)
    pair.server.end_stream(sid)
    pair.pump()
    with pytest.raises(StreamLimitError):
        pair.server.open_stream(TARGET)
    pair.agent.end_stream(sid)
    pair.pump()
    pair.server.open_stream(TARGET)


# -- goaway -----------------------------------------------------------------------------------


def test_goaway_drains() -> None:
    pair = Pair()
    kept = pair.open(pair.agent)  # 2
    pair.server.goaway(ErrorCode.OK, "upgrade")
    with pytest.raises(GoingAwayError):
        pair.server.open_stream(TARGET)
    server_events, agent_events = pair.pump()
    assert agent_events == [ev.GoAwayReceived(2, ErrorCode.OK, "upgrade")]
    with pytest.raises(GoingAwayError) as info:
        pair.agent.open_stream(TARGET)
    assert info.value.code is ErrorCode.GOING_AWAY
    # Streams already open finish normally.
    pair.agent.send_data(kept, b"still here", fin=True)
    pair.server.send_data(kept, b"bye", fin=True)
    server_events, agent_events = pair.pump()
    assert server_events == [ev.DataReceived(kept, b"still here"), ev.StreamEnded(kept)]
    assert agent_events == [ev.DataReceived(kept, b"bye"), ev.StreamEnded(kept)]
    assert pair.server.open_streams == pair.agent.open_streams == 0
    # A second GOAWAY with OK is not sent again; one with an error code is.
    pair.server.goaway()
    assert pair.server.pending_bytes == 0
    pair.server.goaway(ErrorCode.INTERNAL_ERROR)
    assert _goaway_sent(pair.server).code is ErrorCode.INTERNAL_ERROR


@pytest.mark.parametrize("open_arrives_first", [True, False])
def test_open_crossing_goaway_is_rejected_with_going_away(open_arrives_first: bool) -> None:
    pair = Pair()
    pair.open(pair.agent)  # 2
    late = pair.agent.open_stream(TARGET)  # 4, in flight
    pair.server.goaway(ErrorCode.OK, "bye")
    agent_out, server_out = pair.agent.data_to_send(), pair.server.data_to_send()
    server_events: list[ev.Event] = []
    agent_events: list[ev.Event] = []
    if open_arrives_first:
        for m in agent_out:
            server_events += pair.server.receive_message(m)
        server_out += pair.server.data_to_send()
    for m in server_out:
        agent_events += pair.agent.receive_message(m)
    if not open_arrives_first:
        for m in agent_out:
            server_events += pair.server.receive_message(m)
    more_server, more_agent = pair.pump()
    assert server_events + more_server == []  # the server never saw stream 4 as a request
    assert agent_events + more_agent == [
        ev.GoAwayReceived(2, ErrorCode.OK, "bye"),
        ev.StreamRejected(late, ErrorCode.GOING_AWAY, "bye"),
    ]
    assert late not in pair.agent.streams and late not in pair.server.streams


def test_open_below_last_stream_id_survives_goaway() -> None:
    pair = Pair()
    sid = pair.agent.open_stream(TARGET)
    pair.transfer(pair.agent)
    pair.server.goaway()
    assert pair.transfer(pair.server) == [ev.GoAwayReceived(sid, ErrorCode.OK, "")]
    pair.server.accept_stream(sid)
    assert pair.transfer(pair.server) == [ev.StreamAccepted(sid)]


# -- ping -------------------------------------------------------------------------------------


def test_ping_measures_a_smoothed_rtt() -> None:
    pair = Pair()
    assert pair.server.rtt == WireConfig().initial_rtt
    pair.server.ping()
    pair.transfer(pair.server)  # the agent answers
    pair.clock.advance(0.2)
    (acked,) = pair.transfer(pair.agent)
    assert isinstance(acked, ev.PingAcked)
    assert acked.rtt == pytest.approx(0.2)
    assert pair.server.rtt == pytest.approx(0.2)  # the first sample is taken as is
    pair.server.ping()
    pair.transfer(pair.server)
    pair.clock.advance(0.1)
    pair.transfer(pair.agent)
    assert pair.server.rtt == pytest.approx(0.875 * 0.2 + 0.125 * 0.1)


def test_ping_is_answered_with_the_same_payload() -> None:
    pair = Pair()
    assert pair.agent.receive_message(encode(Ping(b"abcdefgh"))) == []
    assert frames_of(pair.agent.data_to_send()) == [Ping(b"abcdefgh", ack=True)]


def test_unsolicited_or_forgotten_ping_acks_are_ignored() -> None:
    pair = Pair()
    assert pair.server.receive_message(encode(Ping(b"unknown!", ack=True))) == []
    for _ in range(17):
        pair.server.ping()
    pings = frames_of(pair.server.data_to_send())
    assert len(pings) == 17
    oldest = pings[0]
    assert isinstance(oldest, Ping)
    # Only the 16 most recent pings are remembered.
    assert pair.server.receive_message(encode(Ping(oldest.payload, ack=True))) == []
    newest = pings[-1]
    assert isinstance(newest, Ping)
    assert len(pair.server.receive_message(encode(Ping(newest.payload, ack=True)))) == 1


def test_last_received_tracks_the_clock() -> None:
    pair = Pair()
    pair.clock.advance(12.5)
    pair.server.ping()
    pair.transfer(pair.server)
    assert pair.agent.last_received == pair.clock.now


# -- backpressure on control output -----------------------------------------------------------


def test_control_pending_counts_everything_but_data() -> None:
    pair = Pair()
    a, b = pair.open(pair.server), pair.open(pair.server)
    assert pair.server.control_pending == 0
    pair.server.send_data(a, b"bulk" * 1000)
    assert pair.server.control_pending == 0  # DATA we chose to send is not control output
    pair.server.ping()
    pair.server.reset_stream(b, ErrorCode.CANCEL, "bye")
    sid = pair.server.open_stream(TARGET)
    expected = (
        len(encode(Ping(b"12345678")))
        + len(encode(Reset(b, ErrorCode.CANCEL, "bye")))
        + len(encode(Open(sid, WireConfig().initial_stream_window, TARGET)))
    )
    assert pair.server.control_pending == expected
    assert pair.server.pending_bytes == expected + len(b"bulk" * 1000) + HEADER_SIZE
    pair.server.data_to_send()
    assert pair.server.control_pending == 0 and pair.server.should_read


def test_a_peer_that_does_not_read_its_answers_is_not_read_either() -> None:
    ping = len(encode(Ping(b"12345678")))
    pair = Pair(agent_config=WireConfig(max_control_pending=50 * ping))
    agent = pair.agent
    payloads = [i.to_bytes(8, "big") for i in range(51)]
    agent.receive_message(b"".join(encode(Ping(p)) for p in payloads[:50]))
    assert agent.control_pending == 50 * ping
    assert agent.should_read  # at the bound, not over it
    agent.receive_message(encode(Ping(payloads[50])))
    assert not agent.should_read
    # Once the adapter has taken the answers (they are on their way), read again.
    answers = frames_of(agent.data_to_send())
    assert answers == [Ping(p, ack=True) for p in payloads]
    assert agent.should_read


def test_rejected_opens_count_as_control_output() -> None:
    pair = Pair(agent_config=WireConfig(max_concurrent_streams=1, max_control_pending=500))
    agent = pair.agent
    sid = 1
    while agent.should_read:
        agent.receive_message(encode(Open(sid, 1000, TARGET)))
        sid += 2
    results = frames_of(agent.data_to_send())
    assert {type(f) for f in results} == {OpenResult}
    assert all(isinstance(f, OpenResult) and f.code is ErrorCode.TOO_MANY_STREAMS for f in results)
    assert agent.open_streams == 1


def test_control_output_is_packed_into_messages_not_kept_per_frame() -> None:
    """A flood of tiny answers costs its bytes, not an object per frame: the queue holds
    chunks of whole frames up to max_message_size."""
    pair = Pair()
    agent = pair.agent
    message = b"".join(encode(Ping(i.to_bytes(8, "big"))) for i in range(10_000))
    for _ in range(12):
        agent.receive_message(message)
    messages = agent.pieces_to_send()
    limit = WireConfig().max_message_size
    assert all(len(pieces) == 1 and len(pieces[0]) <= limit for pieces in messages)
    assert sum(len(pieces[0]) for pieces in messages) == 12 * len(message)
    acks = [f for pieces in messages for f in decode_message(bytes(pieces[0]), limit)]
    assert len(acks) == 120_000 and all(isinstance(f, Ping) and f.ack for f in acks)


def test_fail_sends_only_goaway_and_closes() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    pair.transfer(pair.agent)
    pair.server.send_data(sid, b"queued")
    pair.server.ping()
    pair.server.fail(ErrorCode.ENHANCE_YOUR_CALM, "answers unread")
    assert pair.server.closed
    assert frames_of(pair.server.data_to_send()) == [
        GoAway(0, ErrorCode.ENHANCE_YOUR_CALM, "answers unread")
    ]
    assert pair.server.receive_message(encode(Ping(b"12345678"))) == []
    assert pair.server.pending_bytes == 0 and pair.server.control_pending == 0
    with pytest.raises(ValueError):
        pair.agent.fail(ErrorCode.OK)


def test_max_control_pending_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_control_pending"):
        WireConfig(max_control_pending=0)


# -- output -----------------------------------------------------------------------------------


def test_goaway_goes_before_data_queued_earlier() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    pair.server.send_data(sid, b"bulk")
    pair.server.goaway()
    frames = frames_of(pair.server.data_to_send())
    assert [type(f) for f in frames] == [GoAway, Data]


def test_control_frames_go_before_data_in_one_batch() -> None:
    pair = Pair()
    a, b = pair.open(pair.server), pair.open(pair.server)
    pair.server.send_data(a, b"bulk" * 1000)
    pair.server.ping()
    pair.server.reset_stream(b, ErrorCode.CANCEL)
    frames = frames_of(pair.server.data_to_send())
    # PING jumps the queue; RESET keeps its place behind the DATA queued before it.
    assert [type(f) for f in frames] == [Ping, Data, Reset]


def test_data_is_cut_into_frames_of_the_peer_max_frame_size() -> None:
    pair = Pair(agent_config=WireConfig(max_frame_size=16 * KIB))
    sid = pair.open(pair.server)
    pair.server.send_data(sid, bytes(40 * KIB), fin=True)
    frames = frames_of(pair.server.data_to_send())
    assert [(len(f.data), f.fin) for f in frames if isinstance(f, Data)] == [
        (16 * KIB, False),
        (16 * KIB, False),
        (8 * KIB, True),
    ]


def test_batching_respects_max_message_size() -> None:
    config = WireConfig(max_frame_size=16 * KIB, max_message_size=16 * KIB + HEADER_SIZE)
    pair = Pair(server_config=config, agent_config=config)
    sids = [pair.open(pair.server) for _ in range(50)]
    for sid in sids:
        pair.server.ping()
        pair.server.reset_stream(sid, ErrorCode.CANCEL, "x" * 500)
    messages = pair.server.data_to_send()
    assert len(messages) > 1
    assert max(map(len, messages)) <= config.max_message_size
    frames = [f for m in messages for f in decode_message(m, config.max_frame_size)]
    assert [type(f) for f in frames] == [Ping] * 50 + [Reset] * 50
    # DATA alone, in whole frames: one frame per message.
    sid = pair.open(pair.server)
    pair.server.send_data(sid, bytes(64 * KIB))
    messages = pair.server.data_to_send()
    assert [len(m) for m in messages] == [16 * KIB + HEADER_SIZE] * 4
    assert sum(len(f.data) for f in frames_of(messages) if isinstance(f, Data)) == 64 * KIB


def test_batching_never_splits_a_frame() -> None:
    pair = Pair()  # defaults: 64 KiB frames, 1 MiB messages
    sids = [pair.open(pair.server) for _ in range(5)]
    for sid in sids:
        pair.server.send_data(sid, bytes(pair.server.send_window(sid)))
    pair.server.ping()  # a 20-byte control frame first, so frames do not align with messages
    messages = pair.server.data_to_send()
    assert len(messages) > 1
    assert max(map(len, messages)) <= pair.server.config.max_message_size
    frames = [f for m in messages for f in decode_message(m, pair.agent.config.max_frame_size)]
    assert sum(len(f.data) for f in frames if isinstance(f, Data)) == 5 * 256 * KIB


def test_messages_never_exceed_max_message_size_with_large_peer_frames() -> None:
    big = WireConfig(
        max_frame_size=2 * MIB, max_message_size=4 * MIB, initial_stream_window=4 * MIB
    )
    pair = Pair(agent_config=big)  # the server keeps the default 1 MiB max_message_size
    sid = pair.open(pair.server)
    pair.server.send_data(sid, bytes(2 * MIB))
    sizes = [len(m) for m in pair.server.data_to_send()]
    assert max(sizes) <= pair.server.config.max_message_size, sizes


def test_open_stream_with_too_long_target_leaves_no_trace() -> None:
    pair = Pair()
    with pytest.raises(ValueError):
        pair.server.open_stream(Target("n" * 2000, "h", 80))
    assert pair.server.open_streams == 0
    assert pair.server.pending_bytes == 0


def test_open_after_closing_at_the_limit_is_not_refused() -> None:
    pair = Pair(agent_config=WireConfig(max_concurrent_streams=1))
    sid = pair.open(pair.server)
    pair.agent.end_stream(sid)
    pair.pump()
    pair.server.end_stream(sid)  # closes the stream on the server side: one slot is free
    new = pair.server.open_stream(TARGET)
    server_events, agent_events = pair.pump()
    assert ev.StreamOpenRequested(new, TARGET) in agent_events, server_events


# -- flow control across streams --------------------------------------------------------------


class Mover:
    """Moves bytes server → agent on one stream, the agent consuming what it receives."""

    def __init__(self, pair: Pair, consumers: set[int]) -> None:
        self.pair = pair
        self.consumers = consumers
        self.received: dict[int, int] = {}
        self.max_buffered: dict[int, int] = {}

    def on_event(self, conn: Connection, event: ev.Event) -> None:
        if isinstance(event, ev.DataReceived) and conn is self.pair.agent:
            sid = event.stream_id
            self.received[sid] = self.received.get(sid, 0) + len(event.data)
            if sid in self.consumers:
                conn.consumed(sid, len(event.data))
            stream = conn.streams[sid]
            self.max_buffered[sid] = max(self.max_buffered.get(sid, 0), stream.recv.buffered)
            assert stream.recv.buffered <= stream.recv.size <= conn.config.max_stream_window

    def move(self, sid: int, total: int, chunk: bytes, dt: float = 0.0) -> int:
        moved = 0
        while moved < total:
            n = min(self.pair.server.send_window(sid), len(chunk), total - moved)
            if n == 0:
                break
            self.pair.server.send_data(sid, memoryview(chunk)[:n])
            moved += n
            self.pair.pump(self.on_event)
            self.pair.clock.advance(dt)
        return moved


def test_a_stalled_stream_does_not_block_others() -> None:
    pair = Pair()
    stalled, busy = pair.open(pair.server), pair.open(pair.server)
    mover = Mover(pair, consumers={busy})
    # The stalled stream fills its window and then cannot send any more.
    assert mover.move(stalled, 10 * MIB, bytes(64 * KIB)) == 256 * KIB
    assert pair.server.send_window(stalled) == 0
    # Meanwhile 100 MiB go through on the other stream.
    assert mover.move(busy, 100 * MIB, bytes(256 * KIB), dt=0.001) == 100 * MIB
    assert mover.received[busy] == 100 * MIB
    assert mover.received[stalled] == mover.max_buffered[stalled] == 256 * KIB
    assert pair.agent.streams[stalled].recv.size == 256 * KIB  # never grew: never consumed
    assert pair.server.send_window(stalled) == 0


def test_window_grows_under_sustained_consumption_up_to_the_cap() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    mover = Mover(pair, consumers={sid})
    sizes: list[int] = []
    chunk = bytes(256 * KIB)
    for _ in range(200):
        mover.move(sid, 1 * MIB, chunk, dt=0.001)  # updates come much faster than 2 x RTT
        sizes.append(pair.agent.streams[sid].recv.size)
    assert sizes == sorted(sizes)
    assert sizes[-1] == 8 * MIB  # reached the cap...
    assert max(sizes) == 8 * MIB  # ...and never went beyond
    assert sizes[0] < 8 * MIB
    assert {256 * KIB * 2**k for k in range(6)} >= set(sizes)  # doubling steps only


def test_window_does_not_grow_when_updates_are_slow() -> None:
    pair = Pair()
    sid = pair.open(pair.server)
    mover = Mover(pair, consumers={sid})
    mover.move(sid, 8 * MIB, bytes(128 * KIB), dt=1.0)  # 1 s between updates ≫ 2 x RTT
    assert pair.agent.streams[sid].recv.size == 256 * KIB


def test_windows_stop_growing_while_half_the_budget_is_buffered() -> None:
    config = WireConfig(
        initial_stream_window=64 * KIB, max_stream_window=256 * KIB, connection_window=1 * MIB
    )
    pair = Pair(server_config=config, agent_config=config)
    stalled = [pair.open(pair.server) for _ in range(9)]  # 9 x 64 KiB > 512 KiB buffered
    busy = pair.open(pair.server)
    mover = Mover(pair, consumers={busy})
    for sid in stalled:
        mover.move(sid, 64 * KIB, bytes(64 * KIB))
    assert mover.move(busy, 300 * KIB, bytes(16 * KIB), dt=0.001) == 300 * KIB
    assert pair.agent.streams[busy].recv.size == 64 * KIB


def test_stalled_streams_holding_half_the_budget_do_not_freeze_the_connection() -> None:
    pair = Pair()
    stalled = [pair.open(pair.server) for _ in range(130)]  # 130 x 256 KiB = 32.5 MiB
    busy = pair.open(pair.server)
    mover = Mover(pair, consumers={busy})
    for sid in stalled:
        mover.move(sid, 256 * KIB, bytes(256 * KIB))
    assert mover.move(busy, 64 * MIB, bytes(256 * KIB)) == 64 * MIB


def test_connection_credit_is_returned_for_consumed_bytes_of_closed_streams() -> None:
    small = WireConfig(
        initial_stream_window=128 * KIB, max_stream_window=128 * KIB, connection_window=256 * KIB
    )
    pair = Pair(server_config=small, agent_config=small)
    sid = pair.open(pair.server)
    pair.server.send_data(sid, bytes(128 * KIB), fin=True)
    pair.pump()
    pair.agent.end_stream(sid)
    pair.pump()
    assert sid not in pair.agent.streams
    pair.agent.consumed(sid, 128 * KIB)  # the application drained it after the close
    server_events, _ = pair.pump()
    assert server_events == [ev.WindowUpdated(0)]
    other = pair.open(pair.server)
    pair.server.send_data(other, bytes(128 * KIB))
    other2 = pair.open(pair.server)
    assert pair.server.send_window(other2) == 128 * KIB


def test_fake_clock() -> None:
    clock = FakeClock(5.0)
    clock.advance(1.5)
    assert clock() == 6.5


# -- send_upto (a small write in one call) ------------------------------------------------------


def test_send_upto_queues_what_send_data_would() -> None:
    upto, data = Pair(), Pair()
    a, b = upto.open(upto.server), data.open(data.server)
    assert upto.server.send_upto(a, b"GET / HTTP/1.1\r\n\r\n", 1 << 20) == 18
    data.server.send_data(b, b"GET / HTTP/1.1\r\n\r\n")
    assert upto.server.data_to_send() == data.server.data_to_send()
    assert upto.server.send_window(a) == data.server.send_window(b) == 256 * KIB - 18
    assert upto.transfer(upto.server) == []  # already taken above
    assert upto.server.send_upto(a, memoryview(bytearray(b"view")), 1 << 20) == 4
    assert upto.transfer(upto.server) == [ev.DataReceived(a, b"view")]


def test_send_upto_stops_at_the_windows_and_the_limit() -> None:
    small = WireConfig(
        initial_stream_window=64 * KIB, max_stream_window=64 * KIB, connection_window=128 * KIB
    )
    pair = Pair(server_config=small, agent_config=small)
    sid = pair.open(pair.server)
    assert pair.server.send_upto(sid, b"x" * 10, 4) == 4  # the limit
    assert pair.server.send_upto(sid, bytes(100 * KIB), 1 << 30) == 64 * KIB - 4  # the window
    assert pair.server.send_upto(sid, b"more", 1 << 30) == 0  # no credit left
    assert pair.server.send_upto(sid, b"more", 0) == 0
    _, events = pair.pump()  # what the agent received
    received = b"".join(bytes(e.data) for e in events if isinstance(e, ev.DataReceived))
    assert received == b"xxxx" + bytes(64 * KIB - 4)


def test_send_upto_on_a_stream_that_cannot_send_is_zero() -> None:
    pair = Pair()
    assert pair.server.send_upto(999, b"x", 1 << 20) == 0  # never opened
    sid = pair.server.open_stream(TARGET)
    assert pair.server.send_upto(sid, b"x", 1 << 20) == 0  # not accepted yet
    pair.transfer(pair.server)
    pair.agent.accept_stream(sid)
    pair.transfer(pair.agent)
    pair.server.end_stream(sid)
    assert pair.server.send_upto(sid, b"x", 1 << 20) == 0  # half-closed by us
