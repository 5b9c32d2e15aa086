"""Each refusal: its status, a one-line body naming the node and the reason, a log line and a
labelled counter — through the HTTP front (Host, forward proxy, CONNECT) and terminated HTTPS."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from ravenproxy.transport.linger import LINGER_TIMEOUT
from tests.helpers import run, upload
from tests.integration.l7.env import L7, curl, front_client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def cases(l7: L7) -> list[tuple[str, int, str]]:
    k = l7.kubelet
    return [
        ("edge-9:80", 404, "edge-9: unknown node"),
        ("edge-3:10250", 503, "edge-3: no agent connected for this node"),
        ("edge-1:9", 403, "edge-1: refused by the agent's allowlist"),
        (f"edge-1:{l7.refused_port}", 502, "edge-1: the agent could not connect"),
        (f"edge-2:{k.tls_port}", 502, "edge-2: the agent could not connect"),
        (f"edge-1:{l7.blackhole_port}", 504, "edge-1: the agent's dial timed out"),
    ]


def front_count(metrics: dict[str, float], front: str, status: int) -> float:
    return metrics.get(
        f'ravenproxy_server_front_requests_total{{front="{front}",status="{status}"}}', 0.0
    )


@pytest.mark.parametrize("style", ["host", "forward-proxy", "connect"])
async def test_http_front_errors(l7: L7, style: str) -> None:
    for target, status, text in cases(l7):
        before = await l7.cluster.metrics()
        proxy = f"http://127.0.0.1:{l7.http}"
        if style == "host":
            args = ["-H", f"Host: {target}", f"{proxy}/healthz"]
        elif style == "forward-proxy":
            args = ["-x", proxy, f"http://{target}/healthz"]
        else:
            # CONNECT: curl reports the proxy's refusal; -v shows the status, -sS the rest.
            args = ["-p", "-x", proxy, f"http://{target}/healthz"]
        if style == "connect":
            code, _, err = await run("curl", "-sS", "-v", *args)
            assert code == 56, err  # "CONNECT tunnel failed"
            assert f"< HTTP/1.1 {status}" in err, err
        else:
            got, body = await curl(*args)
            assert got == status, (target, body)
            assert body.startswith(text), (target, body)
            assert "\n" not in body.rstrip("\n"), body  # one line
        after = await l7.cluster.metrics()
        assert front_count(after, "http", status) == front_count(before, "http", status) + 1
    log = l7.server_log()
    assert "http front: refused" in log and "node=edge-9" in log and "status=404" in log
    assert "status=504" in log


async def test_unknown_and_unserved_pods(l7: L7) -> None:
    base = f"http://127.0.0.1:{l7.http}"
    status, body = await curl(f"{base}/exec/default/nope/c?command=sh")
    assert (status, body.strip()) == (404, "pod default/nope: pod not found on any node")
    status, body = await curl(f"{base}/containerLogs/default/away/c")
    assert (status, body.strip()) == (503, "edge-3: no agent connected for this node")


async def test_terminated_https_errors(l7: L7) -> None:
    before = await l7.cluster.metrics()
    status, body = await curl(
        "--cacert", str(l7.ca), "-H", "Host: edge-9:10250", f"https://127.0.0.1:{l7.https}/x"
    )  # fmt: skip
    assert (status, body.strip()) == (404, "edge-9: unknown node")
    after = await l7.cluster.metrics()
    assert front_count(after, "https", 404) == front_count(before, "https", 404) + 1
    assert "https front: refused" in l7.server_log()


@pytest.mark.parametrize("front", ["http", "https"])
async def test_a_refused_upload_gets_its_answer(l7: L7, front: str) -> None:
    """A request refused before its body was read (here: an unknown node) is answered, and the
    answer reaches a client that writes the whole body before it reads: the front half-closes
    (plain HTTP) and reads and drops what the client still sends until it is done, instead of
    closing a socket that holds unread bytes — which resets the connection (RST), so the
    client's writes fail and its answer is lost, as the old front did (a lingering close, as
    nginx's lingering_close, Apache's lingering_close and HAProxy do)."""
    size = 32 * 1024 * 1024  # more than loopback's socket buffers hold on both ends
    tls = None
    if front == "https":
        tls = ssl.create_default_context(cafile=str(l7.ca))
    port = l7.http if front == "http" else l7.https
    before = await l7.cluster.metrics()
    async with front_client(port, tls=tls, abort=True) as (reader, writer):
        head = f"POST /upload HTTP/1.1\r\nHost: edge-9:80\r\nContent-Length: {size}\r\n\r\n"
        await upload(writer, head, size)  # the old front's reset fails it
        # The whole request is sent: the front waits for no more (over TLS, which has no
        # half-close, it closes once the body is through, not after LINGER_TIMEOUT of silence).
        async with asyncio.timeout(LINGER_TIMEOUT / 2):
            answer = await reader.read()
    assert answer.startswith(b"HTTP/1.1 404 "), answer[:200]
    assert answer.endswith(b"edge-9: unknown node\n"), answer
    after = await l7.cluster.metrics()
    assert front_count(after, front, 404) == front_count(before, front, 404) + 1


async def test_bad_requests(l7: L7) -> None:
    status, body = await curl(f"http://127.0.0.1:{l7.http}/healthz", "-H", "Host:")
    assert status == 400, body


async def test_opens_are_counted_by_result(l7: L7) -> None:
    # A request with a body both ways, on a connection that then closes (bytes are counted
    # when a stream closes).
    status, _ = await curl("-x", f"http://127.0.0.1:{l7.http}", "--data-binary", "x" * 1000,
                           f"http://edge-1:{l7.kubelet.http_port}/echo")  # fmt: skip
    assert status == 200
    await l7.cluster.wait_metric('ravenproxy_server_bytes_total{direction="up"}', lambda v: v > 0)
    m = await l7.cluster.metrics()
    for result in ("ok", "refused", "dial_failed", "dial_timeout"):
        assert m.get(f'ravenproxy_server_stream_opens_total{{result="{result}"}}', 0) >= 1, result
    assert m["ravenproxy_server_agents_connected"] == 1
    assert m['ravenproxy_server_bytes_total{direction="up"}'] > 0
    assert m['ravenproxy_server_bytes_total{direction="down"}'] > 0
    assert m["ravenproxy_server_dial_duration_seconds_count"] >= 1
    assert l7.cluster.server is not None
    health = l7.cluster.server.ports["health"]
    for path, text in (("/healthz", "ok"), ("/readyz", "ready, 1 agent(s) connected")):
        status, body = await curl(f"http://127.0.0.1:{health}{path}")
        assert (status, body.strip()) == (200, text)


async def test_metrics_and_agents_only_on_the_metrics_address(l7: L7) -> None:
    """The health address (every interface by default, for the probes) answers /healthz and
    /readyz and nothing else; /metrics and /agents are on --metrics-addr (loopback by default)."""
    assert l7.cluster.server is not None
    health = l7.cluster.server.ports["health"]
    metrics = l7.cluster.server.ports["metrics"]
    for path in ("/metrics", "/agents", "/"):
        status, _ = await curl(f"http://127.0.0.1:{health}{path}")
        assert status == 404, path
    status, body = await curl(f"http://127.0.0.1:{metrics}/agents")
    assert status == 200 and '"node": "edge-1"' in body, body
    status, body = await curl(f"http://127.0.0.1:{metrics}/metrics")
    assert status == 200 and "ravenproxy_server_agents_connected 1.0" in body
