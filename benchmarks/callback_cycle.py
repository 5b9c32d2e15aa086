"""Instructions per keep-alive request of the server's HTTP callbacks (:class:`CallbackPath`),
counted by valgrind: a Host-routed request served the way the server serves its second and
later requests, in one process.

exchange_cycle.py counts the :class:`Exchange` alone; this counts what the callbacks add around
it, the same instructions every run (``PYTHONHASHSEED=0``, gc frozen, uvloop's loop). One
connection is put into callback mode by its own ``_by_callbacks`` after a first request (a
real :class:`SocketStream` on a stand-in transport, a stand-in tunnel stream that hands each
chunk to the callbacks' ``take`` as :meth:`TunnelStream._feed` does while it holds none,
``Router.route_again`` over a stand-in model and registry, ``HttpProxy.count`` over real
:class:`ServerMetrics`). A cycle: the client's read of latency.py's ``GET /ping?n=I``
(``SocketStream.data_received``: the socket's ``take``, ``_advance``, the exchange, ``_run``,
``_route_again``, the router's memo, the stream's ``try_write``), then the target's 2-byte
answer in one chunk (the stream's ``take``: ``_advance``, the exchange, ``_run``,
``HttpProxy.count``, the transport's write, the keep-alive turn). The stand-ins' own Python
(the transport's write, the stream's feed and ``try_write``: ~3 calls) is counted too: a
change to the callbacks moves the count by what it moves, not a share of the server.

The count is callgrind's total over ``--cycles`` + 1 000 cycles minus one of 1 000, over
``--cycles``. With ``--baseline DIR`` another checkout's code is counted too, in one run.

    .venv/bin/python benchmarks/callback_cycle.py --baseline ../base
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import exchange_cycle
from exchange_cycle import ANSWER, REQUEST, WARM


def _plain(**fields: object) -> Any:
    """An object of a class of its own holding ``fields``, as the server's context, drain,
    limits, model store and registry are (a SimpleNamespace's attribute loads are not
    specialized, nor are those of one class whose objects hold different fields: either would
    count instructions the server does not spend)."""
    obj = type("Plain", (), {})()
    obj.__dict__.update(fields)
    return obj


class _Transport:
    """The client socket's transport: written to (kept, when asked), never closing."""

    def __init__(self, keep: bool) -> None:
        self.out: list[bytes] | None = [] if keep else None

    def write(self, data: bytes) -> None:
        if self.out is not None:
            self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


class _Stream:
    """The target's tunnel stream: a chunk handed to ``take`` (it holds none), writes taken
    whole (kept, when asked)."""

    ended = False

    def __init__(self, keep: bool) -> None:
        self.sent: list[bytes] | None = [] if keep else None
        self._take: Callable[[bytes], bool] | None = None

    def on_readable(
        self, callback: Callable[[], None] | None, take: Callable[[bytes], bool] | None = None
    ) -> None:
        self._take = take

    def read_nowait(self) -> bytes | None:
        return None

    def try_write(self, data: bytes) -> int:
        if self.sent is not None:
            self.sent.append(bytes(data))
        return len(data)

    def close(self) -> None:
        raise AssertionError("the kept stream was let go")

    def feed(self, data: bytes) -> None:
        if self._take is None or not self._take(data):
            raise AssertionError("an answer's chunk was not taken as it came")


def cycles(reads: list[bytes], count: int, keep: bool = False) -> tuple[list[bytes], list[bytes]]:
    """The first ``count`` of ``reads`` through one connection in callback mode (after
    :data:`WARM` cycles, gc frozen); what went to the target and to the client (with
    ``keep``). Imported here: the checkout's ``ravenproxy`` (the current directory's)."""
    import uvloop

    from ravenproxy.metrics import ServerMetrics
    from ravenproxy.model.objects import Node, NodeAddress
    from ravenproxy.server.exchange import Exchange
    from ravenproxy.server.http_callbacks import CallbackPath
    from ravenproxy.server.http_proxy import HttpProxy
    from ravenproxy.server.router import Route, Router
    from ravenproxy.transport.bytestream import TunnelByteStream
    from ravenproxy.transport.relay import IdleWatch
    from ravenproxy.transport.socket_stream import SocketStream
    from ravenproxy.wire.frames import Target

    node = Node(name="edge-1", addresses=(NodeAddress("InternalIP", "10.1.0.1"),))
    route = Route(node, Target("edge-1", "10.1.0.1", 9100), None)

    class Routes:
        """Router's memo over a model and registry that do not change."""

        route_again = Router.route_again

        def __init__(self) -> None:
            self.store = _plain(model=object())
            self.registry = _plain(generation=0)

        def route_request(self, dest: object, over_tls: bool) -> Route:
            return route

    class Proxy:
        count = HttpProxy.count

        def __init__(self, ctx: Any) -> None:
            self.ctx, self.counters, self.front = ctx, cast(dict[int, Any], {}), "http"
            self.egress, self.over_tls = None, False

    class Connection(CallbackPath):
        __slots__ = ("ctx", "ex", "peer", "proxy", "pump", "reader", "upstream", "watch", "writer")

        def _close_upstream(self) -> None:
            raise AssertionError("the kept stream was let go")

    stream, transport = _Stream(keep), _Transport(keep)

    async def run() -> None:
        ex = Exchange(via="ravenproxy", max_head=16 * 1024)
        ex.receive_client(REQUEST % 0)
        ex.routed(route)
        ex.upstream_opened()
        ex.receive_upstream(ANSWER)
        sock = SocketStream(64 * 1024)
        sock.connection_made(cast(asyncio.Transport, transport))
        conn = Connection()
        conn.ex, conn.reader, conn.writer = ex, sock, sock
        conn.upstream = TunnelByteStream(cast(Any, stream))
        conn.pump, conn.peer, conn.watch = None, None, IdleWatch(60.0)
        conn.ctx = cast(
            Any,
            _plain(
                drain=_plain(draining=False),
                limits=_plain(idle_timeout=60.0),
                router=Routes(),
                metrics=ServerMetrics(),
            ),
        )
        conn.proxy = cast(Any, Proxy(conn.ctx))
        task = asyncio.ensure_future(conn._by_callbacks())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if conn._exit is None:
            raise AssertionError("not in callback mode")
        for i, data in enumerate(reads[: WARM + count]):
            if i == WARM:
                gc.collect()
                gc.freeze()
            sock.data_received(data)
            stream.feed(ANSWER)
        if task.done() or ex.phase != "head" or not conn.waiting:
            raise AssertionError(f"the callbacks left (the exchange is {ex.phase})")
        conn._leave([])
        await task

    uvloop.run(run())
    return stream.sent or [], transport.out or []


if __name__ == "__main__":
    exchange_cycle.main(__file__, __doc__ or "", partial(exchange_cycle.child, cycle=cycles))
