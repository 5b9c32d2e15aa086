"""docs/apiserver.md, the DNS mode: kube-apiserver → kubelet through the tunnel.

The client does what kube-apiserver does with the doc's flags and dnsConfig (see
:mod:`tests.integration.apiserver.kube_apiserver`): it picks edge-1's ``Hostname`` address,
resolves it through the real ``ravenproxy dns`` (started with the doc's command line), dials the
answer (the "ClusterIP", where the server's HTTPS front listens) on the kubelet port with SNI
``edge-1`` and kube-apiserver's kubelet client certificate, and asks for logs and exec. The fake
kubelet's ``/whoami`` says whose client certificate it saw: kube-apiserver's own means the TLS went
through untouched; the server's means it terminated and re-originated.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.integration.apiserver.env import (
    APISERVER_CN,
    CLUSTER_IP,
    DNS_IP,
    EDGE_IP,
    INVENTORY,
    SERVER_KUBELET_CN,
    Env,
    doc_example,
)
from tests.integration.apiserver.kube_apiserver import KubeletClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

STDIN, STDOUT, ERROR = 0, 1, 3
PASSTHROUGH = 'ravenproxy_server_tls_connections_total{mode="passthrough"}'
TERMINATE = 'ravenproxy_server_tls_connections_total{mode="terminate"}'


def apiserver_pod() -> tuple[dict[str, Any], dict[str, str]]:
    """The doc's kube-apiserver Pod spec fragment, and its command's ``--flag=value``s."""
    pod = yaml.safe_load(doc_example("kube-apiserver"))
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[0] == "kube-apiserver", command
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in command[1:])
    return pod["spec"], flags


def apiserver_client(env: Env) -> KubeletClient:
    """kube-apiserver's kubelet client as the doc configures it; the doc's certificate paths
    become this bed's files, its nameserver the ``ravenproxy dns`` process."""
    spec, flags = apiserver_pod()
    config = spec["dnsConfig"]
    options = {o["name"]: o.get("value") for o in config.get("options", [])}
    (nameserver,) = config["nameservers"]
    assert nameserver, config
    return KubeletClient(
        preferred_address_types=tuple(flags["kubelet-preferred-address-types"].split(",")),
        ca_file=env.pki.ca,
        cert_file=env.pki.cert("apiserver-kubelet-client"),
        key_file=env.pki.key("apiserver-kubelet-client"),
        nameserver=(DNS_IP, env.dns_port),
        searches=tuple(config.get("searches", ())),
        ndots=int(options.get("ndots") or 1),
    )


def edge_1() -> dict[str, Any]:
    inventory = INVENTORY.format(
        gateway="{}", cloud_ip="x", edge_ip=EDGE_IP, far_ip="x", kubelet_port=10250
    )
    nodes = [d for d in yaml.safe_load_all(inventory) if d and d.get("kind") == "Node"]
    return next(n for n in nodes if n["metadata"]["name"] == "edge-1")


def test_the_kube_apiserver_example_is_what_the_emulation_does() -> None:
    spec, flags = apiserver_pod()
    # The flags the emulated client relies on, with the meaning it gives them.
    assert flags["kubelet-preferred-address-types"].split(",")[0] == "Hostname", flags
    for flag in (
        "kubelet-certificate-authority",
        "kubelet-client-certificate",
        "kubelet-client-key",
    ):
        assert flags.get(flag, "").startswith("/"), (flag, flags)
    assert "kubelet-port" not in flags  # the port comes from the Node object
    # A host-network Pod uses the host's resolver unless told otherwise.
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "None", spec
    assert len(spec["dnsConfig"]["nameservers"]) == 1, spec
    # With that order the Node's Hostname (its name) is dialled, not its InternalIP.
    preferred = tuple(flags["kubelet-preferred-address-types"].split(","))
    client = KubeletClient(preferred, Path(), Path(), Path(), ("", 0), (), 1)
    assert client.kubelet_address(edge_1()) == ("edge-1", 10250)
    internal_first = KubeletClient(
        ("InternalIP", *preferred), Path(), Path(), Path(), ("", 0), (), 1
    )
    assert internal_first.kubelet_address(edge_1()) == (EDGE_IP, 10250)


def test_the_gateway_example_gives_the_internal_service_its_ports(tmp_path: Path) -> None:
    """The real controller, from an inventory holding the doc's Gateway: each proxyHTTPSPort
    leads to the HTTPS front (10263), each proxyHTTPPort to the HTTP front (10264)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        doc_example("gateway")
        + "---\napiVersion: v1\nkind: Node\n"
        + "metadata: {name: cloud-1, labels: {raven.openyurt.io/gateway: gw-cloud}}\n"
        + "status:\n  addresses: [{type: InternalIP, address: 10.0.0.5}]\n"
        + '  conditions: [{type: Ready, status: "True"}]\n'
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ravenproxy",
            "controller",
            "--inventory",
            str(inventory),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    services = [
        d
        for d in yaml.safe_load_all(out)
        if d and d["kind"] == "Service" and d["metadata"]["name"] == "x-raven-proxy-internal-svc"
    ]
    assert len(services) == 1, out
    ports = {p["port"]: p["targetPort"] for p in services[0]["spec"]["ports"]}
    assert ports == {9100: 10264, 10250: 10263, 10255: 10264}, ports


async def test_node_names_resolve_to_the_cluster_ip_through_the_search_list(env: Env) -> None:
    client = apiserver_client(env)
    address, asked = await client.resolve("edge-1")
    assert address == CLUSTER_IP
    # ndots 5: every search domain is tried (NXDOMAIN) before the bare name is answered.
    assert asked == [*(f"edge-1.{d}." for d in client.searches), "edge-1."], asked


def _cn(cert: Any, field: str) -> str:
    return str(next(v for rdn in cert[field] for k, v in rdn if k == "commonName"))


async def peer_certificate(client: KubeletClient, host: str, port: int) -> tuple[str, str]:
    """(subject CN, issuer CN) of the certificate a TLS dial like kube-apiserver's is shown."""
    address, _ = await client.resolve(host)
    _, writer = await asyncio.open_connection(
        address, port, ssl=client.ssl_context(), server_hostname=host
    )
    try:
        cert = writer.get_extra_info("peercert")
    finally:
        writer.close()
        await writer.wait_closed()
    return _cn(cert, "subject"), _cn(cert, "issuer")


