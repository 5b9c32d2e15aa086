"""Review of rxpath2's reader (issue 15): ``buffer_updated`` now has the parser append binary
messages straight to the reader's list and sorts out only what follows the first other event
(``parse_into``'s ``special``, :meth:`TunnelConnectionMixin._sort_out`). 3466b61 looked at
every event in order: a control frame went to ``websockets`` with exactly the messages before
it already received (delivered or queued), a failure likewise, and everything after a stop went
to ``websockets``. Pinned here on generated streams (those of test_review19_parse_into, the old
parser the oracle) read in generated pieces, through the receiver and through the queue, lent
messages held all along while the reader reads on (and the shared scratch is overwritten).
"""

from __future__ import annotations

import random

import pytest
from websockets.frames import CloseCode

from ravenproxy.transport import websocket
from ravenproxy.transport.wsframes import Control, Failure, FrameParser, Handover
from tests.unit.transport.test_review19_parse_into import (
    BIG_MAX,
    MAX_SIZE,
    _OldFrameParser,
    _stream,
)
from tests.unit.transport.test_websocket_reader import Reader


class Traced(Reader):
    """The reader, with what it hands on traced in order: ``("ws", bytes, seen)`` for each
    feed of websockets, ``("fail", code, seen)``, ``("recv", n)`` for each batch delivered;
    ``seen``: the messages received by then (delivered, or queued)."""

    def __init__(self, masked: bool, limit: int) -> None:
        super().__init__(masked)
        self._rd.parser = FrameParser(masked=masked, max_size=limit)
        self.protocol.fail = self._failed
        self.trace: list[tuple[object, ...]] = []
        self.delivered: list[bytes | memoryview] = []

    def _seen(self) -> int:
        return len(self.delivered) + len(self._rd.messages)

    def _websockets_receive(self, data: bytes) -> None:
        self.trace.append(("ws", data, self._seen()))

    def _failed(self, code: CloseCode, reason: str) -> None:
        self.trace.append(("fail", code, self._seen()))

    def send_data(self) -> None:
        pass

    def receive(self, batch: list[bytes | memoryview]) -> None:
        self.trace.append(("recv", len(batch)))
        self.delivered += batch


def _read(reader: Traced, wire: bytes, rng: random.Random) -> None:
    scratch = websocket._scratch.buf
    at = 0
    while at < len(wire):
        view = reader.get_buffer(-1)
        n = min(len(view), rng.choice([1, 2, 3, 7, 100, 1000, 5000, 70000]), len(wire) - at)
        view[:n] = wire[at : at + n]
        at += n
        reader.buffer_updated(n)
        scratch[:] = b"\xee" * len(scratch)  # another connection's read


def _expected(
    wire: bytes, masked: bool, limit: int
) -> tuple[list[bytes], list[tuple[object, ...]], int]:
    """The oracle's messages, its control frames and failure each with the messages before
    it, and where the bytes handed to websockets whole start (-1: a failure, or no stop)."""
    parser = _OldFrameParser(masked=masked, max_size=limit)
    events, used = parser.parse(bytearray(wire))
    messages: list[bytes] = []
    others: list[tuple[object, ...]] = []
    tail = -1
    for event in events:
        if isinstance(event, bytes | memoryview):
            messages.append(bytes(event))
        elif isinstance(event, Control):
            others.append(("ws", event.raw, len(messages)))
            if event.opcode == 0x8:
                tail = used
        elif isinstance(event, Failure):
            others.append(("fail", event.code, len(messages)))
        else:
            assert isinstance(event, Handover)
            tail = used
    return messages, others, tail


@pytest.mark.parametrize("deliver", [True, False])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_the_reader_hands_on_events_in_stream_order(seed: int, masked: bool, deliver: bool) -> None:
    big = seed % 4 == 0
    limit = BIG_MAX if big else MAX_SIZE
    wire = _stream(seed, masked, big=big)
    messages, others, tail = _expected(wire, masked, limit)
    reader = Traced(masked, limit)
    if deliver:
        reader._rd.receiver = reader.receive
    _read(reader, wire, random.Random(seed))
    received = reader.delivered + reader._rd.messages
    # Every message, in order, lent ones intact while held through every later read.
    assert [bytes(m) for m in received] == messages
    # Each control frame and failure with exactly the messages before it already received.
    said = [entry for entry in reader.trace if entry[0] == "fail"]
    controls = [entry for entry in reader.trace if entry[0] == "ws"]
    want_controls = [entry for entry in others if entry[0] == "ws"]
    assert controls[: len(want_controls)] == want_controls
    assert said == [entry for entry in others if entry[0] == "fail"]
    if tail >= 0:  # the rest, from the stop on, to websockets, all of it, once
        rest = b"".join(entry[1] for entry in controls[len(want_controls) :])  # type: ignore[misc]
        assert rest == wire[tail:]
    elif not said:
        assert controls == want_controls
    if deliver:  # a batch per read at most: no empty one
        assert all(entry[1] for entry in reader.trace if entry[0] == "recv")


def test_the_streams_above_lend_messages() -> None:
    """The big streams are such that the reader lends messages, several held at once."""
    lent = []
    for seed in range(0, 40, 4):
        wire = _stream(seed, False, big=True)
        reader = Traced(False, BIG_MAX)
        reader._rd.receiver = reader.receive
        _read(reader, wire, random.Random(seed))
        lent.append(sum(isinstance(m, memoryview) for m in reader.delivered))
    assert max(lent) >= 2
