"""The WebSocket frames (RFC 6455 section 5.2) a tunnel sends, gathered for few large writes.

The session's writer takes what every stream queued since it last ran and hands it to the
transport as a few large writes, not one per message: over TLS each piece written is a record of
its own (and its own encryption call), and small messages (a GET and its answer) are mostly
overhead. Frames are made here (FIN + binary opcode), masked on the client side (section 5.3)
with ``websockets``' C masking; bulk payloads go on as they are, uncopied.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator

from websockets.speedups import apply_mask

WRITE_CHUNK = 256 * 1024
"""Bytes of frames the writer hands the transport at once, at most (beyond one message) before
it waits for the transport to drain."""

WRITE_THROUGH = 16 * 1024
"""Queued output under this many bytes is written by whoever queued it, when the session's
writer is idle (a request, its answer: no task step, no loop turn); more waits for the
writer's batch (bulk: few large writes)."""

COALESCE = 16 * 1024
"""Pieces smaller than this (a TLS record's payload) are gathered into one buffer; larger ones
are written as they are, after the gathered run is topped up to this size from their head."""


_HEAD16 = struct.Struct("!BBH")
_pack16 = _HEAD16.pack  # bound once: GLOBAL.method() is an attribute load a call on 3.11


class FrameBatch:
    """WebSocket frames of binary messages, gathered for one write: small pieces joined into
    runs of at most :data:`COALESCE` bytes, larger pieces (bulk payloads) left alone but for
    their head, which fills the run before them to a full record."""

    __slots__ = ("key_at", "keys", "mask", "out", "run", "size")

    def __init__(self, *, mask: bool, messages: int) -> None:
        self.mask = mask
        self.keys = _keys.take(4 * messages) if mask else b""
        """The masking keys of the batch (RFC 6455 §5.3: unpredictable)."""
        self.key_at = 0
        self.out: list[bytes | bytearray | memoryview] = []
        self.run = bytearray()
        self.size = 0

    def add(self, pieces: list[bytes | memoryview]) -> None:
        size = sum(len(p) for p in pieces)
        self.size += size
        if self.mask:
            key = self.keys[self.key_at : self.key_at + 4]
            self.key_at += 4
            payload = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            self._piece(binary_frame_header(size, masked=True) + key)
            self._piece(apply_mask(payload, key))
        else:
            self._piece(binary_frame_header(size))
            for piece in pieces:
                self._piece(piece)

    def _piece(self, piece: bytes | memoryview) -> None:
        if len(piece) < COALESCE:
            self.run += piece
            if len(self.run) >= COALESCE:
                self.out.append(self.run)
                self.run = bytearray()
            return
        if self.run:
            # Topped up to a full record from the large piece's head (a copy of less than
            # COALESCE bytes), not written as a small record of its own before it: the
            # receiver reads a bulk message's frame header and the payload's start in one
            # record, not a short record that ends its read round early (per message, a
            # round, an SSL_write and a record less).
            top = COALESCE - len(self.run)
            self.run += memoryview(piece)[:top]
            self.out.append(self.run)
            self.run = bytearray()
            piece = memoryview(piece)[top:]
            if not piece:
                return
        self.out.append(piece)

    def take(self) -> list[bytes | bytearray | memoryview]:
        out = self.out
        if self.run:
            out.append(self.run)
        self.out, self.run, self.size = [], bytearray(), 0
        return out


def batched(
    batch: list[list[bytes | memoryview]], *, mask: bool
) -> Iterator[list[bytes | bytearray | memoryview]]:
    """The frames of a batch of messages (each in pieces), as lists for one ``writelines``
    each: at most :data:`WRITE_CHUNK` bytes a list, beyond one message."""
    out = FrameBatch(mask=mask, messages=len(batch))
    for pieces in batch:
        out.add(pieces)
        if out.size >= WRITE_CHUNK or pieces is batch[-1]:
            yield out.take()


def one_small(
    batch: list[list[bytes | memoryview]], *, mask: bool
) -> list[bytes | bytearray | memoryview] | None:
    """The frame of a batch of one small message (the writer's usual batch at request rates)
    for one ``writelines``, made by :func:`one_frame`: the same bytes :func:`batched` yields
    for it, in fewer calls. None for any other batch."""
    if len(batch) != 1:
        return None
    pieces = batch[0]
    if len(pieces) == 2 and type(pieces[0]) is bytes:  # a DATA frame's header and payload
        frame = one_frame(pieces[0], pieces[1], mask)
    else:
        frame = one_frame(b"".join(pieces), b"", mask)
    return None if frame is None else [frame]


