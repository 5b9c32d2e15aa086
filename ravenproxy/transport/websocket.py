"""The tunnel's WebSocket connections: ``websockets`` for the opening handshake, the closing
handshake and anything unusual, our own frame reader for the binary messages in between.

Why this way: ``websockets`` copies each payload several times on its way in (its stream reader
slices, the unmasking, the message assembly), which is most of a bulk tunnel's receive cost.
Its connection classes accept a subclass (``create_connection=`` of ``serve``/``connect``), so
the subclass stays the transport's one protocol from the first byte to the last: no
``set_protocol`` swap, nothing ``websockets`` is waiting on ever goes missing (its
``connection_lost``, flow control and close timers are inherited as they are). The subclass is
also a :class:`asyncio.BufferedProtocol`, so TLS decrypts straight into one reusable buffer.
The server side mixes it into ``websockets``' asyncio ``ServerConnection``; the agent's side
into a smaller connection of its own on ``websockets``' sans-I/O client protocol
(:mod:`ravenproxy.transport.ws_client`), which does the same I/O around that protocol.

What goes where, by byte position (so ``websockets``' parser is always at a frame boundary
when it gets bytes):

- the HTTP head of the handshake (up to its blank line) goes to ``websockets``;
- once the connection is OPEN, :class:`~ravenproxy.transport.wsframes.FrameParser` reads the
  frames; a control frame (PING, PONG, CLOSE) goes to ``websockets`` whole, to be answered
  there; anything else the parser does not handle, and every byte after it, goes to
  ``websockets`` too (:class:`~ravenproxy.transport.wsframes.Handover`), which then answers it
  exactly as it always did;
- the server side takes over only when nothing followed the request (a real client waits for
  the 101): otherwise ``websockets`` reads that connection to the end.

An idle tunnel holds no read buffer: once the read size is back at :data:`MIN_READ` and
everything received was parsed, the buffer is let go, and the next read goes into the thread's
shared scratch buffer; only bytes that read leaves unparsed (a frame's beginning) are copied
into a buffer of the connection's own. A thousand idle agents then hold no 4 KiB each.

Large messages to the client side (the agent: unmasked frames) are not copied out of the
buffer but lent, as read-only views of it (``FrameParser(lend=True)``): the wire codec copies
the DATA it does not keep in place, and the buffer is read into again once no view of it is
left; while one is, reading goes on in a spare buffer (:mod:`.spares`).
A bulk transfer allocates no ~1 MiB ``bytes`` per message (~100 page faults per MiB before).

Binary messages are handed to the session from the read callback itself
(:meth:`TunnelConnectionMixin.deliver`): one call per read round, no task woken per message;
the session pauses the transport's reading when it must not take more. Without a receiver they
are queued for :meth:`TunnelConnectionMixin.next_messages`, at most ``max_queue`` of them before
reading pauses, as ``websockets`` does. Once either is done (the connection was lost, or handed
over), the rest of the connection is read through ``websockets`` (``async for``).
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from websockets.datastructures import Headers
from websockets.protocol import Side, State

from ravenproxy.transport.feeder import Feeder
from ravenproxy.transport.reader_state import ReaderState, Receiver
from ravenproxy.transport.readiness import watch
from ravenproxy.transport.scratch import Scratch
from ravenproxy.transport.spares import UNSHARED, swap_lent
from ravenproxy.transport.wsframes import (
    MESSAGE,
    Control,
    Event,
    Failure,
    FrameParser,
    Handover,
)

MIN_READ = 4 * 1024
"""The smallest read offered: an idle tunnel (PINGs, small streams) holds a buffer this size."""

MAX_READ = 256 * 1024 + 1024
"""The largest read offered beyond the frame being received: a 256 KiB payload and the headers
of its frames (the largest DATA frame of a peer of an earlier release). A read of 256 KiB flat
ended 22 bytes short of such a message, whose last record then took a read round of its own
(one more per message). Today's bulk messages (one DATA frame of up to 1 MiB each) are read
whole, as the frame being received."""

SHRINK_AFTER = 4
"""A drained buffer larger than this many times the current read size and the last frame's
size is given back, once reads no longer fill :data:`MAX_READ`: a bulk transfer's buffer fits
its frames (up to a message each), and giving it back after each message meant allocating it
again (zeroed) and copying the next frame's first read into it, per message."""

