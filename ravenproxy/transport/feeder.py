"""The tunnel connection's protocol as its transport sees it (:mod:`.websocket`'s reader): a
:class:`asyncio.BufferedProtocol` that reads into the connection's buffer and passes every other
callback on to the connection."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Fed(Protocol):
    """What the feeder passes on to: the reader's buffer and the connection's callbacks."""

    def get_buffer(self, sizehint: int) -> memoryview: ...

    def buffer_updated(self, nbytes: int) -> None: ...

    def eof_received(self) -> bool | None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...


class Feeder(asyncio.BufferedProtocol):
    """The transport's protocol: reads into the connection's buffer and passes every other
    callback on. Needed because uvloop reads into a buffer only for a protocol that is not
    an :class:`asyncio.Protocol`, which ``websockets``' connection classes are."""

    def __init__(self, connection: Fed) -> None:
        self.get_buffer = connection.get_buffer  # type: ignore[method-assign]
        self.buffer_updated = connection.buffer_updated  # type: ignore[method-assign]
        self.eof_received = connection.eof_received  # type: ignore[method-assign]
        self.connection_lost = connection.connection_lost  # type: ignore[method-assign]
        self.pause_writing = connection.pause_writing  # type: ignore[method-assign]
        self.resume_writing = connection.resume_writing  # type: ignore[method-assign]
