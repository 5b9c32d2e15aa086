"""review32: serverstack's ``_run`` (``_route_again`` and ``HttpProxy.count`` called, not
copied) on fixed conversations its generated oracle (test_serverstack_run.py) reaches only by
chance: a 1xx before the final answer and a route refused mid-connection, on a plain and on an
egress listener; each against 1bb5933's ``_run`` (that file's ``_OldRun``) and against the
figures written out here (the series counted, the routes asked)."""

from __future__ import annotations

import asyncio

import pytest

from ravenproxy.server.http_callbacks import CallbackPath

from .test_review24_callbacks import _ANSWERS, _OK, _Event
from .test_serverstack_run import _both, _OldRun, _state, _world

CONTINUE = _ANSWERS[4]  # 100 Continue, then 200
EARLY = _ANSWERS[5]  # 103 Early Hints, then 200
NO_CONTENT = _ANSWERS[2]  # 204

# A GET answered 103 then 200; one answered 100 then 200 (cut inside the 1xx); one answered
# 204; a request for a
# node with no route (refused 404, the connection kept); a last GET, answered. (A POST waiting
# for its body leaves the callbacks for the task: the oracle's world ends there.)
CONVERSATION: list[_Event] = [
    ("client", "get2"),
    ("chunk", EARLY),
    ("client", "get"),
    ("chunk", CONTINUE[:20]),
    ("chunk", CONTINUE[20:]),
    ("client", "get2"),
    ("chunk", NO_CONTENT),
    ("client", "ghost"),
    ("client", "get"),
    ("chunk", _OK),
]


def counted(world: object, series: str) -> dict[str, float]:
    return {
        dict(labels)["status"]: value
        for name, labels, value in _state(world)[-3]  # type: ignore[arg-type]
        if name == series
    }


@pytest.mark.parametrize("egress", [None, "uds"])
def test_1xx_then_final_and_a_refusal_mid_connection_as_1bb5933(egress: str | None) -> None:
    asyncio.run(_both(CONVERSATION, egress))


@pytest.mark.parametrize("egress", [None, "uds"])
def test_1xx_then_final_and_a_refusal_mid_connection_counted(egress: str | None) -> None:
    """The figures: on a plain listener an answer is counted once, by its final status (a 1xx
    head is not counted), the memo handed back each time, and the refusal leaves the callbacks
    for the task; on an egress listener every request is routed by the task (nothing counted
    or routed by ``_run``)."""

    async def main() -> None:
        world, old = _world(CallbackPath, egress), _world(_OldRun, egress)
        await asyncio.sleep(0)
        for event in CONVERSATION:
            for w in (world, old):
                w.step(event)
            for _ in range(3):
                await asyncio.sleep(0)
        assert _state(world) == _state(old)
        front = counted(world, "ravenproxy_server_front_requests_total")
        calls = _state(world)[-2]
        if egress is None:
            assert front == {"200": 2.0, "204": 1.0}, front
            memos = [None, 1, 2, 3]
            hosts = ["edge-1", "edge-1", "edge-1", "ghost"]
            assert calls == [(h, False, m) for h, m in zip(hosts, memos, strict=True)], calls
        else:
            assert front == {} and calls == [], (front, calls)
        assert counted(world, "ravenproxy_server_egress_requests_total") == {}
        assert world.task.done()  # the refusal (or the egress route) left for the task
        for w in (world, old):
            w.sock.resume_writing()

    asyncio.run(main())
