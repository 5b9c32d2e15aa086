"""agent3 (issue 15): :func:`one_frame` pops each single frame's masking key from a list cut
from the OS's random bytes, not from the key pool by an offset and a slice. RFC 6455 5.3 asks
for unpredictable keys: each key must still come from ``os.urandom``, and no 4 bytes of it may
mask two frames. (That the frame is the one e115ebc's code makes with that key:
test_review19_frame_header's oracle, which reads the key back from the new frame.)
"""

from __future__ import annotations

import itertools

import pytest
from websockets.speedups import apply_mask

from ravenproxy.transport import frame_batch
from ravenproxy.transport.frame_batch import one_frame

_HEAD = b"\x00\x01\x00\x00\x00\x00\x00\x07"


def test_every_key_comes_from_the_os_and_masks_one_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[bytes] = []
    counter = itertools.count()

    def urandom(n: int) -> bytes:
        # Distinct 4-byte words, so a key used twice (or made up) shows.
        pool = b"".join(next(counter).to_bytes(4, "big") for _ in range(n // 4))
        drawn.append(pool)
        return pool

    monkeypatch.setattr(frame_batch.os, "urandom", urandom)
    monkeypatch.setattr(frame_batch, "_frame_keys", [])  # what is left of the real pool: none
    monkeypatch.setattr(frame_batch, "_pop_key", frame_batch._frame_keys.pop)
    keys = []
    for i in range(2500):
        payload = bytes([i % 251]) * (i % 300)
        frame = one_frame(_HEAD, payload, True)
        assert frame is not None
        at = 2 if frame[1] & 0x7F < 126 else 4
        key = frame[at : at + 4]
        assert apply_mask(frame[at + 4 :], key) == _HEAD + payload
        keys.append(key)
    words = [pool[at : at + 4] for pool in drawn for at in range(0, len(pool), 4)]
    assert len(drawn) == 10  # 256 keys a draw (frame_batch._FRAME_KEYS)
    assert len(set(keys)) == len(keys)  # none twice
    assert set(keys) <= set(words)  # each from the OS's bytes
    # The rest wait to be used, none skipped or dropped.
    assert sorted(set(words) - set(keys)) == sorted(frame_batch._frame_keys)
    assert len(frame_batch._frame_keys) == 10 * 256 - 2500


def test_a_batch_still_takes_its_keys_from_the_pool() -> None:
    """FrameBatch's keys (many at once) are the pool's, apart from the single frames' list."""
    before = list(frame_batch._frame_keys)
    out = frame_batch.FrameBatch(mask=True, messages=3)
    assert len(out.keys) == 12
    assert frame_batch._frame_keys == before
