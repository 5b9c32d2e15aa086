"""The per-message DATA path of a :class:`~ravenproxy.wire.connection.Connection`: a base of
it, which owns every attribute named here.

At request rates nearly every tunnel message is one small DATA frame for an open stream, and
nearly every chunk the application consumes returns no credit yet (credit goes back by half
windows). The general path spends a frame object, an event object, a ``match`` each and half a
dozen method calls on such a message; these do the same bookkeeping written out, and step
aside (changing nothing) for anything else, which then takes the general path. Both paths give
the same results for the same input (tests/unit/wire/test_data_path.py checks it over many
inputs). Still sans-I/O: a method returns what the caller has to do.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from ravenproxy.wire.codes import FrameType
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.frames import (
    COPY_BELOW,
    HEADER,
    HEADER_SIZE,
    IN_PLACE_SHARE,
    Frame,
    WindowUpdate,
)
from ravenproxy.wire.outbox import Outbox
from ravenproxy.wire.streams import RECEIVING, SENDING, Stream
from ravenproxy.wire.windows import RecvWindow, SendWindow

_DATA = int(FrameType.DATA)  # compared with a plain int: no enum code per message
# HEADER's layout with its first three fields (type, flags, reserved) as one word: a DATA
# frame without flags is one value, compared at once (not three fields unpacked, a tuple of
# five made, and each tested a message; a pack of three ints, not five, a write).
_WORDS = struct.Struct("!III")
assert _WORDS.size == HEADER.size
_DATA_WORD = _DATA << 24
# Bound once: Python 3.11 compiles ``GLOBAL.method(...)`` to an attribute load, which it can
# specialize only on a module (it takes globals for modules), so a Struct's method was looked up
# and a bound method made per message.
_unpack_words = _WORDS.unpack_from
_pack_words = _WORDS.pack


class DataPath:
    streams: dict[int, Stream]
    config: WireConfig
    closed: bool
    last_received: float
    rtt: float
    _clock: Callable[[], float]
    _settings_received: bool
    _conn_recv: RecvWindow
    _conn_send: SendWindow
    outbox: Outbox
    peer_max_frame_size: int

    if TYPE_CHECKING:  # the connection's

        def _emit(self, frame: Frame) -> None: ...

    def receive_data(
        self, message: bytes | bytearray | memoryview
    ) -> tuple[int, bytes | memoryview] | None:
        """:meth:`receive_message` of a message that is exactly one DATA frame, without FIN,
        for a stream the peer may send on, within both windows: its stream id and payload
        (what ``receive_message`` returns as ``[DataReceived(stream_id, payload)]``), with the
        same bookkeeping done. None, having changed nothing, for any other message: the
        caller gives it to ``receive_message``, which handles it (and its errors)."""
        total = len(message)
        if type(message) is not bytes or total <= HEADER_SIZE or self.closed:
            return None
        word, sid, length = _unpack_words(message)
        n = total - HEADER_SIZE
        if (
            word != _DATA_WORD  # a DATA frame, no flags (no FIN), reserved bits clear
            or length != n
            or n > self.config.max_frame_size
            or not self._settings_received
        ):
            return None
        stream = self.streams.get(sid)
        if stream is None or stream.state not in RECEIVING:
            return None
        conn_recv, recv = self._conn_recv, stream.recv
        if n > conn_recv.available or n > recv.available:
            return None  # the general path raises the flow-control error
        # RecvWindow.receive of both windows, written out (checked just above).
        conn_recv.available -= n
        recv.available -= n
        clock = self._clock  # an attribute, not a method: as a method call it is not specialized
        self.last_received = clock()
        # As frames.decode_message keeps a payload: a single frame's is most of its message.
        return sid, (message[HEADER_SIZE:] if n < COPY_BELOW else memoryview(message)[HEADER_SIZE:])

    def receive_batch(
        self, message: bytes | bytearray | memoryview
    ) -> list[tuple[int, bytes | memoryview]] | None:
        """:meth:`receive_data` of a message of several frames, each one it would take (DATA
        without FIN, not empty, for a stream the peer may send on, within both windows once
        the message's earlier frames are counted): their stream ids and payloads in order,
        what ``receive_message`` returns as one ``DataReceived`` each, with the same
        bookkeeping done. None, having changed nothing, as soon as one frame is not such a
        frame: the whole message then takes the general path.

        Under load the peer's writer sends what several streams queued in one loop turn as
        one message (on the agent at 2 000 requests a second, 2.5 DATA frames a message for
        two messages in three): each of those frames cost the general path a frame object,
        an event object, two ``match`` es and a dozen calls."""
        if type(message) is not bytes or self.closed or not self._settings_received:
            return None
        total = len(message)
        streams, conn_recv = self.streams, self._conn_recv
        max_size = self.config.max_frame_size
        got: list[tuple[int, bytes | memoryview]] = []
        view: memoryview | None = None
        pos = 0
        while pos < total:
            start = pos + HEADER_SIZE
            if start > total:
                break  # cut short: the general path raises
            word, sid, n = _unpack_words(message, pos)
            pos = start + n
            if word != _DATA_WORD or not n or pos > total or n > max_size:
                break
            stream = streams.get(sid)
            if stream is None or stream.state not in RECEIVING:
                break
            recv = stream.recv
            if n > conn_recv.available or n > recv.available:
                break
            conn_recv.available -= n
            recv.available -= n
            # As frames.decode_message keeps a payload: a view of the message only when it is
            # a large share of it.
            if n < COPY_BELOW or n * IN_PLACE_SHARE < total:
                got.append((sid, message[start:pos]))
            else:
                if view is None:
                    view = memoryview(message)
                got.append((sid, view[start:pos]))
        else:
            clock = self._clock  # as in receive_data
            self.last_received = clock()
            return got
        # Undone: the frames taken so far give their bytes back (no stream changed state, so
        # each is still where it was found).
        for sid, payload in got:
            n = len(payload)
            conn_recv.available += n
            streams[sid].recv.available += n
        return None

    def send_small_on(
        self, stream: Stream | None, data: bytes | memoryview, limit: int
    ) -> bytes | None:
        """A tunnel stream's small write as :meth:`send_upto` would send all of ``data`` in one
        DATA frame (within both windows, ``limit``, the peer's frame size and our message size,
        ``data`` bytes; the windows counted as it counts them), given the stream itself, not
        its id (as :meth:`consumed_on`): the frame's header, to write with ``data`` right away,
        where nothing is queued (the frame may go before nothing); ``b""`` where output is queued,
        the frame then queued after it as :meth:`send_upto` queues it with ``limit`` and our
        message size less what is queued (the queue stays within one message: the caller
        need not wait for it to drain); None, having changed nothing, for anything else (the
        caller calls ``send_upto``). One set of checks where a write behind a burst's queued
        frames was refused here, then checked again by ``send_upto``, its stream looked up
        by id (tests/unit/wire/test_small_send.py)."""
        if stream is None or stream.state not in SENDING:
            return None
        send, conn_send = stream.send, self._conn_send
        n = len(data)
        if (
            0 < n <= send.available
            and n <= conn_send.available
            and n <= limit
            and n <= self.peer_max_frame_size
            and type(data) is bytes
        ):
            outbox = self.outbox
            queued = outbox.pending_bytes
            if queued + HEADER_SIZE + n > self.config.max_message_size:
                return None
            send.available -= n  # as send_upto counts it
            conn_send.available -= n
            head = _pack_words(_DATA_WORD, stream.id, n)
            if not queued:
                return head
            outbox.data(head, data)
            return b""
        return None

    def consumed(self, stream_id: int, n: int) -> bool:
        """The application wrote or dropped ``n`` received bytes: return their credit. Returns
        whether that queued a WINDOW_UPDATE (mostly not: credit goes back by half windows)."""
        return self.consumed_on(self.streams.get(stream_id), n)

    def consumed_on(self, stream: Stream | None, n: int) -> bool:
        """:meth:`consumed` of the stream itself, not its id: for a caller that holds the
        :class:`Stream` (a tunnel stream holds its own; the stream is not looked up again for
        every chunk, after ``receive_data`` found it). ``stream`` is one of this connection's
        streams, taken from :attr:`streams` while it was there, or None (as ``consumed`` of an
        id not there). The same as ``consumed`` of its id even after it left ``streams``: it
        leaves only closed (``_transition``), not a state the peer sends in, as a stream not
        there counts, and ids are never used again."""
        if n <= 0:
            return False
        conn = self._conn_recv
        if stream is not None and stream.state in RECEIVING:
            # RecvWindow.consume_shared and consume, written out for the usual chunk, after
            # which neither window is due an update: only the count of unreturned credit grows.
            recv = stream.recv
            conn_unacked = conn.unacked + n
            unacked = recv.unacked + n
            half = conn.half
            if (
                conn_unacked < half
                and conn.available >= half
                and unacked < recv.half
                and conn_unacked + conn.available <= conn.size
                and unacked + recv.available <= recv.size
            ):
                conn.unacked = conn_unacked
                recv.unacked = unacked
                return False
        now = self._clock()
        inc = conn.consume_shared(n)
        queued = bool(inc)
        if inc:
            self._emit(WindowUpdate(0, inc))
        if stream is None or stream.state not in RECEIVING:
            return queued  # the peer sends no more on it: stream credit would be wasted
        # A window only grows while the connection budget is mostly free, so a few fast
        # streams cannot claim the budget that stalled ones are holding.
        may_grow = conn.buffered < self.config.connection_window // 2
        inc = stream.recv.consume(n, now, self.rtt, may_grow=may_grow)
        if inc:
            self._emit(WindowUpdate(stream.id, inc))
            return True
        return queued
