"""docs/apiserver.md, Prometheus: the doc's two ``scrape_configs`` run in the real Prometheus
(Debian package) against the real server and agent, with the doc's host names, ports and file
paths replaced by this bed's; every job must reach ``up == 1``.

- ``prometheus-proxy-url``: ``proxy_url`` at the HTTP front (the internal Service's HTTP port);
- ``prometheus-dns``: ``nodename:port`` targets, Prometheus resolving node names through the real
  ``ravenproxy dns``: Prometheus runs in a private mount namespace whose ``/etc/resolv.conf``
  names that server (port 53, hence root).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers import free_port, http_get, spawn, stop
from tests.integration.apiserver.env import CLUSTER_IP, DNS_IP, Env, doc_example, replace_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
SERVICE_HTTP = "x-raven-proxy-internal-svc.kube-system.svc:10255"
"""The doc's ``proxy_url`` host: an HTTP port of the internal Service (here the front itself)."""
PASSTHROUGH = 'ravenproxy_server_tls_connections_total{mode="passthrough"}'

GLOBAL = """\
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
"""


def config_from_doc(name: str, env: Env) -> tuple[str, list[str]]:
    """The doc's example ``name`` made runnable here: (prometheus.yml, its job names)."""
    pki = env.pki
    snippet = replace_all(
        doc_example(name),
        {
            "/etc/prometheus/kubelet-ca.crt": str(pki.ca),
            "/etc/prometheus/kubelet-client.crt": str(pki.cert("prometheus")),
            "/etc/prometheus/kubelet-client.key": str(pki.key("prometheus")),
        },
    )
    if "proxy_url" in snippet:
        snippet = replace_all(
            snippet,
            {SERVICE_HTTP: f"{CLUSTER_IP}:{env.exporter_port}"},
        )
    snippet = replace_all(
        snippet,
        {
            "edge-1:9100": f"edge-1:{env.exporter_port}",
            "edge-1:10250": f"edge-1:{env.kubelet_port}",
        },
    )
    jobs = [job["job_name"] for job in yaml.safe_load(snippet)["scrape_configs"]]
    return GLOBAL + snippet, jobs


async def query(port: int, promql: str) -> list[dict[str, object]]:
    _, body = await http_get(port, "/api/v1/query?query=" + urllib.parse.quote(promql))
    data = json.loads(body)
    assert data["status"] == "success", data
    result: list[dict[str, object]] = data["data"]["result"]
    return result


@contextlib.contextmanager
def run_prometheus(tmp_path: Path, config: str, resolver: str | None) -> Iterator[tuple[int, Path]]:
    """Prometheus on a free port; with ``resolver``, in a mount namespace whose
    /etc/resolv.conf names only that nameserver. Stopped by PID in the end."""
    port = free_port()
    path = tmp_path / "prometheus.yml"
    path.write_text(config)
    args = [
        PROMETHEUS,
        f"--config.file={path}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    if resolver is not None:
        resolv = tmp_path / "resolv.conf"
        resolv.write_text(f"nameserver {resolver}\n")
        # unshare execs sh, which execs Prometheus: the PID stays Prometheus'.
        args = [
            UNSHARE, "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind "{resolv}" /etc/resolv.conf && exec "$@"', "prometheus", *args,
        ]  # fmt: skip
    log = tmp_path / "prometheus.log"
    proc = spawn(args, log)
    try:
        yield port, log
    finally:
        stop(proc, 10)


async def wait_up(port: int, jobs: list[str], log: Path, env: Env) -> None:
    up: dict[str, str] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            up = {
                str(r["metric"]["job"]): str(r["value"][1])  # type: ignore[index]
                for r in await query(port, "up")
            }
        except (OSError, IndexError, ValueError):
            pass
        if all(up.get(job) == "1" for job in jobs):
            return
        await asyncio.sleep(0.5)
    tail = (await asyncio.to_thread(log.read_text))[-3000:]
    pytest.fail(f"up: {up}, wanted 1 for {jobs}\n{tail}\n{env.logs()}")


@pytest.fixture
def proxy_url_prometheus(env: Env, tmp_path: Path) -> Iterator[tuple[int, Path, list[str]]]:
    config, jobs = config_from_doc("prometheus-proxy-url", env)
    with run_prometheus(tmp_path, config, None) as (port, log):
        yield port, log, jobs


@pytest.fixture
def dns_prometheus(env: Env, tmp_path: Path) -> Iterator[tuple[int, Path, list[str]]]:
    if env.dns_port != 53:
        pytest.fail(f"port 53 on {DNS_IP} was taken: ravenproxy dns is on {env.dns_port}")
    config, jobs = config_from_doc("prometheus-dns", env)
    with run_prometheus(tmp_path, config, DNS_IP) as (port, log):
        yield port, log, jobs


async def test_the_proxy_url_example_scrapes_the_edge(
    env: Env, proxy_url_prometheus: tuple[int, Path, list[str]]
) -> None:
    port, log, jobs = proxy_url_prometheus
    assert jobs == ["edge-node-exporter", "edge-kubelet"]
    await wait_up(port, jobs, log, env)
    for job in jobs:
        result = await query(port, f'fake_exporter_answer{{job="{job}"}}')
        assert [r["value"][1] for r in result] == ["42"], result  # type: ignore[index]


@pytest.mark.root
async def test_the_dns_map_example_scrapes_the_edge_by_node_name(
    env: Env, dns_prometheus: tuple[int, Path, list[str]]
) -> None:
    port, log, jobs = dns_prometheus
    assert jobs == ["edge-node-exporter-dns", "edge-kubelet-dns", "edge-cadvisor-dns"]
    await wait_up(port, jobs, log, env)
    for job in ("edge-node-exporter-dns", "edge-kubelet-dns"):
        result = await query(port, f'fake_exporter_answer{{job="{job}"}}')
        assert [r["value"][1] for r in result] == ["42"], result  # type: ignore[index]
    result = await query(port, 'container_cpu_usage_seconds_total{job="edge-cadvisor-dns"}')
    assert [r["value"][1] for r in result] == ["7"], result  # type: ignore[index]
    # The kubelet jobs verify the kubelet's certificate (cluster CA, name edge-1): a terminated
    # connection would show the server's certificate and fail, so up == 1 means passthrough.
    assert (await env.metrics()).get(PASSTHROUGH, 0) >= 2
