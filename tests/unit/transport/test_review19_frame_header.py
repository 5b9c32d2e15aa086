"""Review of txpath's frame header table (issue 15): :func:`one_frame` takes a small frame's
header from a table up to 1 024 bytes of payload, not packed. Against 3466b61's ``one_frame``
and ``binary_frame_header``, kept VERBATIM below as oracles (names prefixed ``_old``; the old
one_frame's globals are this module's, its key pool one that hands out the new frame's key),
for every payload size one_frame takes, both MASK bits, a DATA frame split as the outbox holds
it (header, payload) and whole; and the table against RFC 6455's header bit by bit (FIN,
RSV, opcode, MASK, 7-bit or 16-bit length).
"""

from __future__ import annotations

import os
import struct

import pytest
from websockets.speedups import apply_mask

from ravenproxy.transport import frame_batch
from ravenproxy.transport.frame_batch import COALESCE, binary_frame_header, one_frame

# -- 3466b61's code, verbatim ---------------------------------------------------------------------

_pack16 = struct.Struct("!BBH").pack


class _OldKeys:
    """Stands for the old module's key pool: hands out the key set before each call."""

    POOL = 4
    pool = b""
    at = 0


_keys = _OldKeys()


def _old_one_frame(head: bytes, payload: bytes | memoryview, mask: bool) -> bytes | None:
    """The WebSocket frame of one small message, ``head`` then ``payload`` (what a session's
    outbox holds for one DATA frame: :meth:`~ravenproxy.wire.outbox.Outbox.take_one`): the
    same bytes :func:`batched` makes for it (but for the masking key), as one object, for a
    write through at request rates (a GET, its answer). None when too large for one run."""
    size = len(head) + len(payload)
    if size >= COALESCE - 16:  # a frame header and its key: the whole frame in one run
        return None
    # binary_frame_header's two cases for a size under 64 KiB, a small one's header from a
    # table (not a bytes() of a tuple: ~500 instructions a frame). The frame is one join of its
    # parts (not a joined payload, then a header added: a bytes object less).
    if mask:
        keys = _keys  # _keys.take(4), written out: a call a request on the agent
        at = keys.at
        if at + 4 > len(keys.pool):
            keys.pool, at = os.urandom(keys.POOL), 0
        keys.at = at + 4
        key = keys.pool[at : at + 4]
        ws_head = _MASKED_HEADS[size] if size < 126 else _pack16(0x82, 0xFE, size)
        return b"".join((ws_head, key, apply_mask(head + payload if payload else head, key)))
    ws_head = _HEADS[size] if size < 126 else _pack16(0x82, 126, size)
    return b"".join((ws_head, head, payload))


_HEADS = [bytes((0x82, size)) for size in range(126)]
"""The header of a binary frame of each payload size under 126 bytes, unmasked and masked."""
_MASKED_HEADS = [bytes((0x82, 0x80 | size)) for size in range(126)]


def _old_binary_frame_header(size: int, *, masked: bool = False) -> bytes:
    """Header of a final, binary WebSocket frame of ``size`` payload bytes (the masking key,
    if ``masked``, follows it)."""
    bit = 0x80 if masked else 0
    if size < 126:
        return bytes((0x82, bit | size))
    if size < 1 << 16:
        return struct.pack("!BBH", 0x82, bit | 126, size)
    return struct.pack("!BBQ", 0x82, bit | 127, size)


# -- the tests ------------------------------------------------------------------------------------

_PAYLOAD = os.urandom(COALESCE)
_HEAD = b"\x00\x01\x00\x00\x00\x00\x00\x07"  # a DATA frame's 8-byte header (as the outbox's)


def _old_of(
    new: bytes | None, head: bytes, payload: bytes | memoryview, mask: bool
) -> bytes | None:
    """The old one_frame's answer, with the key the new frame was masked with."""
    if mask and new is not None:
        at = 2 if new[1] & 0x7F < 126 else 4
        _keys.pool, _keys.at = new[at : at + 4], 0
    return _old_one_frame(head, payload, mask)


@pytest.mark.parametrize("mask", [False, True])
def test_one_frame_is_the_old_one_frame_for_every_size(mask: bool) -> None:
    for size in range(COALESCE + 2):
        if size >= len(_HEAD):
            for head, payload in (
                (_HEAD, _PAYLOAD[: size - len(_HEAD)]),
                (_HEAD, memoryview(_PAYLOAD)[: size - len(_HEAD)]),
            ):
                new = one_frame(head, payload, mask)
                assert new == _old_of(new, head, payload, mask), size
        whole = _PAYLOAD[:size]
        new = one_frame(whole, b"", mask)
        assert new == _old_of(new, whole, b"", mask), size
        if size < COALESCE - 16:
            assert (
                new is not None
                and len(new) == size + len(_old_binary_frame_header(size, masked=mask)) + 4 * mask
            )
        else:
            assert new is None


def _made_table(masked: bool) -> list[bytes]:
    """The process's header table of the kind, as its first frame of that kind makes it (a
    test run alone, or first in its worker, has sent none yet)."""
    assert one_frame(_HEAD, b"x", masked) is not None
    return frame_batch._MASKED_HEADS if masked else frame_batch._HEADS


@pytest.mark.parametrize("masked", [False, True])
def test_the_table_and_binary_frame_header_are_the_packed_headers(masked: bool) -> None:
    tables = (_made_table(masked),)
    for table in tables:
        assert len(table) == frame_batch._TABLED
        for size, header in enumerate(table):
            assert header == _old_binary_frame_header(size, masked=masked)
    for size in [*range(2048), 65535, 65536, 1 << 20, (1 << 63) - 1]:
        assert binary_frame_header(size, masked=masked) == _old_binary_frame_header(
            size, masked=masked
        )


@pytest.mark.parametrize("masked", [False, True])
def test_each_tabled_header_says_a_final_binary_frame_of_its_size(masked: bool) -> None:
    """Bit by bit (RFC 6455 5.2), not through the code that made it."""
    table = _made_table(masked)
    for size, header in enumerate(table):
        b0, b1 = header[0], header[1]
        assert b0 & 0x80  # FIN
        assert not b0 & 0x70  # RSV1-3
        assert b0 & 0x0F == 0x2  # binary
        assert bool(b1 & 0x80) == masked
        if size < 126:
            assert len(header) == 2 and b1 & 0x7F == size
        else:
            assert len(header) == 4 and b1 & 0x7F == 126
            assert int.from_bytes(header[2:4], "big") == size
