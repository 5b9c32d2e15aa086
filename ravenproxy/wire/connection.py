"""The tunnel protocol as a sans-I/O state machine.

Feed it WebSocket messages with :meth:`Connection.receive_message`, act on the events it
returns, call its methods to open streams and send data, and write whatever
:meth:`Connection.data_to_send` returns as WebSocket binary messages. It never does I/O and
never reads a clock except through the ``clock`` it is given, so tests drive it with bytes
alone. :meth:`receive_data` (:mod:`ravenproxy.wire.data_path`) takes the common message, one
DATA frame, for less; GOAWAY either way, and who is told of it: :mod:`ravenproxy.wire.drain`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ravenproxy.wire import events as ev
from ravenproxy.wire.codes import ErrorCode, FrameType, Setting
from ravenproxy.wire.config import (
    DEFAULT_PEER_MAX_FRAME_SIZE,
    DEFAULT_PEER_MAX_STREAMS,
    WireConfig,
)
from ravenproxy.wire.data_path import DataPath
from ravenproxy.wire.drain import Drain, clip
from ravenproxy.wire.errors import (
    GoingAwayError,
    ProtocolError,
    StreamError,
    StreamLimitError,
    WindowExceeded,
)
from ravenproxy.wire.frames import (
    HEADER,
    MAX_FRAME_SIZE_LIMIT,
    MAX_WINDOW,
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
    encode_data_header,
    read_text_setting,
    text_setting,
)
from ravenproxy.wire.outbox import Outbox
from ravenproxy.wire.streams import SENDING, Input, State, Stream
from ravenproxy.wire.windows import RecvWindow, SendWindow

_DATA = int(FrameType.DATA)  # packed as a plain int: no enum code per frame
_pack_header = HEADER.pack  # bound once, as data_path's _unpack_header (see there)


class Connection(DataPath, Drain):
    def __init__(
        self,
        *,
        server_side: bool,
        config: WireConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        server_id: str = "",
    ) -> None:
        """``server_id``: announced as SERVER_ID when not empty (the server side's identity,
        so an agent can tell two tunnels to one server apart from tunnels to two)."""
        self.config = config or WireConfig()
        self.server_side = server_side
        self._clock = clock
        # Streams opened by the WebSocket server side are odd, by the client side even, so the
        # two sides never pick the same id.
        self._next_local_id = 1 if server_side else 2
        self._highest_peer_id = 0
        self.streams: dict[int, Stream] = {}
        self._local_open = 0
        self._peer_open = 0
        self.outbox = Outbox(self.config.max_message_size)
        """What is queued to send. Read-only outside: its ``pending_bytes``, an attribute,
        is what :attr:`pending_bytes` returns, for an adapter that checks it a few times a
        message without a property call."""
        self._settings_received = False
        self.peer_max_frame_size = DEFAULT_PEER_MAX_FRAME_SIZE
        self.peer_max_streams = DEFAULT_PEER_MAX_STREAMS
        self._conn_send = SendWindow(0)
        self._conn_recv = RecvWindow(self.config.connection_window, self.config.connection_window)
        self.rtt = self.config.initial_rtt
        self._rtt_measured = False
        self._pings: dict[bytes, float] = {}
        self.goaway_sent = None
        self.goaway_received = None
        self.on_draining = None
        self.closed = False
        self.last_received = clock()
        self.peer_server_id: str | None = None
        """The SERVER_ID the peer announced; None before its SETTINGS or if it sent none."""
        c = self.config
        self._emit(
            Settings(
                (
                    (Setting.MAX_FRAME_SIZE, c.max_frame_size),
                    (Setting.MAX_CONCURRENT_STREAMS, c.max_concurrent_streams),
                    (Setting.INITIAL_STREAM_WINDOW, c.initial_stream_window),
                    (Setting.CONNECTION_WINDOW, c.connection_window),
                    *(text_setting(Setting.SERVER_ID, server_id) if server_id else ()),
                )
            )
        )

    # -- output ---------------------------------------------------------------------------

    def _emit(self, frame: Frame) -> None:
        self.outbox.control(encode(frame))

    def data_to_send(self) -> list[bytes]:
        """Everything queued, as WebSocket messages. Connection-level frames, credit and open
        results go first, so they are never stuck behind bulk data; OPEN, DATA and RESET keep
        their relative order."""
        return [
            pieces[0] if len(pieces) == 1 and isinstance(pieces[0], bytes) else b"".join(pieces)
            for pieces in self.pieces_to_send()
        ]

    def pieces_to_send(self) -> list[list[bytes | memoryview]]:
        """As :meth:`data_to_send`, each message still in pieces (frame headers and payloads)
        for a writer that can send them without joining them first."""
        return self.outbox.take_pieces()

    @property
    def pending_bytes(self) -> int:
        return self.outbox.pending_bytes

    @property
    def control_pending(self) -> int:
        """Bytes queued that are not DATA: control frames (answers to the peer among them),
        OPEN and RESET."""
        return self.outbox.control_bytes

    @property
    def should_read(self) -> bool:
        """Whether the adapter should feed the next message now (backpressure, like a
        transport's ``pause_reading``). False while :attr:`control_pending` exceeds
        ``max_control_pending``: most control output answers the peer's frames, so a peer that
        does not read our answers is not read either, until :meth:`data_to_send` has taken the
        output. An adapter that stays paused too long gives up with :meth:`fail` and
        ``ENHANCE_YOUR_CALM`` (docs/protocol.md, section 8)."""
        return self.outbox.control_bytes <= self.config.max_control_pending

    # -- local actions ----------------------------------------------------------------------

    def open_stream(self, target: Target) -> int:
        if self.closed:
            raise StreamError("connection is closed", ErrorCode.CONNECTION_LOST)
        if self.goaway_received is not None or self.goaway_sent is not None:
            raise GoingAwayError("connection is draining")
        if self._local_open >= self.peer_max_streams:
            raise StreamLimitError(f"peer allows {self.peer_max_streams} concurrent streams")
        if not 0 < target.port < 65536:
            raise ValueError(f"port out of range: {target.port}")
        sid = self._next_local_id
        recv = self._new_recv_window()
        # Encode first: a target that cannot be encoded must leave no stream behind.
        raw = encode(Open(sid, recv.size, target))
        self._next_local_id += 2
        self.streams[sid] = Stream(sid, State.OPENING_LOCAL, True, recv)
        self._local_open += 1
        # OPEN travels in order with DATA: if it overtook the DATA+FIN that closed an earlier
        # stream, the peer could still count that stream against its limit.
        self.outbox.ordered(raw)
        return sid

    def accept_stream(self, stream_id: int) -> None:
        stream = self._local_transition(stream_id, Input.SEND_ACCEPT)
        self._emit(OpenResult(stream_id, ErrorCode.OK, stream.recv.size))

    def reject_stream(self, stream_id: int, code: ErrorCode, message: str = "") -> None:
        if code is ErrorCode.OK:
            raise ValueError("reject_stream needs an error code")
        self._local_transition(stream_id, Input.SEND_REJECT)
        self._emit(OpenResult(stream_id, code, 0, clip(message)))

    def send_window(self, stream_id: int) -> int:
        """How many bytes ``send_data`` accepts now on this stream."""
        stream = self.streams.get(stream_id)
        if stream is None or not stream.can_send:
            return 0
        return min(stream.send.available, self._conn_send.available)

    def send_data(self, stream_id: int, data: bytes | memoryview, fin: bool = False) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or not stream.can_send:
            raise StreamError(f"stream {stream_id} cannot send ({stream!r})")
        n = len(data)
        if n > stream.send.available or n > self._conn_send.available:
            raise WindowExceeded(
                f"stream {stream_id}: {n} bytes exceed the window "
                f"({stream.send.available} stream, {self._conn_send.available} connection)"
            )
        stream.send.consume(n)
        self._conn_send.consume(n)
        # Never build a message larger than our own message limit, whatever the peer allows.
        step = min(self.peer_max_frame_size, self.config.max_message_size - 12)
        if 0 < n <= step and type(data) is bytes:  # one frame, nothing to copy (small writes)
            self.outbox.data(encode_data_header(stream_id, n, fin), data)
            if fin:
                self._transition(stream, Input.SEND_FIN)
            return
        view = memoryview(data)
        if not view.readonly:
            # Queued payloads are referenced, not copied, until data_to_send() joins them into
            # a message: a buffer the caller may reuse must be copied now.
            view = memoryview(bytes(view))
        for pos in range(0, n, step):
            chunk = view[pos : pos + step]
            last = pos + step >= n
            # Header and payload stay one entry: a frame never spans two messages.
            self.outbox.data(encode_data_header(stream_id, len(chunk), fin and last), chunk)
        if n == 0 and fin:
            self.outbox.data(encode_data_header(stream_id, 0, True), b"")
        if fin:
            self._transition(stream, Input.SEND_FIN)

    def send_upto(self, stream_id: int, data: bytes | memoryview, limit: int) -> int:
        """:meth:`send_data` of as much of ``data`` as the windows (:meth:`send_window`) and
        ``limit`` allow; returns how much (0: nothing, also on a stream that cannot send). One
        call where a small write made two, each looking the stream up and checking it."""
        stream = self.streams.get(stream_id)
        if stream is None or stream.state not in SENDING:  # not stream.can_send
            return 0
        send, conn_send = stream.send, self._conn_send
        n = len(data)
        if (
            0 < n <= send.available
            and n <= conn_send.available
            and n <= limit
            and n <= self.peer_max_frame_size
            and n <= self.config.max_message_size - 12
            and type(data) is bytes
        ):
            # All of it, in send_data's one-frame case (its checks are the ones above), its
            # calls written out: SendWindow.consume of both windows, encode_data_header. No
            # min() (a builtin call of four arguments is ~900 instructions, two a small write).
            send.available -= n
            conn_send.available -= n
            self.outbox.data(_pack_header(_DATA, 0, 0, stream_id, n), data)
            return n
        n = min(n, send.available, conn_send.available, limit)
        if n <= 0:
            return 0
        self.send_data(stream_id, data if n == len(data) else memoryview(data)[:n])
        return n

    def end_stream(self, stream_id: int) -> None:
        """Half-close: we send no more data (the peer may still)."""
        self.send_data(stream_id, b"", fin=True)

    def reset_stream(self, stream_id: int, code: ErrorCode, message: str = "") -> None:
        """Abort a stream. Idempotent: resetting a stream that is already gone does nothing."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        self._transition(stream, Input.SEND_RESET)
        # In order with OPEN and DATA: a RESET overtaking its stream's queued OPEN would name
        # a stream the peer has never heard of.
        self.outbox.ordered(encode(Reset(stream_id, code, clip(message))))

    def ping(self) -> None:
        payload = os.urandom(8)
        self._pings[payload] = self._clock()
        if len(self._pings) > 16:  # unanswered pings must not pile up forever
            self._pings.pop(next(iter(self._pings)))
        self._emit(Ping(payload))

    def fail(self, code: ErrorCode, reason: str = "") -> None:
        """A connection error found outside this object (a text message, a peer that floods):
        drop everything queued, since nothing is worth sending to a peer we give up on but the
        reason, queue ``GOAWAY(code)`` and mark the connection closed. Flush, then close."""
        if code is ErrorCode.OK:
            raise ValueError("fail needs an error code")
        self.outbox.clear()
        self.closed = True
        self._send_goaway(code, reason)

    @property
    def open_streams(self) -> int:
        return len(self.streams)

    # -- input ------------------------------------------------------------------------------

    def receive_message(self, message: bytes | bytearray | memoryview) -> list[ev.Event]:
        """Process one WebSocket message. On a protocol violation, queue GOAWAY with the code,
        mark the connection closed and raise :class:`ProtocolError`: flush, then close."""
        if self.closed:
            return []
        self.last_received = self._clock()
        out: list[ev.Event] = []
        try:
            for frame in decode_message(message, self.config.max_frame_size):
                self._receive_frame(frame, out)
        except ProtocolError as exc:
            self.closed = True
            self._send_goaway(exc.code, exc.message)
            raise
        return out

    def _receive_frame(self, frame: Frame, out: list[ev.Event]) -> None:
        if not self._settings_received and not isinstance(frame, Settings):
            raise ProtocolError(f"first frame must be SETTINGS, got {type(frame).__name__}")
        match frame:
            case Data():
                self._recv_data(frame, out)
            case WindowUpdate():
                self._recv_window_update(frame, out)
            case Open():
                self._recv_open(frame, out)
            case OpenResult():
                self._recv_open_result(frame, out)
            case Reset():
                stream = self._peer_stream(frame.stream_id)
                if stream is not None:
                    self._transition(stream, Input.RECV_RESET)
                    out.append(ev.StreamReset(frame.stream_id, frame.code, frame.message))
            case Ping():
                self._recv_ping(frame, out)
            case GoAway():
                self._recv_goaway(frame, out)
            case Settings():
                self._recv_settings(frame, out)

    def _recv_data(self, frame: Data, out: list[ev.Event]) -> None:
        n = len(frame.data)
        self._conn_recv.receive(n)
        stream = self._peer_stream(frame.stream_id)
        if stream is None:
            # In flight when we reset the stream: drop it, but give its credit back.
            inc = self._conn_recv.forget(n)
            if inc:
                self._emit(WindowUpdate(0, inc))
            return
        if stream.next_state(Input.RECV_DATA) is None:
            raise ProtocolError(f"DATA on stream {stream.id} in state {stream.state.value}")
        stream.recv.receive(n)
        if n:
            out.append(ev.DataReceived(frame.stream_id, frame.data))
        if frame.fin:
            self._transition(stream, Input.RECV_FIN)
            out.append(ev.StreamEnded(frame.stream_id))

    def _recv_window_update(self, frame: WindowUpdate, out: list[ev.Event]) -> None:
        if frame.stream_id == 0:
            self._conn_send.grant(frame.increment)
            out.append(ev.WindowUpdated(0))
            return
        stream = self._peer_stream(frame.stream_id)
        if stream is not None:
            stream.send.grant(frame.increment)
            out.append(ev.WindowUpdated(frame.stream_id))

    def _recv_open(self, frame: Open, out: list[ev.Event]) -> None:
        sid = frame.stream_id
        if (sid % 2 == 1) == self.server_side:
            raise ProtocolError(f"OPEN with stream id {sid} of the wrong parity")
        if sid <= self._highest_peer_id:
            raise ProtocolError(
                f"OPEN reuses stream id {sid} (highest so far {self._highest_peer_id})"
            )
        self._highest_peer_id = sid
        if not 0 < frame.target.port < 65536:
            raise ProtocolError(f"OPEN with port {frame.target.port}")
        if self.goaway_sent is not None:
            self._emit(OpenResult(sid, ErrorCode.GOING_AWAY, 0, "connection is draining"))
            return
        if self._peer_open >= self.config.max_concurrent_streams:
            msg = f"limit of {self.config.max_concurrent_streams} concurrent streams reached"
            self._emit(OpenResult(sid, ErrorCode.TOO_MANY_STREAMS, 0, msg))
            return
        stream = Stream(sid, State.OPENING_REMOTE, False, self._new_recv_window())
        stream.send = SendWindow(frame.window)
        self.streams[sid] = stream
        self._peer_open += 1
        out.append(ev.StreamOpenRequested(sid, frame.target))

    def _recv_open_result(self, frame: OpenResult, out: list[ev.Event]) -> None:
        stream = self._peer_stream(frame.stream_id)
        if stream is None:
            return
        if frame.code is ErrorCode.OK:
            self._transition(stream, Input.RECV_ACCEPT)
            stream.send = SendWindow(frame.window)
            out.append(ev.StreamAccepted(stream.id))
        else:
            self._transition(stream, Input.RECV_REJECT)
            out.append(ev.StreamRejected(stream.id, frame.code, frame.message))

    def _recv_ping(self, frame: Ping, out: list[ev.Event]) -> None:
        if not frame.ack:
            self._emit(Ping(frame.payload, ack=True))
            return
        sent = self._pings.pop(frame.payload, None)
        if sent is None:
            return  # an answer to a ping we gave up on
        sample = max(self._clock() - sent, 0.0)
        # Smoothed like TCP's SRTT so one queued-behind-bulk-data ping does not dominate.
        first = not self._rtt_measured
        self._rtt_measured = True
        self.rtt = sample if first else 0.875 * self.rtt + 0.125 * sample
        out.append(ev.PingAcked(sample))

    def _recv_settings(self, frame: Settings, out: list[ev.Event]) -> None:
        if self._settings_received:
            raise ProtocolError("SETTINGS sent twice")
        self._settings_received = True
        self.peer_server_id = read_text_setting(frame.values, Setting.SERVER_ID)
        named: dict[str, int] = {}
        for key, value in frame.values:
            if key == Setting.MAX_FRAME_SIZE:
                if not MIN_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
                    raise ProtocolError(f"MAX_FRAME_SIZE {value} out of range")
                self.peer_max_frame_size = value
            elif key == Setting.MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == Setting.CONNECTION_WINDOW:
                if value > MAX_WINDOW:
                    raise ProtocolError(f"CONNECTION_WINDOW {value} out of range")
                self._conn_send = SendWindow(value)
            elif key == Setting.INITIAL_STREAM_WINDOW:
                pass  # informative: each OPEN / OPEN_RESULT carries the actual window
            elif key == Setting.SERVER_ID:
                continue  # text, read above from all its entries
            else:
                continue  # unknown settings are ignored, for forward compatibility
            named[Setting(key).name] = value
        out.append(ev.SettingsReceived(named, self.peer_server_id))

    # -- helpers ----------------------------------------------------------------------------

    def _new_recv_window(self) -> RecvWindow:
        return RecvWindow(self.config.initial_stream_window, self.config.max_stream_window)

    def _peer_stream(self, sid: int) -> Stream | None:
        """The stream a peer frame refers to; None when it is already closed (frames crossing
        a reset are normal); a protocol error when the id was never opened."""
        stream = self.streams.get(sid)
        if stream is not None:
            return stream
        local = (sid % 2 == 1) == self.server_side
        if (local and sid < self._next_local_id) or (not local and sid <= self._highest_peer_id):
            return None
        raise ProtocolError(f"frame for stream {sid}, which was never opened")

    def _local_transition(self, sid: int, event: Input) -> Stream:
        stream = self.streams.get(sid)
        if stream is None or stream.next_state(event) is None:
            raise StreamError(f"cannot {event.value} stream {sid} ({stream!r})")
        self._transition(stream, event)
        return stream

    def _transition(self, stream: Stream, event: Input) -> None:
        new = stream.next_state(event)
        if new is None:
            raise ProtocolError(
                f"{event.value} on stream {stream.id} in state {stream.state.value}"
            )
        stream.state = new
        if new is State.CLOSED:
            del self.streams[stream.id]
            if stream.local:
                self._local_open -= 1
            else:
                self._peer_open -= 1
