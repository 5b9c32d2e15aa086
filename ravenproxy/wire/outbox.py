"""What a connection has queued to send, and how it becomes WebSocket messages.

Two queues, because they obey two ordering rules:

- **control**: connection-level frames, credit (WINDOW_UPDATE), PING and its ack, OPEN_RESULT,
  GOAWAY. They go first, so an answer is never stuck behind bulk data. Packed back to back into
  chunks of at most one message, so a flood of small answers costs its bytes, not a Python
  object per frame.
- **ordered**: OPEN, DATA and RESET, in the order they were queued. OPEN must not overtake the
  DATA+FIN that closed an earlier stream (the peer would still count it against its limit); a
  RESET must not overtake its stream's queued OPEN. DATA payloads stay apart from their header so
  they are copied once, when a message is joined (or never, for a writer that sends pieces).
  A bulk DATA frame (:data:`OWN_MESSAGE` bytes or more) is a message of its own (see there).

Everything that is not DATA counts as control output (:attr:`Outbox.control_bytes`): most of it
answers the peer's own frames, so it is what a peer that never reads would grow.
"""

from __future__ import annotations

OWN_MESSAGE = 64 * 1024
"""A DATA payload at least this large is sent as a message of its own, nothing batched with
it. The receiver reads a message into one buffer and keeps a DATA payload in place, a view of
that buffer, only when the payload is a large share of it (``frames.IN_PLACE_SHARE``: a view
keeps the whole buffer alive); bulk frames batched together are each a small share of a
message and its buffer, and were copied (on 8 streams, ~3 frames of ~230 KB a message: 99 %
of the DATA received was copied once more)."""


class Outbox:
    def __init__(self, max_message_size: int) -> None:
        self.max_message_size = max_message_size
        self._control: list[bytearray] = []
        self._ordered: list[tuple[bytes, bytes | memoryview]] = []
        self.pending_bytes = 0
        """Every byte queued."""
        self.control_bytes = 0
        """Queued bytes that are not DATA (control frames, OPEN and RESET)."""

    def control(self, raw: bytes) -> None:
        """Queue an encoded control frame (sent before anything in the ordered queue)."""
        if self._control and len(self._control[-1]) + len(raw) <= self.max_message_size:
            self._control[-1] += raw
        else:
            self._control.append(bytearray(raw))
        self.pending_bytes += len(raw)
        self.control_bytes += len(raw)

    def ordered(self, raw: bytes) -> None:
        """Queue an encoded OPEN or RESET, in order with DATA."""
        self._ordered.append((raw, b""))
        self.pending_bytes += len(raw)
        self.control_bytes += len(raw)

    def data(self, header: bytes, payload: bytes | memoryview) -> None:
        """Queue one DATA frame as its header and (referenced, not copied) payload: a frame
        never spans two messages."""
        self._ordered.append((header, payload))
        self.pending_bytes += len(header) + len(payload)

    def clear(self) -> None:
        self._control.clear()
        self._ordered.clear()
        self.pending_bytes = 0
        self.control_bytes = 0

    def take_one(self) -> tuple[bytes, bytes | memoryview] | None:
        """The usual output at request rates, one frame queued (a GET, its answer) and nothing
        else: its header and payload (``b""`` for an OPEN or a RESET), what :meth:`take_pieces`
        would return as its one message, without the lists; the outbox is empty afterwards.
        None, having taken nothing, for any other output."""
        ordered = self._ordered
        if len(ordered) != 1 or self._control:
            return None
        self.pending_bytes = self.control_bytes = 0
        return ordered.pop()

    def take_pieces(self) -> list[list[bytes | memoryview]]:
        """Everything queued, as messages of at most ``max_message_size`` bytes, each still in
        pieces (frame headers and payloads), a bulk DATA frame alone in its message; the
        outbox is empty afterwards."""
        if not self.pending_bytes:
            return []
        ordered = self._ordered
        if len(ordered) == 1 and not self._control:
            # The usual batch at request rates: one frame (a GET, its answer), one message.
            head, payload = ordered.pop()
            self.pending_bytes = self.control_bytes = 0
            return [[head, payload] if payload else [head]]
        limit = self.max_message_size
        if not self._control and self.pending_bytes < OWN_MESSAGE and self.pending_bytes <= limit:
            # The usual batch under load: a few small frames (several streams' requests or
            # answers queued in one loop turn), one message. Under OWN_MESSAGE in all, no
            # payload is bulk and no frame starts a message: the loop below would make this
            # one, asking each frame's size three times.
            one: list[bytes | memoryview] = []
            for head, payload in ordered:
                one.append(head)
                if payload:
                    one.append(payload)
            ordered.clear()
            self.pending_bytes = self.control_bytes = 0
            return [one]
        messages: list[list[bytes | memoryview]] = []
        batch: list[bytes | memoryview] = []
        size = 0
        for chunk in self._control:
            if size and size + len(chunk) > limit:
                messages.append(batch)
                batch, size = [], 0
            batch.append(bytes(chunk))
            size += len(chunk)
        alone = False  # the batch is one bulk frame: nothing joins it
        for head, payload in self._ordered:
            n = len(head) + len(payload)
            bulk = len(payload) >= OWN_MESSAGE
            if size and (alone or bulk or size + n > limit):
                messages.append(batch)
                batch, size = [], 0
            batch.append(head)
            if payload:
                batch.append(payload)
            size += n
            alone = bulk
        if batch:
            messages.append(batch)
        self.clear()
        return messages
