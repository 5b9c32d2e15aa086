"""The server writes tunnel messages as raw WebSocket frames: byte-identical to websockets'."""

from __future__ import annotations

import pytest
from websockets.frames import Frame, Opcode

from ravenproxy.transport.session import _binary_frame_header


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 1 << 20, (1 << 20) + 1036])
def test_header_matches_websockets_serialisation(size: int) -> None:
    data = bytes(size)
    expected = Frame(Opcode.BINARY, data).serialize(mask=False, extensions=[])
    assert _binary_frame_header(size) + data == expected
