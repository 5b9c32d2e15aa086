"""The fronts' drain closes the kept-alive connections that wait for a next request, however
they are served (their task or callbacks): each is followed once, for its life, and its own
``waiting`` flag is read when the drain starts; a connection in the middle of an exchange is
left to finish it, one no longer followed is not touched."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ravenproxy.server.front import Drain


@dataclass(eq=False)
class Writer:
    closed: int = 0

    def close(self) -> None:
        self.closed += 1


@dataclass(eq=False)
class Connection:
    waiting: bool
    writer: Any = field(default_factory=Writer)


def test_the_drain_closes_the_waiting_connections_it_follows_once() -> None:
    drain = Drain()
    waiting, busy, gone = Connection(waiting=False), Connection(True), Connection(True)
    for conn in (waiting, busy, gone):
        drain.follow(conn)
    drain.unfollow(gone)  # ended (or relays raw bytes: it never waits for a request again)
    waiting.waiting = True  # its flag, set per request
    busy.waiting = False
    assert drain.start() == 1
    assert drain.draining
    assert (waiting.writer.closed, busy.writer.closed, gone.writer.closed) == (1, 0, 0)
