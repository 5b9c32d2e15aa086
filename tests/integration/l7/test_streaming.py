"""``kubectl logs -f``: each line the kubelet writes reaches the client within milliseconds,
not when a buffer fills (p99 under 100 ms), through the HTTP front and terminated HTTPS."""

from __future__ import annotations

import asyncio
import statistics
import time

import h11
import pytest

from tests.integration.l7.env import L7, front_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LINES = 40


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def delays_of(text: str, arrived: float) -> list[float]:
    out = []
    for line in text.splitlines():
        _, written = line.split()
        out.append(arrived - float(written))
    return out


async def test_logs_follow_through_the_http_front(l7: L7) -> None:
    conn = h11.Connection(h11.CLIENT)
    target = f"/containerLogs/default/web-1/app?follow=true&lines={LINES}"
    delays: list[float] = []
    pending = ""
    status = 0
    async with front_client(l7.http) as (reader, writer):
        writer.write(conn.send(h11.Request(method="GET", target=target, headers=[("Host", "x")])))
        writer.write(conn.send(h11.EndOfMessage()))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), 10))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                assert (b"transfer-encoding", b"chunked") in list(event.headers)
            elif isinstance(event, h11.Data):
                arrived = time.time()
                pending += bytes(event.data).decode()
                complete, _, pending = pending.rpartition("\n")
                if complete:
                    delays += delays_of(complete, arrived)
            elif isinstance(event, h11.EndOfMessage):
                break
    assert status == 200
    assert len(delays) == LINES
    assert p99(delays) < 0.1, (statistics.median(delays), max(delays))


async def test_logs_follow_with_curl_through_terminated_https(l7: L7) -> None:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-N", "--cacert", str(l7.ca),
        f"https://127.0.0.1:{l7.https}/containerLogs/default/web-1/app?follow=true&lines={LINES}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    delays: list[float] = []
    try:
        while line := await asyncio.wait_for(proc.stdout.readline(), 10):
            delays += delays_of(line.decode(), time.time())
        assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert len(delays) == LINES
    assert p99(delays) < 0.1, (statistics.median(delays), max(delays))
