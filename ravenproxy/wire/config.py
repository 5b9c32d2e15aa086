"""One side's limits and windows (:class:`WireConfig`), and what it assumes of its peer before
the peer's SETTINGS arrive."""

from __future__ import annotations

from dataclasses import dataclass, field

from ravenproxy.wire.frames import HEADER_SIZE, MAX_FRAME_SIZE_LIMIT, MAX_WINDOW, MIN_FRAME_SIZE

KIB = 1024
MIB = 1024 * KIB

# What a peer may assume before our SETTINGS arrive (SETTINGS is always the first frame, so in
# practice only the frame size matters: it bounds that very first message).
DEFAULT_PEER_MAX_FRAME_SIZE = MIN_FRAME_SIZE
DEFAULT_PEER_MAX_STREAMS = 100


@dataclass(frozen=True)
class WireConfig:
    """Limits and windows of one side. Each field is announced to the peer or governs us."""

    max_frame_size: int = 1 * MIB - HEADER_SIZE
    """Largest frame payload we accept (announced as MAX_FRAME_SIZE): one frame fills a message
    of ``max_message_size``. As large as the relay's largest socket read
    (``socket_stream.LEND_READ``): a bulk read goes out as one frame, in a message of its own,
    which the receiver keeps in place (``outbox.OWN_MESSAGE``), and a GiB takes a quarter of
    the frames and messages 256 KiB frames took."""
    max_concurrent_streams: int = 10_000
    """Streams the peer may have open toward us at once (announced)."""
    initial_stream_window: int = 256 * KIB
    """Credit a new stream starts with, in each direction we receive."""
    max_stream_window: int = field(
        default=8 * MIB,
        metadata={  # the server's flag (ravenproxy.flags reads this; wire imports nothing)
            "flag": "--max-stream-window",
            "metavar": "BYTES",
            "help": "cap of a stream's auto-tuned receive window",
        },
    )
    """Cap for auto-tuned stream windows."""
    connection_window: int = 64 * MIB
    """Budget for bytes received but not yet consumed, over all streams (announced)."""
    max_message_size: int = 1 * MIB
    """Largest WebSocket message we send (frames are batched up to it). Not more: a peer need
    accept no more than 1 MiB and its own MAX_FRAME_SIZE + 12 (docs/protocol.md section 2)."""
    initial_rtt: float = 0.05
    """Round-trip estimate until a PING measures one."""
    max_control_pending: int = 1 * MIB
    """Unsent control output (everything queued but DATA) above which the peer should not be
    read (:attr:`Connection.should_read`). Most control output answers the peer's own frames
    (PING acks, OPEN_RESULTs): a peer that sends them and never reads the answers must not grow
    our memory. Legitimate peers stay far below: answers are small and go out first."""

    def __post_init__(self) -> None:
        if not MIN_FRAME_SIZE <= self.max_frame_size <= MAX_FRAME_SIZE_LIMIT:
            raise ValueError(
                f"max_frame_size must be {MIN_FRAME_SIZE}..{MAX_FRAME_SIZE_LIMIT}, "
                f"got {self.max_frame_size}"
            )
        if not 1 <= self.max_concurrent_streams <= 2**31:
            raise ValueError(
                f"max_concurrent_streams must be >= 1, got {self.max_concurrent_streams}"
            )
        if not 0 < self.initial_stream_window <= self.max_stream_window <= MAX_WINDOW:
            raise ValueError(
                "windows must satisfy 0 < initial_stream_window <= max_stream_window <= 2^31-1"
            )
        if not self.max_stream_window <= self.connection_window <= MAX_WINDOW:
            raise ValueError("connection_window must be >= max_stream_window and <= 2^31-1")
        if self.max_message_size < self.max_frame_size + 12:
            raise ValueError("max_message_size must hold at least one full frame")
        if self.max_control_pending <= 0:
            raise ValueError(f"max_control_pending must be > 0, got {self.max_control_pending}")
