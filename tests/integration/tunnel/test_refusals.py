"""Who may not connect, and what a refused request says."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from websockets.asyncio.client import connect

from ravenproxy.client import ConnectRefused
from tests.integration.cluster import Cluster
from tests.integration.targets import echo, tcp_server

pytestmark = pytest.mark.timeout(120)


async def assert_agent_refused(cluster: Cluster, agent_name: str, log_text: str) -> None:
    agent = next(p for p in cluster.procs if p.name == agent_name)
    for _ in range(100):
        if log_text in agent.output():
            break
        await asyncio.sleep(0.1)
    assert log_text in agent.output(), agent.output()
    assert agent.running  # it keeps retrying, with backoff
    m = await cluster.metrics()
    assert m["ravenproxy_server_agents_connected"] == 0
    # The server says so too: a log line with the TLS reason and a count.
    assert m['ravenproxy_server_agent_sessions_total{outcome="tls_refused"}'] >= 1
    assert cluster.server is not None
    assert "agent TLS handshake refused" in cluster.server.output()
    with pytest.raises(ConnectRefused) as info:
        await cluster.connect("edge-1:10250")
    assert info.value.status == 503


async def test_agent_without_client_certificate_cannot_connect(cluster: Cluster) -> None:
    server = cluster.start_server()
    await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v == 0)
    url = f"wss://127.0.0.1:{server.ports['tunnel']}"

    async def dial(ctx: ssl.SSLContext) -> None:
        ws = await connect(
            url,
            ssl=ctx,
            subprotocols=["ravenproxy.v1"],
            open_timeout=5,
            proxy=None,  # type: ignore[list-item]
        )
        await ws.close()

    # Control: the same client with its certificate gets in, so the refusal below is real.
    with_cert = ssl.create_default_context(cafile=str(cluster.certs / "ca.crt"))
    with_cert.load_cert_chain(cluster.certs / "edge-1.crt", cluster.certs / "edge-1.key")
    await dial(with_cert)
    # The client's close returns when the closing handshake is done; the server lets the
    # session go a moment later. Wait for that, so the count below is about the refusal only.
    await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v == 0)

    without = ssl.create_default_context(cafile=str(cluster.certs / "ca.crt"))
    with pytest.raises(Exception) as info:
        await dial(without)
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(repr(exc))
        exc = exc.__cause__ or exc.__context__
    # TLS 1.3: the server's "certificate required" alert comes after the client's Finished;
    # the client sees the connection end before any HTTP answer to its upgrade.
    assert any(
        "CERTIFICATE_REQUIRED" in c or "before end of line" in c or "SSLError" in c for c in chain
    ), chain
    m = await cluster.metrics()
    assert m["ravenproxy_server_agents_connected"] == 0
    assert m['ravenproxy_server_agent_sessions_total{outcome="tls_refused"}'] == 1
    assert server.output().count("agent connected") == 1  # only the control
    assert "agent TLS handshake refused" in server.output()


async def test_agent_with_certificate_from_another_ca_is_refused(cluster: Cluster) -> None:
    cluster.start_server()
    await cluster.wait_up()
    cluster.start_agent("edge-1", "127.0.0.1:10250", cert=cluster.other_ca_cert("edge-1"))
    await assert_agent_refused(
        cluster, "agent-edge-1", "closed the connection during the handshake"
    )


async def test_agent_with_expired_certificate_is_refused(cluster: Cluster) -> None:
    cluster.start_server()
    await cluster.wait_up()
    cluster.start_agent("edge-1", "127.0.0.1:10250", cert=cluster.expired_cert("edge-1"))
    await assert_agent_refused(
        cluster, "agent-edge-1", "closed the connection during the handshake"
    )


async def test_errors_name_the_node_and_the_reason(cluster: Cluster) -> None:
    async with tcp_server(echo) as allowed, tcp_server(echo) as not_allowed:
        cluster.start_server()
        cluster.start_agent("edge-1", f"127.0.0.1:{allowed}")
        await cluster.wait_routable(f"edge-1:{allowed}")

        cases = [
            (f"edge-1:{not_allowed}", 403, "edge-1: refused by the agent's allowlist"),
            ("edge-9:10250", 404, "edge-9: unknown node"),
            ("edge-3:10250", 503, "edge-3: no agent connected for this node"),
        ]
        before = await cluster.metrics()
        for target, status, text in cases:
            with pytest.raises(ConnectRefused) as info:
                await cluster.connect(target)
            assert info.value.status == status, (target, info.value)
            assert text in info.value.body, (target, info.value.body)
            assert info.value.body.count("\n") == 1  # one line

        after = await cluster.metrics()

        def delta(key: str) -> float:
            return after.get(key, 0.0) - before.get(key, 0.0)

        for status in ("403", "404", "503"):
            key = f'ravenproxy_server_front_requests_total{{front="http",status="{status}"}}'
            assert delta(key) == 1, key
        assert delta('ravenproxy_server_stream_opens_total{result="refused"}') == 1
        assert cluster.server is not None
        log = cluster.server.output()
        assert "http front: refused" in log and "node=edge-9" in log and "status=404" in log


async def test_gateway_peer_is_served_by_the_gateway_agent(cluster: Cluster) -> None:
    """edge-2 has no agent of its own; edge-1's agent (same gateway) dials its InternalIP."""
    async with tcp_server(echo, host="127.0.0.2") as port:
        cluster.start_server()
        cluster.start_agent("edge-1", f"127.0.0.2:{port}")
        await cluster.wait_routable(f"edge-2:{port}")
        reader, writer = await cluster.connect(f"edge-2:{port}")
        writer.write(b"via the gateway")
        assert await reader.readexactly(15) == b"via the gateway"
        writer.close()
        # edge-1's agent may not serve edge-3 (no gateway), even if it could reach it.
        with pytest.raises(ConnectRefused) as info:
            await cluster.connect(f"edge-3:{port}")
        assert info.value.status == 503
