"""The WebSocket reader's lent buffers (:mod:`.websocket`): a large message received is handed
on as a view of the read buffer, which must not be read into again while that view is held;
reading goes on in a spare buffer, and the lent one becomes a spare once its views are let go,
found by its reference count."""

from __future__ import annotations

import sys

SPARE_BYTES = 16 * 1024 * 1024
"""Lent buffers a connection keeps, in bytes at most, to read into again once the messages lent
from them are let go (see :func:`swap_lent`)."""


def _unshared_refs() -> int:
    buf = bytearray()
    return sys.getrefcount(buf)


UNSHARED = _unshared_refs()
"""What ``sys.getrefcount`` says of a buffer with one reference (an attribute, a list slot):
more means a message lent from it (a view) is still held by whoever received it."""


def swap_lent(lent: bytearray, spares: list[bytearray], start: int, end: int) -> bytearray:
    """The buffer to read on in, ``lent`` being lent: a spare that is free again and large
    enough, else a new one, holding ``lent[start:end]`` (what was not parsed yet) at its front;
    ``lent`` becomes a spare. A bulk transfer's messages are then received in place, no copy
    and no new buffer, while the messages in flight fit :data:`SPARE_BYTES`; beyond, each
    costs a new buffer, as each cost a new ``bytes`` when messages were copied."""
    fresh = None
    for i in range(len(spares)):
        if len(spares[i]) >= len(lent) and sys.getrefcount(spares[i]) <= UNSHARED:
            fresh = spares.pop(i)
            break
    if fresh is None:
        fresh = bytearray(len(lent))
    fresh[: end - start] = memoryview(lent)[start:end]
    spares.append(lent)
    kept = sum(len(spare) for spare in spares)
    while spares and kept > SPARE_BYTES:
        kept -= len(spares.pop(0))
    return fresh
