"""Review of branch agent3's idle read (41243e0, 80f2684): what its differential test
(test_agent3_idle_read) does not see.

That test compares the reader's state, what it hands on and what it feeds websockets after
each read, against e115ebc's ``get_buffer`` and ``buffer_updated`` (its ``Old``, kept verbatim
there, taken here rather than copied a second time). It does not see ``_wake``: whether
:meth:`deliver`'s (or ``next_messages``') waiter is woken. The idle path has a wake of its own
(a receiver that ended frame reading while it ran: ``deliver`` must return, the session then
reads through websockets), written out beside the general path's; with it taken out
(hand-made break), the agent3 test still passed. Here the wakes are traced too, in order
with the rest, over the same generated streams, pieces and receivers; and a real ``deliver``
must return once a receiver called from an idle read ends frame reading.

Breaks that made these fail: the idle path's ``if rd.mode != _FRAMES: self._wake()`` taken
out; the idle path taken for reads of ``nbytes <= MIN_READ``; its ``parser.special < 0``
condition dropped (special frames: control frames, CLOSE, failures, taken as messages).
"""

from __future__ import annotations

import asyncio

import pytest

from ravenproxy.transport import websocket
from ravenproxy.transport.websocket import MIN_READ
from tests.unit.transport.test_agent3_idle_read import Old, _long, _run
from tests.unit.transport.test_review19_parse_into import (
    BIG_MAX,
    MAX_SIZE,
    OP_BINARY,
    _frame,
    _stream,
)
from tests.unit.transport.test_review19_reader import Traced


class _Woken(Traced):
    def _wake(self) -> None:
        waiter = self._rd.waiter
        self.trace.append(("wake", self._rd.mode, waiter is not None and not waiter.done()))
        super()._wake()


class _OldWoken(Old):
    def _wake(self) -> None:
        waiter = self._rd.waiter
        self.trace.append(("wake", self._rd.mode, waiter is not None and not waiter.done()))
        super()._wake()


@pytest.mark.parametrize("how", ["deliver", "raises", "switches", "queue"])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("seed", range(0, 90, 3))
def test_the_idle_read_wakes_as_e115ebc_woke(seed: int, masked: bool, how: str) -> None:
    big = seed % 5 == 0
    limit = BIG_MAX if big else MAX_SIZE
    wire = _stream(seed + 1, masked, big=big) if seed % 2 else _long(seed, masked, big)
    new = _run(_Woken, wire, masked, limit, how, seed)
    old = _run(_OldWoken, wire, masked, limit, how, seed)
    assert new == old


@pytest.mark.parametrize("masked", [True, False])
async def test_deliver_returns_when_a_receiver_ends_frame_reading_in_an_idle_read(
    masked: bool,
) -> None:
    """An idle reader (no buffer), one small message read whole into the scratch: the idle
    path. Its receiver ends frame reading (as a handover inside it): ``deliver`` returns."""
    reader = Traced(masked, MAX_SIZE)
    reader._rd.buf = None  # idle, as once drained

    def receiver(batch: list[bytes | memoryview]) -> None:
        reader.receive(batch)
        reader._rd.mode = websocket._WEBSOCKETS

    delivering = asyncio.ensure_future(reader.deliver(receiver))
    await asyncio.sleep(0)
    assert reader._rd.waiter is not None  # deliver waits for reads
    wire = _frame(OP_BINARY, b"the last message", masked)
    assert len(wire) < MIN_READ
    view = reader.get_buffer(-1)
    assert view.obj is websocket._scratch.buf  # offered the scratch: the idle path's read
    view[: len(wire)] = wire
    del view
    reader.buffer_updated(len(wire))
    await asyncio.wait_for(delivering, 1.0)
    assert [bytes(m) for m in reader.delivered] == [b"the last message"]
