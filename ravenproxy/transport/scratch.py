"""The read buffer a thread's idle tunnel connections share (:mod:`.websocket`'s reader): an
idle connection holds no buffer of its own, its next read goes here."""

from __future__ import annotations

import threading


class Scratch(threading.local):
    """The thread's read buffer for idle connections, from a ``get_buffer`` to its read's
    ``buffer_updated`` (none if it got nothing; no other read between), and a view of it (never
    resized). A connection, made on its loop's thread, takes both once (~500 instructions)."""

    def __init__(self, size: int) -> None:
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
