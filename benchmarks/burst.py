"""Instructions per small tunnel write in a burst: many streams writing in one loop turn.

instructions.py sends requests one at a time (50 req/s under valgrind): nothing is ever queued
when a stream writes, so it never sees the path a write takes under load, behind a burst's
earlier writes (the loop's batch holds several clients' requests or targets' answers). This
runs one session pair in one process (plain TCP on loopback, uvloop, ``Session`` as the server
and agent make it), opens ``--streams`` streams, then makes ``--bursts`` bursts: in one callback,
one small ``try_write`` per stream, with the readiness probe saying "more input" for the first
(as it does for a burst's first event under load), so every later write of the burst finds the
earlier ones queued; the burst is written at the turn's end and the edge reads each chunk.

Run it under valgrind twice, with ``--bursts 0`` and ``--bursts N``, from the root of the
checkout to measure (its code is the one imported: the current directory goes first on
``sys.path``): the difference over ``N * streams`` is the cost of one write, its share of the
turn-end write and of the edge's read included::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/burst.py --bursts 0
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/burst.py --bursts 300

``--measure`` does both for the current directory and for each ``--baseline DIR`` and prints
the instructions per write. ``--alone``: no marker, so the probe finds nothing waiting and each
write goes through at once (the idle path; use ``--streams 1``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())

PAYLOAD = b"GET /metrics HTTP/1.1\r\nHost: edge-1:9100\r\n\r\n"


async def run(streams: int, bursts: int, alone: bool) -> None:
    from websockets.asyncio.server import ServerConnection, serve

    from ravenproxy.transport import readiness, ws_client
    from ravenproxy.transport.session import Session, TunnelStream
    from ravenproxy.transport.ws_server import TunnelServerConnection
    from ravenproxy.wire.frames import Target

    loop = asyncio.get_running_loop()
    cloud_session: asyncio.Future[Session] = loop.create_future()
    received = 0
    expected = 0
    arrived: asyncio.Future[None] | None = None  # set when ``expected`` bytes have arrived

    async def sink(stream: TunnelStream) -> None:
        stream.accept()
        done = loop.create_future()

        def readable() -> None:
            nonlocal received
            while (chunk := None if stream.closed else stream.read_nowait()) is not None:
                if not chunk:
                    if not done.done():
                        done.set_result(None)
                    return
                received += len(chunk)
            if arrived is not None and received >= expected and not arrived.done():
                arrived.set_result(None)
            if stream.closed and not done.done():
                done.set_result(None)

        stream.on_readable(readable)
        readable()
        await done

    async def handler(ws: ServerConnection) -> None:
        session = Session(ws, server_side=True, name="cloud")
        cloud_session.set_result(session)
        await session.run()

    server = await serve(
        handler,
        "127.0.0.1",
        0,
        compression=None,
        ping_interval=None,
        create_connection=TunnelServerConnection,
    )
    port = server.sockets[0].getsockname()[1]
    edge_ws = await ws_client.connect(f"ws://127.0.0.1:{port}")
    edge = Session(edge_ws, server_side=False, on_open=sink, name="edge")
    edge_run = asyncio.create_task(edge.run(), name="burst-edge")
    cloud = await cloud_session
    await asyncio.gather(cloud.wait_ready(), edge.wait_ready())
    target = Target("edge-1", "127.0.0.1", 10250)
    opened = [await cloud.open_stream(target) for _ in range(streams)]
    probe = readiness.of(loop)
    more = object()
    for _ in range(bursts):
        if not alone:
            probe.soon.add(more)  # a burst's first event: more input waits in this turn
        for stream in opened:
            if stream.try_write(PAYLOAD) != len(PAYLOAD):
                raise SystemExit("a write was not taken whole")
        probe.soon.discard(more)
        expected += streams * len(PAYLOAD)
        arrived = loop.create_future()
        if received < expected:
            await arrived
    for stream in opened:
        stream.write_eof()
    await asyncio.sleep(0.05)
    for stream in opened:
        stream.close()
    await edge_ws.close()
    await edge_run
    server.close()
    await server.wait_closed()


def count(root: Path, streams: int, bursts: int, alone: bool) -> int:
    out = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            str(Path(__file__).resolve()),
            "--streams",
            str(streams),
            "--bursts",
            str(bursts),
            *(["--alone"] if alone else []),
        ],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise SystemExit(f"no count in valgrind's output:\n{out}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=16, help="writes a burst (default 16)")
    parser.add_argument("--bursts", type=int, default=300, help="bursts (default 300)")
    parser.add_argument(
        "--alone",
        action="store_true",
        help="no burst: the probe says no more input, each write goes through at once",
    )
    parser.add_argument("--measure", action="store_true", help="count under valgrind, print")
    parser.add_argument("--baseline", action="append", default=[], help="another checkout")
    parser.add_argument("--rounds", type=int, default=1, help="--measure rounds (default 1)")
    args = parser.parse_args()
    if not args.measure:
        import uvloop

        uvloop.run(run(args.streams, args.bursts, args.alone))
        return
    roots = [("this", Path.cwd())] + [(d, Path(d).resolve()) for d in args.baseline]
    for r in range(args.rounds):
        for name, root in roots if r % 2 == 0 else roots[::-1]:
            base = count(root, args.streams, 0, args.alone)
            full = count(root, args.streams, args.bursts, args.alone)
            per = (full - base) / (args.bursts * args.streams)
            print(f"round {r} {name}: {per:.0f} instructions a write ({full - base} in all)")


if __name__ == "__main__":
    main()
