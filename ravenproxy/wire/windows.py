"""Flow-control windows: pure bookkeeping, one object per direction.

The receiver grants credit; the sender may have at most that many DATA payload bytes
outstanding. Credit comes back when the *application consumes* data, not when it arrives, so a
stalled consumer stops its own sender and nobody else, and its buffer never exceeds its window.

Auto-tuning (as QUIC implementations do it): when a receiver is about to return credit and the
previous return was less than two round-trips ago, the sender is limited by the window rather than
by the consumer, so the window doubles, up to a cap. A stream that is not being read never returns
credit, and so never grows.
"""

from __future__ import annotations

from ravenproxy.wire.errors import FlowControlError
from ravenproxy.wire.frames import MAX_WINDOW


class SendWindow:
    """Credit the peer granted us."""

    __slots__ = ("available",)

    def __init__(self, initial: int) -> None:
        self.available = initial

    def consume(self, n: int) -> None:
        # Callers check ``available`` first; reaching here is a local bug, not a peer error.
        assert n <= self.available, f"send of {n} exceeds window {self.available}"
        self.available -= n

    def grant(self, increment: int) -> None:
        if self.available + increment > MAX_WINDOW:
            raise FlowControlError(
                f"window update overflows the window ({self.available}+{increment})"
            )
        self.available += increment


class RecvWindow:
    """Credit we granted the peer, and when to grant more."""

    __slots__ = ("_last_update", "available", "half", "max_size", "size", "unacked")

    def __init__(self, initial: int, max_size: int) -> None:
        self.size = initial
        """Current window: what the peer may have outstanding."""
        self.half = initial // 2
        """``size // 2``, kept as ``size`` changes: the credit rule asks it twice a chunk
        consumed (``//`` is not specialized by Python 3.11: a generic call each time)."""
        self.max_size = max(max_size, initial)
        self.available = initial
        """What the peer may still send before we return credit."""
        self.unacked = 0
        """Consumed by the application, not yet returned to the peer."""
        self._last_update: float | None = None

    @property
    def buffered(self) -> int:
        """Received, not yet consumed."""
        return self.size - self.available - self.unacked

    def receive(self, n: int) -> None:
        if n > self.available:
            raise FlowControlError(f"peer sent {n} bytes with only {self.available} of credit")
        self.available -= n

    def consume(self, n: int, now: float, rtt: float, may_grow: bool = True) -> int:
        """The application consumed ``n`` bytes; return the increment to send (0: not yet).

        Credit goes back once half the window is consumed, so updates stay rare (one per half
        window) yet the sender never drains its credit while the consumer keeps up.
        """
        if n > self.size - self.available - self.unacked:
            raise ValueError(f"consumed {n} bytes but only {self.buffered} are buffered")
        self.unacked += n
        if self.unacked < self.half:
            return 0
        increment = self.unacked
        if (
            may_grow
            and self._last_update is not None
            and now - self._last_update < 2 * rtt
            and self.size < self.max_size
        ):
            grown = min(self.size * 2, self.max_size)
            increment += grown - self.size
            self.size, self.half = grown, grown // 2
        self._last_update = now
        self.unacked = 0
        self.available += increment
        return increment

    def consume_shared(self, n: int) -> int:
        """For the connection budget, shared by every stream: return credit once half the
        window is consumed, or as soon as the peer's remaining credit falls below half.

        Counting only consumed bytes would freeze the whole connection once stalled streams
        hold half the budget, because then half the window can never be consumed.
        """
        if n > self.size - self.available - self.unacked:
            raise ValueError(f"consumed {n} bytes but only {self.buffered} are buffered")
        self.unacked += n
        if self.unacked < self.half and self.available >= self.half:
            return 0
        increment, self.unacked = self.unacked, 0
        self.available += increment
        return increment

    def forget(self, n: int) -> int:
        """Bytes received on a stream that no longer exists: hand their credit straight back."""
        return self.consume_shared(n) if n else 0
