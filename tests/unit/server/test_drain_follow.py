"""The fronts' drain closes the kept-alive connections that wait for a next request: those a
task serves (registered per wait) and those served by callbacks (followed once, their
``waiting`` flag read when the drain starts); a connection in the middle of an exchange is left
to finish it."""

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


def test_the_drain_closes_waiting_connections_of_both_kinds_once() -> None:
    drain = Drain()
    by_task, busy_task = Writer(), Writer()
    drain.idle(by_task)
    drain.idle(busy_task)
    drain.busy(busy_task)
    waiting, busy, gone = Connection(waiting=False), Connection(waiting=False), Connection(True)
    for conn in (waiting, busy, gone):
        drain.follow(conn)
    drain.unfollow(gone)  # left callback mode (its task registers it if it waits)
    waiting.waiting = True  # its flag, set per request
    assert drain.start() == 2
    assert drain.draining
    assert (by_task.closed, waiting.writer.closed) == (1, 1)
    assert (busy_task.closed, busy.writer.closed, gone.writer.closed) == (0, 0, 0)