def one_frame(head: bytes, payload: bytes | memoryview, mask: bool) -> bytes | None:
    """The WebSocket frame of one small message, ``head`` then ``payload`` (what a session's
    outbox holds for one DATA frame: :meth:`~ravenproxy.wire.outbox.Outbox.take_one`): the
    same bytes :func:`batched` makes for it (but for the masking key), as one object, for a
    write through at request rates (a GET, its answer). None when too large for one run."""
    size = len(head) + len(payload)
    if size >= COALESCE - 16:  # a frame header and its key: the whole frame in one run
        return None
    # binary_frame_header's two cases for a size under 64 KiB, a small one's header from a
    # table (not a bytes() of a tuple: ~500 instructions a frame, nor a Struct.pack: ~350). The
    # frame is one join of its parts (not a joined payload, then a header added: a bytes object
    # less).
    if mask:
        try:  # one C call a frame (a request on the agent), not _keys.take(4)'s steps and slice
            key = _pop_key()
        except IndexError:  # all used: more from the OS
            key = _more_keys()
        table, second = _MASKED_HEADS, 0xFE  # the mask bit and 126: a 16-bit length follows
    else:
        key, table, second = b"", _HEADS, 126
    if size < _TABLED:
        try:
            ws_head = table[size]
        except IndexError:  # the process's first frame of its kind: its table is made
            ws_head = _tabled(table, masked=mask)[size]
    else:
        ws_head = _pack16(0x82, second, size)
    if mask:
        return b"".join((ws_head, key, apply_mask(head + payload if payload else head, key)))
    return b"".join((ws_head, head, payload))


def writes(
    batch: list[list[bytes | memoryview]], *, mask: bool
) -> Iterable[list[bytes | bytearray | memoryview]]:
    """The frames of a batch, one list per ``writelines``: :func:`one_small`'s one list for
    a batch of one small message, else :func:`batched`'s."""
    small = one_small(batch, mask=mask)
    return batched(batch, mask=mask) if small is None else (small,)


class _KeyPool:
    """Masking keys drawn from the OS :data:`POOL` bytes at a time: a small batch (a GET, its
    answer) takes 4 of them, not a ``getrandom`` call of its own. As strong as drawing each
    key alone (RFC 6455 §5.3 asks for unpredictable keys); each byte is used once."""

    POOL = 4096

    __slots__ = ("at", "pool")

    def __init__(self) -> None:
        self.pool = b""
        self.at = 0

    def take(self, n: int) -> bytes:
        if n > self.POOL:
            return os.urandom(n)
        if self.at + n > len(self.pool):
            self.pool, self.at = os.urandom(self.POOL), 0
        keys = self.pool[self.at : self.at + n]
        self.at += n
        return keys


_keys = _KeyPool()

_FRAME_KEYS = 256
"""Masking keys of single frames drawn from the OS at once: 1 KiB, a ``getrandom`` call per
256 frames (1 024 kept ~45 KB of 4-byte objects in every agent, issue 15)."""
_frame_keys: list[bytes] = []
"""The masking keys of single frames (:func:`one_frame`'s), 4 bytes each, cut from the OS's
``4 * _FRAME_KEYS`` bytes at a time and each taken once (popped): as strong as the pool's.
Popped by one C call a frame, not the pool's offset kept and a slice made (~680 instructions
a frame, valgrind)."""
_pop_key = _frame_keys.pop


def _more_keys() -> bytes:
    """:data:`_frame_keys` filled again from the OS (they were all used); one of them."""
    pool = os.urandom(4 * _FRAME_KEYS)
    _frame_keys[:] = [pool[at : at + 4] for at in range(0, len(pool), 4)]
    return _pop_key()


def binary_frame_header(size: int, *, masked: bool = False) -> bytes:
    """Header of a final, binary WebSocket frame of ``size`` payload bytes (the masking key,
    if ``masked``, follows it)."""
    bit = 0x80 if masked else 0
    if size < 126:
        return bytes((0x82, bit | size))
    if size < 1 << 16:
        return struct.pack("!BBH", 0x82, bit | 126, size)
    return struct.pack("!BBQ", 0x82, bit | 127, size)


_TABLED = 1024
"""Payload sizes under this have their frame header in a table: a small request's or answer's
(a health probe's, a GET's; most answers past 125 bytes, whose header is 4 bytes)."""
_HEADS: list[bytes] = []
"""The header of a binary frame of each payload size under :data:`_TABLED`, unmasked and
masked (~45 KB each), made at a process's first frame of the kind (:func:`_tabled`): a server
sends unmasked frames only, an agent masked ones only (issue 15: an idle agent's memory)."""
_MASKED_HEADS: list[bytes] = []


def _tabled(table: list[bytes], *, masked: bool) -> list[bytes]:
    """``table`` (:data:`_HEADS` or :data:`_MASKED_HEADS`, empty) filled."""
    table[:] = [binary_frame_header(size, masked=masked) for size in range(_TABLED)]
    return table
