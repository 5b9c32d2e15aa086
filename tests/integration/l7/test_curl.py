"""Real curl through the fronts: Host routing, forward proxy, CONNECT, SNI passthrough and
terminated HTTPS, keep-alive across nodes, and HTTP semantics (hop-by-hop, 100-continue,
chunked uploads, large heads)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from tests.helpers import run
from tests.integration.l7.env import KUBELET_CLIENT_CN, L7, curl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def test_host_header_routing(l7: L7) -> None:
    status, body = await curl(
        "-H", f"Host: edge-1:{l7.kubelet.http_port}", f"http://127.0.0.1:{l7.http}/metrics"
    )  # fmt: skip
    assert status == 200
    assert "fake_exporter_answer 42" in body


async def test_forward_proxy_absolute_uri(l7: L7) -> None:
    status, body = await curl(
        "-x", f"http://127.0.0.1:{l7.http}", f"http://edge-1:{l7.kubelet.http_port}/metrics"
    )  # fmt: skip
    assert status == 200
    assert "fake_exporter_answer 42" in body


async def test_connect_tunnel(l7: L7) -> None:
    # curl -p -x: CONNECT edge-1:PORT, then HTTP inside the tunnel.
    status, body = await curl(
        "-p", "-x", f"http://127.0.0.1:{l7.http}", f"http://edge-1:{l7.kubelet.http_port}/healthz"
    )  # fmt: skip
    assert (status, body) == (200, "ok")


async def test_connect_tunnel_to_the_kubelet_verifies_it_end_to_end(l7: L7) -> None:
    status, body = await curl(
        "-p", "-x", f"http://127.0.0.1:{l7.http}", "--cacert", str(l7.kubelet_ca),
        f"https://edge-1:{l7.kubelet.tls_port}/healthz",
    )  # fmt: skip
    assert (status, body) == (200, "ok")


async def test_sni_passthrough_client_verifies_the_kubelet(l7: L7) -> None:
    # The client resolves edge-1 to the server's HTTPS front; the SNI is edge-1, a known node,
    # so the raw TLS goes to the kubelet and the client verifies the kubelet's own certificate.
    before = l7.server_log().count("SNI passthrough")
    status, body = await curl(
        "--cacert", str(l7.kubelet_ca),
        "--resolve", f"edge-1:{l7.https}:127.0.0.1",
        f"https://edge-1:{l7.https}/whoami",
    )  # fmt: skip
    # TLS ended at the kubelet: curl presented no client certificate, so the kubelet saw none.
    assert (status, body) == (200, "anonymous")
    assert l7.server_log().count("SNI passthrough") == before + 1
    m = await l7.cluster.metrics()
    assert m['ravenproxy_server_tls_connections_total{mode="passthrough"}'] >= 1
    # And with --connect-to, the same.
    status, body = await curl(
        "--cacert", str(l7.kubelet_ca),
        "--connect-to", f"edge-1:10250:127.0.0.1:{l7.https}",
        "https://edge-1:10250/healthz",
    )  # fmt: skip
    assert (status, body) == (200, "ok")


async def test_sni_passthrough_does_not_present_the_server_certificate(l7: L7) -> None:
    # Trusting only the ravenproxy CA fails: the certificate seen is the kubelet's.
    code, _, err = await run(
        "curl", "-sS", "--cacert", str(l7.ca),
        "--resolve", f"edge-1:{l7.https}:127.0.0.1", f"https://edge-1:{l7.https}/healthz",
    )  # fmt: skip
    assert code == 60, err  # peer certificate cannot be authenticated


async def test_https_terminated_at_the_server(l7: L7) -> None:
    # An IP (no SNI): the server terminates TLS with its own certificate, routes by Host and
    # re-originates TLS to the kubelet, verified by the CA, with the kubelet client certificate
    # for a client that authenticated with a certificate from --front-client-ca-file.
    status, body = await curl(
        "--cacert", str(l7.ca), *l7.client_cert, "-H", "Host: edge-1",
        f"https://127.0.0.1:{l7.https}/whoami",
    )  # fmt: skip
    assert (status, body) == (200, KUBELET_CLIENT_CN)
    # A name that is not a node (SNI localhost) is terminated as well; a pod path routes it.
    status, body = await curl(
        "--cacert", str(l7.ca),
        f"https://localhost:{l7.https}/containerLogs/default/web-1/app?lines=3",
    )  # fmt: skip
    assert status == 200
    assert [line.split()[0] for line in body.splitlines()] == ["0", "1", "2"]


async def test_routing_by_header_and_query(l7: L7) -> None:
    status, body = await curl(
        "-H", f"X-Tunnel-Proxy-Host: edge-1:{l7.kubelet.http_port}",
        f"http://127.0.0.1:{l7.http}/headers",
    )  # fmt: skip
    assert status == 200
    sent = {k.lower() for k, _ in json.loads(body)["headers"]}
    assert "x-tunnel-proxy-host" not in sent
    status, body = await curl(f"http://127.0.0.1:{l7.http}/whoami?nodeName=edge-1")
    # Kubelet port: TLS re-originated, without a client certificate (plain HTTP is anonymous).
    assert (status, body) == (200, "anonymous")


async def test_pod_paths_go_to_the_pods_node(l7: L7) -> None:
    status, body = await curl(f"http://127.0.0.1:{l7.http}/containerLogs/default/web-1/app?lines=2")
    assert status == 200
    assert len(body.splitlines()) == 2


async def test_keep_alive_across_nodes_on_one_connection(l7: L7) -> None:
    # One curl, one connection (-Z off), three requests to two nodes: the server's own gateway
    # (cloud-1's kubelet port, dialled directly — nothing listens, so 502) and edge-1 twice.
    base = f"http://127.0.0.1:{l7.http}"
    code, out, err = await run(
        "curl", "-sS", "-v",
        "-H", f"Host: edge-1:{l7.kubelet.http_port}", f"{base}/healthz",
        "--next", "-H", "Host: cloud-1", f"{base}/x",
        "--next", "-H", f"Host: edge-1:{l7.kubelet.http_port}", f"{base}/healthz",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("ok")
    assert out.endswith("ok")
    assert re.search(r"cloud-1: direct dial 127\.0\.0\.21:\d+ failed", out), out
    assert err.count("Re-using existing connection") >= 1, err


async def test_keep_alive_reuses_the_client_connection(l7: L7) -> None:
    base = f"http://127.0.0.1:{l7.http}"
    host = f"Host: edge-1:{l7.kubelet.http_port}"
    opened = 'ravenproxy_server_stream_opens_total{result="ok"}'
    before = (await l7.cluster.metrics())[opened]
    code, out, err = await run(
        "curl", "-sS", "-v", "-H", host, f"{base}/healthz", "-H", host, f"{base}/metrics",
        "-H", host, f"{base}/healthz",
    )  # fmt: skip
    assert code == 0, err
    assert out.count("ok") == 2 and "fake_exporter_answer" in out
    assert err.count("Re-using existing connection") == 2, err
    # ... and the server kept its stream to the target too: one open for three requests.
    assert (await l7.cluster.metrics())[opened] == before + 1


async def test_hop_by_hop_headers_are_not_forwarded(l7: L7) -> None:
    status, body = await curl(
        "-x", f"http://127.0.0.1:{l7.http}",
        "-H", "Connection: X-Private, keep-alive", "-H", "X-Private: secret",
        "-H", "Keep-Alive: timeout=5", "-H", "Proxy-Authorization: Basic Zm9vOmJhcg==",
        "-H", "TE: trailers", "-H", "X-End-To-End: kept",
        f"http://edge-1:{l7.kubelet.http_port}/headers",
    )  # fmt: skip
    assert status == 200
    received = {k.lower(): v for k, v in json.loads(body)["headers"]}
    for gone in ("x-private", "keep-alive", "proxy-authorization", "te", "proxy-connection"):
        assert gone not in received, received
    assert received["x-end-to-end"] == "kept"
    assert received["host"] == f"edge-1:{l7.kubelet.http_port}"


async def test_expect_100_continue_and_chunked_upload(l7: L7, tmp_path: object) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    path = l7.base / "upload.bin"
    path.write_bytes(payload)
    url = f"http://edge-1:{l7.kubelet.http_port}/echo"
    proxy = f"http://127.0.0.1:{l7.http}"
    # Expect: 100-continue, with curl's own fallback timer far away: the 100 must come through.
    code, out, err = await run(
        "curl", "-sS", "-v", "-x", proxy, "--expect100-timeout", "20",
        "-H", "Expect: 100-continue", "--data-binary", f"@{path}", url,
    )  # fmt: skip
    assert code == 0, err
    assert "HTTP/1.1 100 Continue" in err
    answer = json.loads(out)
    assert answer == {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    # Chunked request body (-T with Transfer-Encoding: chunked).
    code, out, err = await run(
        "curl", "-sS", "-x", proxy, "-H", "Transfer-Encoding: chunked", "-T", str(path),
        url,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["sha256"] == hashlib.sha256(payload).hexdigest()


async def test_large_headers_up_to_the_limit(l7: L7) -> None:
    big = "a" * 40_000
    status, body = await curl(
        "-H", f"Host: edge-1:{l7.kubelet.http_port}", "-H", f"X-Big: {big}",
        f"http://127.0.0.1:{l7.http}/healthz",
    )  # fmt: skip
    assert (status, body) == (200, "ok")
    status, body = await curl(
        "-H", f"Host: edge-1:{l7.kubelet.http_port}", "-H", f"X-Big: {big * 2}",
        f"http://127.0.0.1:{l7.http}/healthz",
    )  # fmt: skip
    assert status == 431, body