_HEAD_END = b"\r\n\r\n"
_ENDED = (State.CLOSING, State.CLOSED)  # (a member read on an Enum class: ~850 instructions)


_scratch = Scratch(MIN_READ)


# The reader's modes: ints, not an Enum, whose members looked up on their class go through
# EnumType.__getattr__ on Python 3.11 (~850 instructions each; 5 a small request on the agent).
_HANDSHAKE = 1  # the HTTP head still arriving: to websockets, up to its end
_AWAIT_OPEN = 2  # server side: the request is in, the 101 not sent yet
_FRAMES = 3  # ours
_WEBSOCKETS = 4  # every byte to websockets, to the end


if TYPE_CHECKING:
    from typing import Any

    from websockets.http11 import Request, Response

    class _Base(asyncio.Protocol):
        """What the reader uses of the connection class it is mixed into."""

        protocol: Any  # a websockets.protocol.Protocol: the server's or the client's
        transport: asyncio.Transport
        request: Request | None
        response: Response | None
        max_queue_high: int | None

        def send_data(self) -> None: ...

else:
    _Base = object  # at run time, the connection class comes after this one in the bases


class TunnelConnectionMixin(_Base):
    """The reader; mixed into ``websockets``' server connection class and the agent's own
    client connection (:class:`~ravenproxy.transport.ws_client.ClientSide`), before them (its
    methods win). What it hands to "websockets" goes to that class's ``data_received``: its
    sans-I/O protocol parses it there."""

    def _init_reader(self) -> None:
        self._rd = ReaderState(_scratch, MIN_READ, _HANDSHAKE)  # why apart: reader_state.py
        self.data_closed = False
        """A CLOSE was sent (websockets left OPEN) or the connection is lost: no DATA frame
        may follow. Kept by :meth:`send_data`, where all of websockets' output leaves, the
        CLOSE too: a plain attribute, asked before each write (the state is a property)."""

    # -- what the session reads -------------------------------------------------------------
    @property
    def frames_handled(self) -> bool:
        """Whether our reader took the connection over (it is OPEN and was read by us)."""
        return self._rd.parser is not None

    @property
    def read_buffer_size(self) -> int:
        """Bytes of read buffer this connection holds of its own (0 while idle)."""
        return len(self._rd.buf) if self._rd.buf is not None and not self._rd.in_scratch else 0

    async def next_messages(self) -> list[bytes | memoryview] | None:
        """The binary messages received, at least one, in order; None once the reader has
        nothing more and every further message is ``websockets``' (read it there)."""
        while not self._rd.messages:
            if self._rd.mode == _WEBSOCKETS or self._rd.lost:
                return None
            self._rd.waiter = asyncio.get_running_loop().create_future()
            try:
                await self._rd.waiter
            finally:
                self._rd.waiter = None
        batch, self._rd.messages = self._rd.messages, []
        if self._rd.reading_paused:
            self._rd.reading_paused = False
            self.transport.resume_reading()
        return batch

    async def deliver(self, receiver: Receiver) -> None:
        """Hand the binary messages received to ``receiver``, called from the read callback
        (once per read round: the loop runs other work between two), until our reader has
        nothing more: then this returns, and every further message is ``websockets``' (read it
        there). The receiver pauses the transport's reading while it must not take more.

        An exception from ``receiver`` (or given to :meth:`stop_delivery`) ends the delivery
        and is raised here; what arrives after it is queued as for :meth:`next_messages`."""
        self._rd.receiver = receiver
        try:
            if self._rd.messages:  # arrived before: in order, first
                batch, self._rd.messages = self._rd.messages, []
                if self._rd.reading_paused:
                    self._rd.reading_paused = False
                    self.transport.resume_reading()
                try:
                    receiver(batch)
                except Exception as exc:  # raised below: the session's reader handles it
                    self.stop_delivery(exc)
            while self._rd.delivery_error is None and self._rd.mode != _WEBSOCKETS:
                if self._rd.lost:
                    break
                self._rd.waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._rd.waiter
                finally:
                    self._rd.waiter = None
        finally:
            self._rd.receiver = None
        error, self._rd.delivery_error = self._rd.delivery_error, None
        if error is not None:
            raise error

    def stop_delivery(self, error: Exception) -> None:
        """End :meth:`deliver` with ``error`` (raised there)."""
        self._rd.receiver = None
        if self._rd.delivery_error is None:
            self._rd.delivery_error = error
        self._wake()

    def forget_handshake(self) -> None:
        """Let go of the handshake's headers once looked at (~3 KiB an idle tunnel keeps for
        nothing), not the request and response (without them websockets thinks it handshakes)."""
        for message in (self.request, self.response):
            if message is not None:
                message.headers = Headers()

    def _wake(self) -> None:
        if self._rd.waiter is not None and not self._rd.waiter.done():
            self._rd.waiter.set_result(None)

    # -- asyncio.BufferedProtocol -----------------------------------------------------------
    def get_buffer(self, sizehint: int) -> memoryview:
        # A read stops at the end of the frame being received, unless that leaves less than
        # the read size: a large frame then starts at the front of the buffer, and moving the
        # unparsed bytes to make room for the next one copies little.
        rd = self._rd
        if rd.buf is None and rd.mode == _FRAMES and rd.read_size == MIN_READ:
            # Idle, the usual read of a quiet tunnel: the scratch, as below, in fewer steps (a
            # read on both ends). With no buffer, nothing is lent and the parser wants 2 bytes
            # at most (0 once stopped): the buffer is let go only with every byte parsed.
            rd.in_scratch = True
            return rd.scratch_view
        parser = rd.parser
        wanted = parser.wanted if parser is not None and rd.mode == _FRAMES else 0
        room = rd.read_size
        if rd.lent:
            rd.lent = False
            if rd.buf is not None and sys.getrefcount(rd.buf) > UNSHARED:
                self._swap_lent()
        buf = rd.buf
        if buf is None:  # nothing pending (see _release)
            if rd.mode == _FRAMES and wanted <= room == MIN_READ:  # the read size's floor
                rd.in_scratch = True
                return rd.scratch_view  # all of it (MIN_READ bytes): no slice made a read
            buf = rd.buf = bytearray(max(room, wanted))
            rd.in_scratch = False  # a read offered the scratch may have got nothing
        if rd.start + wanted > len(buf) or len(buf) - rd.end < room:
            buf = self._make_room(wanted)
        stop = max(rd.start + wanted, rd.end + room)
        return memoryview(buf)[rd.end : stop]

    def buffer_updated(self, nbytes: int) -> None:
        rd = self._rd
        parser = rd.parser
        messages = rd.messages
        parsed = False  # by the idle read's path, below
        if rd.in_scratch:  # an idle tunnel's read (see get_buffer): a small message, mostly
            rd.in_scratch = False
            receiver = rd.receiver
            # Less than the scratch: the read size stays (MIN_READ). Nothing was pending (no
            # buffer of our own: start, end and fed are 0), nothing is lent from the scratch.
            if nbytes < MIN_READ and receiver is not None:
                assert parser is not None
                used = parser.parse_into(messages, rd.scratch, False, 0, nbytes)  # type: ignore[arg-type]
                if used == nbytes and parser.special < 0:
                    # Whole frames, binary messages only: handed on, and nothing kept: the
                    # reader stays idle as it was (no buffer; start, end, fed, lent, spares
                    # untouched), as the general case leaves it, in fewer steps.
                    if messages:
                        rd.messages = []
                        try:
                            receiver(messages)
                        except Exception as exc:  # as below
                            self.stop_delivery(exc)
                        if rd.mode != _FRAMES:
                            self._wake()
                    return
                # A frame's beginning left, or other events: on as a read below goes on.
                rd.start, rd.end = used, nbytes
                parsed = True
            rd.buf = rd.scratch
        if not parsed:
            size = rd.read_size
            if nbytes >= size:
                rd.read_size = min(MAX_READ, size * 2)
            elif nbytes * 4 < size and size > MIN_READ:  # no max() per small read at MIN_READ
                rd.read_size = max(MIN_READ, size // 2)
            rd.end += nbytes
            if rd.mode != _FRAMES:
                if rd.mode == _HANDSHAKE:
                    self._read_head()
                elif rd.mode == _AWAIT_OPEN:
                    self._opened()
                else:
                    self._to_websockets()
                return
            # The frames, read here, not by a method of their own: a call a read on both ends.
            assert parser is not None and rd.buf is not None
            lend = rd.buf is not rd.scratch
            view = memoryview(rd.buf) if lend else rd.scratch  # lends nothing: no view
            # The binary messages go straight into the list handed on, not through a list of
            # events looked at one by one: only a read with anything else sorts it out.
            # Positional: a call with keywords is not specialised on 3.11 (a read on both ends).
            used = parser.parse_into(messages, view, lend, rd.start, rd.end)  # type: ignore[arg-type]
            if parser.lent:
                parser.lent, rd.lent = False, True
            rd.start += used
        assert parser is not None and rd.buf is not None
        if parser.special >= 0:
            self._sort_out(messages, parser)
        if parser.stopped and rd.mode == _FRAMES:  # after a CLOSE
            rd.mode = _WEBSOCKETS
            self._to_websockets()
        if rd.start == rd.end:
            rd.start = rd.end = 0
            rd.fed = 0
            if rd.read_size <= MIN_READ and rd.mode == _FRAMES:
                rd.buf = None  # idle: hold no buffer (the next read goes to the scratch)
                rd.lent = False
                if rd.spares:  # (mostly none: no new list a read)
                    rd.spares = []
            elif rd.read_size < MAX_READ and len(rd.buf) > SHRINK_AFTER * max(
                rd.read_size, parser.last_frame
            ):
                rd.buf = bytearray(rd.read_size)
                rd.spares, rd.lent = [], False
        receiver = rd.receiver  # (a bound method in a slot: as a method load, unspecialized)
        if messages and receiver is not None:
            rd.messages = []
            try:  # not by a helper: a call per read
                receiver(messages)
            except Exception as exc:  # raised in deliver(): the session's reader handles it
                self.stop_delivery(exc)
            if rd.mode != _FRAMES:
                self._wake()
        elif messages:
            high = self.max_queue_high
            if high is not None and len(messages) >= high and not rd.reading_paused:
                rd.reading_paused = True
                self.transport.pause_reading()
            self._wake()
        elif rd.mode != _FRAMES:
            self._wake()
        if rd.buf is rd.scratch:  # bytes left unparsed: a buffer of our own for them
            self._keep_pending()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        watch(transport)  # its input can queue tunnel output (credit, answers): readiness.py
        transport.set_protocol(Feeder(self))  # before the first byte: all by buffer_updated

    def data_received(self, data: bytes) -> None:  # only if a transport ignored set_protocol
        view = self.get_buffer(len(data))
        n = min(len(view), len(data))
        view[:n] = data[:n]
        self.buffer_updated(n)
        if n < len(data):
            self.data_received(data[n:])

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._rd.lost = True
        self.data_closed = True
        self._wake()

    def send_data(self) -> None:
        try:
            super().send_data()
        finally:  # on every exit: a CLOSE whose write raised left OPEN all the same
            if self.protocol.state in _ENDED:
                self.data_closed = True

    def _sort_out(self, messages: list[bytes | memoryview], parser: FrameParser) -> None:
        """A read parsed more than binary messages: from the first other event on, each is
        taken out of ``messages`` and dealt with, in order (the messages stay, in order)."""
        events: list[Event] = messages[parser.special :]  # type: ignore[assignment]
        del messages[parser.special :]
        parser.special = -1
        for event in events:
            if isinstance(event, MESSAGE):
                messages.append(event)
            elif isinstance(event, Control):
                self._websockets_receive(event.raw)
            elif isinstance(event, Handover):
                self._rd.mode = _WEBSOCKETS
                self._to_websockets()
            elif isinstance(event, Failure):
                self._stop_frames()
                self.protocol.fail(event.code, event.reason)
                self.send_data()

    # -- the modes --------------------------------------------------------------------------
    def _read_head(self) -> None:
        buf = self._rd.buf
        assert buf is not None
        found = buf.find(_HEAD_END, max(0, self._rd.fed - 3), self._rd.end)
        if found < 0:
            self._feed_websockets(self._rd.fed, self._rd.end)
            # Only the last 3 bytes can still be part of the blank line.
            keep = min(3, self._rd.end)
            buf[:keep] = buf[self._rd.end - keep : self._rd.end]
            self._rd.start, self._rd.end, self._rd.fed = 0, keep, keep
            if self.protocol.state is not State.CONNECTING:
                self._rd.mode = _WEBSOCKETS
                self._rd.start = self._rd.end = 0
                self._wake()
            return
        head_end = found + len(_HEAD_END)
        self._feed_websockets(self._rd.fed, head_end)
        self._rd.start = head_end
        leftover = self._rd.end - head_end
        state = self.protocol.state
        if state is State.OPEN:  # the client side: websockets took the 101 at once
            self._take_over()
        elif state is State.CONNECTING and not leftover:  # the server side, before its 101
            self._rd.mode = _AWAIT_OPEN
            self._rd.start = self._rd.end = 0
        else:
            self._rd.mode = _WEBSOCKETS
            self._to_websockets()

    def _opened(self) -> None:
        if self.protocol.state is State.OPEN:
            self._take_over()
        else:
            self._rd.mode = _WEBSOCKETS
            self._to_websockets()

    def _take_over(self) -> None:
        self._rd.mode = _FRAMES
        self._rd.parser = FrameParser(
            masked=self.protocol.side is Side.SERVER,
            max_size=self.protocol.max_message_size or 2**63,
        )
        self.buffer_updated(0)  # the frames after the head, read with it (nothing new)

    def _stop_frames(self) -> None:
        """The connection failed: nothing more is parsed or delivered (websockets discards)."""
        if self._rd.mode == _FRAMES:
            self._rd.mode = _WEBSOCKETS
            self._rd.start = self._rd.end = 0
            self._wake()

    def _swap_lent(self) -> None:
        """The buffer is lent (a message received as a view of it is still held): read on in a
        spare (see :func:`~ravenproxy.transport.spares.swap_lent`)."""
        assert self._rd.buf is not None
        self._rd.buf = swap_lent(self._rd.buf, self._rd.spares, self._rd.start, self._rd.end)
        self._rd.fed -= self._rd.start
        self._rd.start, self._rd.end = 0, self._rd.end - self._rd.start

    def _keep_pending(self) -> None:
        """Copy what a read into the shared scratch left unparsed into a buffer of our own
        (room for the frame it begins, and a read beyond)."""
        assert self._rd.buf is not None
        pending = self._rd.end - self._rd.start
        wanted = self._rd.parser.wanted if self._rd.parser is not None else 0
        own = bytearray(max(wanted, pending) + self._rd.read_size)
        own[:pending] = memoryview(self._rd.buf)[self._rd.start : self._rd.end]
        self._rd.buf = own
        self._rd.fed -= self._rd.start
        self._rd.start, self._rd.end = 0, pending

    def _to_websockets(self) -> None:
        if self._rd.end > self._rd.start:
            self._feed_websockets(self._rd.start, self._rd.end)
        self._rd.start = self._rd.end = 0
        self._wake()  # the session reads on through websockets

    # -- helpers ----------------------------------------------------------------------------
    def _feed_websockets(self, start: int, end: int) -> None:
        if end > start:
            assert self._rd.buf is not None
            self._websockets_receive(bytes(self._rd.buf[start:end]))
        self._rd.fed = end

    def _websockets_receive(self, data: bytes) -> None:
        super().data_received(data)  # the connection class's: its sans-I/O protocol

    def _make_room(self, wanted: int = 0) -> bytearray:
        """Move the unparsed bytes to the front; a bigger buffer when they and ``wanted`` (the
        frame being received) do not fit, or too little room would be left to read into."""
        assert self._rd.buf is not None
        pending = self._rd.end - self._rd.start
        size = len(self._rd.buf)
        need = max(wanted, pending) + self._rd.read_size
        if need > size:
            size = max(need, 2 * size)
            new = bytearray(size)
            new[:pending] = memoryview(self._rd.buf)[self._rd.start : self._rd.end]
            self._rd.buf = new
        elif self._rd.start:
            view = memoryview(self._rd.buf)
            view[:pending] = view[self._rd.start : self._rd.end]
            view.release()
        self._rd.fed -= self._rd.start
        self._rd.start, self._rd.end = 0, pending
        return self._rd.buf