async def test_logs_follow_go_through_end_to_end_with_the_apiservers_certificate(
    env: Env,
) -> None:
    client = apiserver_client(env)
    host, port = client.kubelet_address(edge_1())
    assert port == 10250  # the inventory's port is this bed's kubelet port instead:
    port = env.kubelet_port
    before = await env.metrics()
    async with client.session() as session:
        # The kubelet's own serving certificate, and it saw kube-apiserver's client one.
        assert await peer_certificate(client, host, port) == ("edge-1", "cluster-ca")
        async with session.get(f"https://{host}:{port}/whoami") as response:
            assert response.status == 200
            assert await response.text() == APISERVER_CN
        url = f"https://{host}:{port}/containerLogs/default/web-1/app?follow=true"
        async with session.get(url) as response:
            assert response.status == 200
            assert response.headers["Transfer-Encoding"] == "chunked"
            lines = []
            async with asyncio.timeout(10):
                while len(lines) < 5:  # each line is written 50 ms after the previous one
                    lines.append(await response.content.readline())
            assert [int(line.split()[0]) for line in lines] == [0, 1, 2, 3, 4], lines
    after = await env.metrics()
    assert after.get(PASSTHROUGH, 0) - before.get(PASSTHROUGH, 0) >= 2, after
    assert after.get(TERMINATE, 0) == before.get(TERMINATE, 0), after


async def test_exec_websocket_goes_through_end_to_end(env: Env) -> None:
    client = apiserver_client(env)
    host, _ = client.kubelet_address(edge_1())
    url = (
        f"https://{host}:{env.kubelet_port}/exec/default/web-1/app"
        "?command=cat&stdin=true&stdout=true"
    )
    before = await env.metrics()
    async with client.session() as session:
        async with session.ws_connect(url, protocols=("v5.channel.k8s.io",)) as ws:
            assert ws.protocol == "v5.channel.k8s.io"
            await ws.send_bytes(bytes([STDIN]) + b"hello from the apiserver\n")
            msg = await ws.receive_bytes(timeout=10)
            assert msg == bytes([STDOUT]) + b"hello from the apiserver\n"
            await ws.send_bytes(bytes([STDIN]) + b"exit\n")
            status = await ws.receive_bytes(timeout=10)
            assert status[0] == ERROR and json.loads(status[1:])["status"] == "Success"
            closing = await ws.receive(timeout=10)
            assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closing
    after = await env.metrics()
    assert after.get(PASSTHROUGH, 0) - before.get(PASSTHROUGH, 0) >= 1, after


async def test_an_ip_or_another_name_is_terminated_and_reoriginated(env: Env) -> None:
    """No SNI (an IP), or one naming no node: the server answers with its own certificate and
    re-originates TLS with its kubelet client certificate, since the client authenticated
    (--front-client-ca-file)."""
    client = apiserver_client(env)
    ctx = ssl.create_default_context(cafile=str(env.cluster.certs / "ca.crt"))
    ctx.check_hostname = False  # the server certificate names localhost, not this address
    ctx.load_cert_chain(str(client.cert_file), str(client.key_file))
    before = await env.metrics()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(30)) as session:
        base = f"https://{CLUSTER_IP}:{env.kubelet_port}"
        async with session.get(f"{base}/whoami", ssl=ctx, headers={"Host": "edge-1"}) as response:
            assert response.status == 200
            assert await response.text() == SERVER_KUBELET_CN
        # A server name that is no node is terminated the same way.
        async with session.get(
            f"{base}/whoami", ssl=ctx, server_hostname="not-a-node", headers={"Host": "edge-1"}
        ) as response:
            assert (response.status, await response.text()) == (200, SERVER_KUBELET_CN)
        # Routed by the pod of the path.
        url = f"{base}/containerLogs/default/web-1/app?lines=3"
        async with session.get(url, ssl=ctx) as response:
            assert response.status == 200
            assert len((await response.text()).splitlines()) == 3
    after = await env.metrics()
    assert after.get(TERMINATE, 0) - before.get(TERMINATE, 0) >= 2, after


async def test_a_node_no_agent_serves_is_closed_and_logged(env: Env) -> None:
    client = apiserver_client(env)
    ctx = client.ssl_context()
    address, _ = await client.resolve("edge-9")
    assert address == CLUSTER_IP
    with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
        _, writer = await asyncio.open_connection(
            address, env.kubelet_port, ssl=ctx, server_hostname="edge-9"
        )
        writer.close()
    lines = [line for line in env.server.output().splitlines() if "https front: refused" in line]
    assert any("node=edge-9" in line and "sni=edge-9" in line for line in lines), lines
