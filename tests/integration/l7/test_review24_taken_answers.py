"""Review of branch anspath through real processes: an answer's chunks handed to the callbacks as
the tunnel stream gets them (``take``), not queued and read back, reach the client whole and in
order however they come — in many small pieces a moment apart, while the client already sent
its next request (pipelined mid-answer, and a request elsewhere, which the task serves), while
the client reads nothing for a while (the chunks then held by the stream, the answer finished by
the task) — and the connection goes on serving by callbacks on the one kept stream afterwards:
one stream for all of them up to the one elsewhere (which has its own; the next a fresh one),
no stray counted.
"""

from __future__ import annotations

import asyncio

import h11
import pytest

from tests.integration.l7.env import L7, front_client
from tests.integration.targets import tcp_server

from .env import EDGE_IP

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STRAY = 'ravenproxy_server_upstream_stray_total{front="http"}'
OPENED = 'ravenproxy_server_stream_opens_total{result="ok"}'
BIG = 3 * 1024 * 1024

# The answers by the path asked, in their pieces (written a moment apart), and the body.
PIECES: dict[str, list[bytes]] = {
    "/small": [b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"he", b"l", b"lo"],
    "/chunked": [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        *[b"4\r\nl%02d\n\r\n" % i for i in range(20)],
        b"0\r\nX-T: 1\r\n\r\n",
    ],
    "/early": [
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
        b"hi",
    ],
    "/empty": [b"HTTP/1.1 204 No Content\r\nX: y\r\n\r\n"],
    "/big": [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG,
        *[bytes([i]) * (BIG // 16) for i in range(16)],
    ],
}
BODIES = {
    "/small": b"hello",
    "/chunked": b"".join(b"l%02d\n" % i for i in range(20)),
    "/early": b"hi",
    "/empty": b"",
    "/big": b"".join(bytes([i]) * (BIG // 16) for i in range(16)),
}


async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ")[1].decode().split("?")[0]
            for piece in PIECES[path]:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.005 if path == "/chunked" else 0.02)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def asked(l7: L7, path: str, n: int) -> tuple[str, str]:
    """The target and Host of the plan's ``path``: the test's target on edge-1, or (elsewhere)
    the fake kubelet's exporter, another target connection."""
    if path == "/elsewhere":
        return "/metrics", f"edge-1:{l7.kubelet.http_port}"
    return f"{path}?{n}", f"edge-1:{l7.spare_port}"


def raw(target: str, host: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


async def test_answers_taken_as_they_come_reach_the_client_whole(l7: L7) -> None:
    before = await l7.cluster.metrics()
    # (path, the next request sent as this answer's first bytes arrive, a pause in reading)
    plan = [
        ("/small", False, False),
        ("/small", False, False),  # the callbacks serve from here
        ("/chunked", True, False),
        ("/small", True, False),
        ("/early", True, False),
        ("/empty", False, False),
        ("/big", False, True),  # the client reads nothing for a while: held, the task's
        ("/chunked", False, False),
        ("/big", True, False),
        ("/small", False, False),
        ("/elsewhere", False, False),  # another node's: the task, and a stream of its own
        ("/small", False, False),
    ]
    shadow = h11.Connection(h11.CLIENT)
    async with (
        tcp_server(target, EDGE_IP, l7.spare_port),
        front_client(l7.http, abort=True) as (reader, writer),
    ):
        sent_ahead = False
        for n, (path, pipeline, pause) in enumerate(plan):
            where, host = asked(l7, path, n)
            if not sent_ahead:
                writer.write(raw(where, host))
            sent_ahead = False
            shadow.send(h11.Request(method="GET", target=where, headers=[("Host", host)]))
            shadow.send(h11.EndOfMessage())
            got, status = bytearray(), 0
            if pause:
                await asyncio.sleep(1.0)
            while True:
                event = shadow.next_event()
                if event is h11.NEED_DATA:
                    data = await asyncio.wait_for(reader.read(65536), 20)
                    assert data, f"the front closed at answer {n}"
                    shadow.receive_data(data)
                    if pipeline and not sent_ahead and n + 1 < len(plan):
                        # The next request while this answer goes on.
                        writer.write(raw(*asked(l7, plan[n + 1][0], n + 1)))
                        sent_ahead = True
                elif isinstance(event, h11.InformationalResponse):
                    assert event.status_code == 103
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    got += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            if path == "/elsewhere":
                assert status == 200, (n, status)
            else:
                assert status in (200, 204) and bytes(got) == BODIES[path], (n, path, len(got))
            shadow.start_next_cycle()
    after = await l7.cluster.metrics()
    assert after.get(STRAY, 0.0) == before.get(STRAY, 0.0)
    # The kept stream for edge-1's answers up to the one elsewhere, which lets it go for its
    # own; a fresh one after it.
    assert after[OPENED] == before[OPENED] + 3
