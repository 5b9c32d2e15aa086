"""Test helpers: a fake clock and two connections wired back to back, bytes only."""

from __future__ import annotations

from collections.abc import Callable

from ravenproxy.wire import events as ev
from ravenproxy.wire.config import WireConfig
from ravenproxy.wire.connection import Connection
from ravenproxy.wire.frames import Frame, Target, decode_message

TARGET = Target("edge-1", "127.0.0.1", 10250)

OnEvent = Callable[[Connection, ev.Event], None]


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Pair:
    """A server-side and an agent-side :class:`Connection` sharing one fake clock."""

    def __init__(
        self,
        server_config: WireConfig | None = None,
        agent_config: WireConfig | None = None,
        *,
        settle: bool = True,
    ) -> None:
        self.clock = FakeClock()
        self.server = Connection(server_side=True, config=server_config, clock=self.clock)
        self.agent = Connection(server_side=False, config=agent_config, clock=self.clock)
        if settle:
            server_events, agent_events = self.pump()
            assert [type(e) for e in server_events] == [ev.SettingsReceived]
            assert [type(e) for e in agent_events] == [ev.SettingsReceived]

    def peer(self, conn: Connection) -> Connection:
        return self.agent if conn is self.server else self.server

    def transfer(self, src: Connection, on_event: OnEvent | None = None) -> list[ev.Event]:
        """Deliver everything ``src`` has queued to its peer; return the peer's events."""
        dst = self.peer(src)
        out: list[ev.Event] = []
        for message in src.data_to_send():
            for event in dst.receive_message(message):
                out.append(event)
                if on_event is not None:
                    on_event(dst, event)
        return out

    def pump(self, on_event: OnEvent | None = None) -> tuple[list[ev.Event], list[ev.Event]]:
        """Shuttle messages both ways until both sides are quiet.

        Returns (events the server received, events the agent received)."""
        server_events: list[ev.Event] = []
        agent_events: list[ev.Event] = []
        for _ in range(100_000):
            if not (self.server.pending_bytes or self.agent.pending_bytes):
                return server_events, agent_events
            agent_events += self.transfer(self.server, on_event)
            server_events += self.transfer(self.agent, on_event)
        raise AssertionError("pump did not settle")

    def open(self, opener: Connection | None = None, target: Target = TARGET) -> int:
        """Open a stream from ``opener`` (default: the server) and have the peer accept it."""
        opener = opener or self.server
        sid = opener.open_stream(target)
        acceptor = self.peer(opener)
        requested = self.transfer(opener)
        assert ev.StreamOpenRequested(sid, target) in requested
        acceptor.accept_stream(sid)
        accepted = self.transfer(acceptor)
        assert ev.StreamAccepted(sid) in accepted
        return sid


def frames_of(messages: list[bytes], max_frame_size: int = 16 * 1024 * 1024) -> list[Frame]:
    return [f for m in messages for f in decode_message(m, max_frame_size)]
