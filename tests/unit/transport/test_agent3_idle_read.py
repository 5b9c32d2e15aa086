"""agent3's idle read (issue 15): an idle reader offers the shared scratch first thing in
``get_buffer``, and a read into it of a whole number of frames, binary messages only, is handed
on without the reader taking the scratch as its buffer and letting go of it again (``rd.buf``
set and reset, start, end, fed, lent and spares reset to what they were). Differential:
e115ebc's ``get_buffer`` and ``buffer_updated``, kept verbatim below as the oracle, and today's
are driven side by side (test_review19_reader's generated streams, cut in generated
pieces; a receiver, one that raises, one that hands over; none: queued, reading paused past
max_queue; lent messages held all along)
and must leave the same reader state and hand on the same things after every read.
"""

from __future__ import annotations

import random
import sys

import pytest

from ravenproxy.transport import websocket
from ravenproxy.transport.spares import UNSHARED
from ravenproxy.transport.websocket import (
    _AWAIT_OPEN,
    _FRAMES,
    _HANDSHAKE,
    _WEBSOCKETS,
    MAX_READ,
    MIN_READ,
    SHRINK_AFTER,
)
from tests.unit.transport.test_review19_parse_into import (
    BIG_MAX,
    MAX_SIZE,
    OP_BINARY,
    _frame,
    _good,
    _stopper,
    _stream,
)
from tests.unit.transport.test_review19_reader import Traced


class Old(Traced):
    """The reader with e115ebc's get_buffer and buffer_updated."""

    def get_buffer(self, sizehint: int) -> memoryview:  # e115ebc's, verbatim
        # A read stops at the end of the frame being received, unless that leaves less than
        # the read size: a large frame then starts at the front of the buffer, and moving the
        # unparsed bytes to make room for the next one copies little.
        rd = self._rd
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

    def buffer_updated(self, nbytes: int) -> None:  # e115ebc's, verbatim
        rd = self._rd
        size = rd.read_size
        if nbytes >= size:
            rd.read_size = min(MAX_READ, size * 2)
        elif nbytes * 4 < size and size > MIN_READ:  # no max() per small read at MIN_READ
            rd.read_size = max(MIN_READ, size // 2)
        if rd.in_scratch:
            rd.in_scratch = False
            rd.buf = rd.scratch
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
        parser = rd.parser
        assert parser is not None and rd.buf is not None
        lend = rd.buf is not rd.scratch
        view = memoryview(rd.buf) if lend else rd.scratch  # lends nothing: no view
        # The binary messages go straight into the list handed on, not through a list of
        # events looked at one by one: only a read with anything else sorts it out.
        messages = rd.messages
        # Positional: a call with keywords is not specialised on 3.11 (a read on both ends).
        used = parser.parse_into(messages, view, lend, rd.start, rd.end)  # type: ignore[arg-type]
        if parser.lent:
            parser.lent, rd.lent = False, True
        rd.start += used
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


class Boom(Exception):
    pass


def _receiver(reader: Traced, how: str, rng: random.Random):  # type: ignore[no-untyped-def]
    def receive(batch: list[bytes | memoryview]) -> None:
        reader.receive(batch)
        if how == "raises" and rng.random() < 0.3:
            raise Boom(len(batch))
        if how == "switches" and rng.random() < 0.2:
            reader._rd.mode = websocket._WEBSOCKETS  # as a handover inside the receiver

    return receive


def _state(reader: Traced) -> tuple[object, ...]:
    rd = reader._rd
    buf = "none" if rd.buf is None else "scratch" if rd.buf is rd.scratch else len(rd.buf)
    error = rd.delivery_error
    return (
        buf,
        rd.start,
        rd.end,
        rd.fed,
        rd.read_size,
        rd.lent,
        len(rd.spares),
        rd.in_scratch,
        rd.mode,
        rd.reading_paused,
        None if rd.receiver is None else "set",
        None if error is None else repr(error),
        [bytes(m) for m in rd.messages],
        reader.read_buffer_size,
        None if rd.buf is None else bytes(rd.buf[rd.start : rd.end]),
    )


def _long(seed: int, masked: bool, big: bool) -> bytes:
    """Frames over several reads of the scratch's size (reads that fill it, and end anywhere
    in a frame or at its end), maybe a stop at the end."""
    rng = random.Random(seed)
    frames: list[bytes] = []
    while sum(map(len, frames)) < 3 * MIN_READ:
        frames += _good(rng, masked, big and rng.random() < 0.1)
    if rng.random() < 0.3:
        frames += _stopper(rng, masked)
    return b"".join(frames)


def _run(cls: type[Traced], wire: bytes, masked: bool, limit: int, how: str, seed: int):  # type: ignore[no-untyped-def]
    reader = cls(masked, limit)
    if seed % 2:
        reader._rd.buf = None  # idle from the start, as a reader is once drained
    if how != "queue":
        reader._rd.receiver = _receiver(reader, how, random.Random(seed))
    else:
        reader.max_queue_high = 3
    reader.transport.pause_reading = lambda: reader.trace.append(("pause",))  # type: ignore[attr-defined]
    rng = random.Random(seed)
    scratch = websocket._scratch.buf
    states = []
    at = 0
    while at < len(wire):
        view = reader.get_buffer(-1)
        offered = ("scratch" if view.obj is scratch else "own", len(view), reader._rd.in_scratch)
        small = rng.random() < 0.8  # mostly a small read: what the idle path takes
        size = rng.choice([1, 2, 3, 7, 100, 1000, 4095] if small else [MIN_READ, 5000, 70000])
        n = min(len(view), size, len(wire) - at)
        view[:n] = wire[at : at + n]
        del view
        at += n
        reader.buffer_updated(n)
        states.append(
            (offered, _state(reader), list(reader.trace), [bytes(m) for m in reader.delivered])
        )
        scratch[:] = b"\xee" * len(scratch)  # another connection's read
    return states


@pytest.mark.parametrize("how", ["deliver", "raises", "switches", "queue"])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("seed", range(90))
def test_the_idle_read_leaves_what_e115ebc_left(seed: int, masked: bool, how: str) -> None:
    big = seed % 5 == 0
    limit = BIG_MAX if big else MAX_SIZE
    wire = _stream(seed, masked, big=big) if seed % 3 else _long(seed, masked, big)
    assert _run(Traced, wire, masked, limit, how, seed) == _run(Old, wire, masked, limit, how, seed)


def test_small_messages_each_in_a_read_of_its_own_take_the_idle_path() -> None:
    """The case it is for (a request or an answer a read): nothing is held between reads, and
    the scratch is never the reader's buffer (the oracle's left it so for each read's span)."""
    reader = Traced(False, MAX_SIZE)
    reader._rd.receiver = reader.receive
    seen: list[object] = []
    reader._websockets_receive = lambda data: seen.append(data)  # type: ignore[method-assign]
    reader._rd.buf = None  # idle (a new reader holds MIN_READ of its own until it drains)
    for i in range(20):
        wire = _frame(OP_BINARY, b"answer %d" % i, False)
        view = reader.get_buffer(-1)
        assert view.obj is websocket._scratch.buf
        view[: len(wire)] = wire
        del view
        reader._rd.buf = "not touched"  # type: ignore[assignment]
        reader.buffer_updated(len(wire))
        assert reader._rd.buf == "not touched"  # the idle path neither takes nor lets go
        reader._rd.buf = None
    assert [bytes(m) for m in reader.delivered] == [b"answer %d" % i for i in range(20)]
    assert not seen
