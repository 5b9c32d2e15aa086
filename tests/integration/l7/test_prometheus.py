"""The real Prometheus (Debian package) scrapes an edge target through the server: with
``proxy_url`` (absolute-URI requests), by ``?nodeName=node:port`` routing, and the kubelet over
HTTPS through ``proxy_url`` (CONNECT). The test reads ``up`` and a sample from Prometheus' API."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import free_port, http_get, spawn, stop
from tests.integration.l7.env import L7

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"

CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
- job_name: via-proxy-url
  proxy_url: http://127.0.0.1:{http}
  static_configs: [{{targets: ["edge-1:{exporter}"]}}]
- job_name: via-node-name
  params: {{nodeName: ["edge-1:{exporter}"]}}
  static_configs: [{{targets: ["127.0.0.1:{http}"]}}]
- job_name: kubelet-https-via-connect
  scheme: https
  proxy_url: http://127.0.0.1:{http}
  tls_config: {{ca_file: "{kubelet_ca}", server_name: edge-1}}
  static_configs: [{{targets: ["edge-1:{kubelet}"]}}]
"""


async def api(port: int, query: str) -> list[dict[str, object]]:
    _, body = await http_get(port, "/api/v1/query?query=" + urllib.parse.quote(query))
    data = json.loads(body)
    assert data["status"] == "success", data
    result: list[dict[str, object]] = data["data"]["result"]
    return result


@pytest.fixture
def prometheus(l7: L7, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """Prometheus with the three jobs, on a free port; stopped by PID in teardown."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        CONFIG.format(
            http=l7.http,
            exporter=l7.kubelet.http_port,
            kubelet=l7.kubelet.tls_port,
            kubelet_ca=l7.kubelet_ca,
        )
    )
    log_path = tmp_path / "prometheus.log"
    proc = spawn(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        log_path,
    )
    try:
        yield port, log_path
    finally:
        stop(proc, 10)


async def test_prometheus_scrapes_edge_targets_through_the_server(
    prometheus: tuple[int, Path],
) -> None:
    port, log_path = prometheus
    jobs = {"via-proxy-url", "via-node-name", "kubelet-https-via-connect"}
    up: dict[str, str] = {}
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        try:
            up = {
                str(r["metric"]["job"]): str(r["value"][1])  # type: ignore[index]
                for r in await api(port, "up")
            }
        except (OSError, IndexError, ValueError):
            pass
        if all(up.get(job) == "1" for job in jobs):
            break
        await asyncio.sleep(0.5)
    assert all(up.get(job) == "1" for job in jobs), (up, log_path.read_text()[-3000:])
    for job in ("via-proxy-url", "via-node-name"):
        result = await api(port, f'fake_exporter_answer{{job="{job}"}}')
        assert [r["value"][1] for r in result] == ["42"], result  # type: ignore[index]
