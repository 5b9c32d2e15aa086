"""``ravenproxy controller`` as a process against the API emulator: /healthz and /readyz on
--health-addr (ready once the model synced, 'follower' then 'leader'), /metrics on
--metrics-addr only (leadership, reconciles, API writes, CSR decisions, model sync). Short
leader-election timings (--leader-elect-*): the follower takes over 3 s after it last saw the
other replica renew, not 15."""

from __future__ import annotations

import asyncio
import datetime as dt
import subprocess
from collections.abc import Awaitable, Iterator
from pathlib import Path

import pytest

from ravenproxy.pki.issuance import SIGNER_AGENT
from tests.helpers import eventually, free_port, http_get, scrape, spawn_python, stop
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import kubeconfig
from tests.integration.kube.test_controller import cluster
from tests.integration.kube.test_csr_controller import CSRS, ask, certificate, csr


@pytest.fixture
def ports() -> dict[str, int]:
    return {"metrics": free_port(), "health": free_port()}


@pytest.fixture
def controller_log(tmp_path: Path) -> Path:
    return tmp_path / "controller.log"


@pytest.fixture
def controller(
    apiserver: APIServer, tmp_path: Path, ports: dict[str, int], controller_log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    token = apiserver.add_service_account("ravenproxy-controller", "cloud-1")
    config = kubeconfig(tmp_path / "kubeconfig", apiserver, token)
    proc = spawn_python(
        [
            "-m", "ravenproxy", "controller", "--kubeconfig", str(config),
            "--metrics-addr", f"127.0.0.1:{ports['metrics']}",
            "--health-addr", f"127.0.0.1:{ports['health']}",
            "--leader-elect-lease-duration", "3s", "--leader-elect-renew-deadline", "2s",
            "--leader-elect-retry-period", "1s",
        ],
        controller_log,
    )  # fmt: skip
    try:
        yield proc
    finally:
        stop(proc)


async def hold_lease(apiserver: APIServer, seconds: int) -> None:
    """Another replica holds the leader Lease, renewed now, for ``seconds``."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await apiserver.put(
        "leases",
        {
            "metadata": {"name": "ravenproxy-controller", "namespace": "kube-system"},
            "spec": {
                "holderIdentity": "the-other-replica",
                "leaseDurationSeconds": seconds,
                "acquireTime": now,
                "renewTime": now,
            },
        },
    )


async def keep_holding(apiserver: APIServer) -> None:
    """The other replica renews its Lease every half second (each renewal restarts the
    follower's --leader-elect-lease-duration), until cancelled."""
    while True:
        await hold_lease(apiserver, 3)
        await asyncio.sleep(0.5)


async def readyz(port: int) -> tuple[int, str]:
    try:
        status, body = await http_get(port, "/readyz")
    except OSError:
        return 0, ""
    return status, body.strip()


async def until(answer: Awaitable[tuple[int, str]], wanted: tuple[int, str]) -> bool:
    return await answer == wanted


async def metric_at_least(port: int, name: str, value: float) -> bool:
    return (await scrape(port)).get(name, 0) >= value


async def test_follower_then_leader_with_its_metrics(
    apiserver: APIServer,
    ports: dict[str, int],
    controller_log: Path,
    controller: subprocess.Popen[bytes],
) -> None:
    await cluster(apiserver)
    holder = asyncio.create_task(keep_holding(apiserver))
    health, metrics = ports["health"], ports["metrics"]

    def log() -> str:
        return controller_log.read_text()

    # Synced, not leading while the other replica renews: ready, and says so.
    try:
        await eventually(lambda: until(readyz(health), (200, "follower")), within=20, what=log)
    finally:
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
    assert await http_get(health, "/healthz") == (200, "ok\n")
    m = await scrape(metrics)
    assert m["ravenproxy_controller_leader"] == 0
    assert m["ravenproxy_controller_model_synced"] == 1
    assert not any(k.startswith("ravenproxy_controller_api_writes_total") for k in m)

    # The other replica stops renewing; its Lease runs out: this one leads and reconciles,
    # within the 3 s lease (plus a 1 s retry), well before the default 15 s would let it.
    await eventually(lambda: until(readyz(health), (200, "leader")), within=10, what=log)
    ok = 'ravenproxy_controller_reconciles_total{result="ok"}'
    await eventually(lambda: metric_at_least(metrics, ok, 1), within=20, what=log)
    m = await scrape(metrics)
    assert m["ravenproxy_controller_leader"] == 1
    assert m['ravenproxy_controller_leader_transitions_total{transition="acquired"}'] == 1
    assert m["ravenproxy_controller_reconcile_duration_seconds_count"] >= 1
    created = 'ravenproxy_controller_api_writes_total{kind="service",result="ok",verb="create"}'
    assert m[created] >= 1, sorted(m)
    status = (
        'ravenproxy_controller_api_writes_total{kind="gateway_status",result="ok",verb="patch"}'
    )
    assert m[status] >= 1, sorted(m)

    # CSR decisions: one approved and signed, one denied (bound to another node).
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    await ask(apiserver, token, "good", "edge-1")
    await ask(apiserver, token, "bad", "cloud-1")
    await eventually(lambda: certificate(csr(apiserver, "good")) is not None, within=20, what=log)
    signer = f'signer="{SIGNER_AGENT}"'
    denied = f'ravenproxy_controller_csr_decisions_total{{decision="denied",{signer}}}'
    await eventually(lambda: metric_at_least(metrics, denied, 1), within=20, what=log)
    m = await scrape(metrics)
    assert m[denied] == 1
    for decision in ("approved", "signed"):
        assert (
            m[f'ravenproxy_controller_csr_decisions_total{{decision="{decision}",{signer}}}'] == 1
        )
    assert apiserver.get(CSRS, "bad") is not None

    # The health address shows nothing but the probes.
    for path in ("/metrics", "/agents", "/"):
        code, _ = await http_get(health, path)
        assert code == 404, path


async def test_not_ready_while_the_model_cannot_sync(
    apiserver: APIServer, tmp_path: Path, ports: dict[str, int], controller_log: Path
) -> None:
    """The Gateway CRD is not installed: alive, not ready, and says why."""
    del apiserver.collections["gateways"]
    token = apiserver.add_service_account("ravenproxy-controller", "cloud-1")
    config = kubeconfig(tmp_path / "kubeconfig", apiserver, token)
    proc = spawn_python(
        [
            "-m", "ravenproxy", "controller", "--kubeconfig", str(config),
            "--metrics-addr", f"127.0.0.1:{ports['metrics']}",
            "--health-addr", f"127.0.0.1:{ports['health']}",
        ],
        controller_log,
    )  # fmt: skip
    try:
        health = ports["health"]
        await eventually(
            lambda: apiserver.lists("gateways"), within=20, what=controller_log.read_text
        )
        assert await readyz(health) == (503, "model not synced yet")
        assert await http_get(health, "/healthz") == (200, "ok\n")
        m = await scrape(ports["metrics"])
        assert m["ravenproxy_controller_model_synced"] == 0
        assert proc.poll() is None, "the controller exited"
    finally:
        await asyncio.to_thread(stop, proc)
