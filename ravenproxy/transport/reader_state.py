"""The state of a tunnel connection's WebSocket reader (:mod:`.websocket`), in an object of its
own with slots.

Why not attributes of the connection: a connection object carries ``websockets``' attributes
(27 on the server side, 25 on the agent's own client) besides the reader's 18, and Python 3.11
keeps at most 29 attributes of an instance in shared-key values. Past that the instance gets a
dict of its own: every attribute load and store on it takes the hinted dict lookup, and no
method load on it is specialized (``LOAD_ATTR_WITH_HINT``, ``LOAD_METHOD_ADAPTIVE``: ~30 of them
a read in ``get_buffer`` and ``buffer_updated``, on both ends). Held here, the reader's state
is read from slots, and the connection keeps few enough attributes to stay specialized itself
(tests/unit/transport/test_connection_attributes.py holds both connections to that count).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ravenproxy.transport.scratch import Scratch
from ravenproxy.transport.wsframes import FrameParser

# Takes the binary messages of one read round, in order (TunnelConnectionMixin.deliver).
Receiver = Callable[[list[bytes | memoryview]], None]


class ReaderState:
    """What the reader keeps between reads (see :mod:`.websocket` for what each is for)."""

    __slots__ = (
        "buf",
        "delivery_error",
        "end",
        "fed",
        "in_scratch",
        "lent",
        "lost",
        "messages",
        "mode",
        "parser",
        "read_size",
        "reading_paused",
        "receiver",
        "scratch",
        "scratch_view",
        "spares",
        "start",
        "waiter",
    )

    def __init__(self, scratch: Scratch, read_size: int, mode: int) -> None:
        # Adaptive, as asyncio's own reads are: the read offered doubles while reads fill it
        # (bulk) and halves while they use less than a quarter of it; a drained buffer much
        # larger than the read size and the frames received goes back to that size (see
        # websocket.SHRINK_AFTER): a thousand idle tunnels hold a few KiB each, not a bulk
        # transfer's megabyte. None: no buffer of its own (drained, idle); the next read goes
        # to the scratch.
        self.buf: bytearray | None = bytearray(read_size)
        self.lent = False  # messages were handed on as views of buf (wsframes.LEND_MIN)
        self.spares: list[bytearray] = []  # lent buffers, to read into again once free
        self.in_scratch = False
        self.scratch, self.scratch_view = scratch.buf, scratch.view  # see Scratch
        self.read_size = read_size
        self.start = 0  # buf[start:end]: received, not parsed yet
        self.end = 0
        self.fed = 0  # bytes of buf given to websockets (the handshake's head)
        self.mode = mode
        self.parser: FrameParser | None = None
        self.messages: list[bytes | memoryview] = []  # parsed, not taken yet
        self.waiter: asyncio.Future[None] | None = None
        self.receiver: Receiver | None = None
        self.delivery_error: Exception | None = None
        self.reading_paused = False  # by us: max_queue messages not taken
        self.lost = False
