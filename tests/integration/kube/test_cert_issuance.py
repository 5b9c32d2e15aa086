"""Kubernetes issuance end to end: a real ``ravenproxy controller``, ``ravenproxy server`` and
``ravenproxy agent`` processes with ``--cert-dir`` and no certificate at all, against the API
emulator, each holding a bound service-account token of its own node.

The controller approves and signs what is bound to the node it names (with the CA it creates in
the Secret), denies what is not, leaves other signers alone; the agent bootstraps, connects and
serves; with the lifetime capped at 30 s the agent rotates while a stream stays open, and the
server sees the new certificate on the agent's next tunnel (issue 11).

30 s, not a production-like value: rotation is due at 70-90 % of it (20-27 s after issuance,
the backdate counted), which leaves the bootstrap and the denial well over 10 s to finish
before it; the test checks that the stream was open before the rotation, so a slower machine
fails it rather than silently testing less."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ravenproxy.pki import authority
from ravenproxy.pki.issuance import CA_NAMESPACE, CA_SECRET
from ravenproxy.pki.pemfiles import load_cert
from tests.helpers import free_port, spawn_python, stop
from tests.integration.cluster import Cluster, Proc
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import kubeconfig
from tests.integration.kube.test_controller import gateway_obj, node_obj
from tests.integration.kube.test_csr_controller import (
    ask,
    ca_of,
    certificate,
    condition_types,
    csr,
)
from tests.integration.targets import Pump, echo, tcp_server

pytestmark = pytest.mark.timeout(240)

CSRS = "certificatesigningrequests"
EXPIRY = "ravenproxy_certificate_expiry_timestamp_seconds"
LIFETIME = dt.timedelta(seconds=30)


async def nodes(apiserver: APIServer) -> None:
    """cloud-1 in a cloud gateway (its server), edge-1 and edge-2 in an edge gateway; all on
    loopback, so cloud-1's address (a SAN of the server certificate) is 127.0.0.1."""
    await apiserver.put("gateways", gateway_obj("gw-cloud", ["cloud-1"]))
    await apiserver.put("gateways", gateway_obj("gw-edge", ["edge-1", "edge-2"]))
    await apiserver.put("nodes", node_obj("cloud-1", "127.0.0.1", "gw-cloud"))
    for name in ("edge-1", "edge-2"):
        node = node_obj(name, "127.0.0.1", "gw-edge")
        node["metadata"]["labels"]["openyurt.io/is-edge-worker"] = "true"
        await apiserver.put("nodes", node)


@contextlib.asynccontextmanager
async def controller_process(apiserver: APIServer, tmp_path: Path) -> AsyncIterator[Path]:
    """``ravenproxy controller`` as its own service account, lifetimes capped at LIFETIME."""
    token = apiserver.add_service_account("ravenproxy-controller", "cloud-1")
    config = kubeconfig(tmp_path / "controller.kubeconfig", apiserver, token)
    log = tmp_path / "controller.log"
    proc = spawn_python(
        [
            "-m", "ravenproxy", "controller", "--kubeconfig", str(config),
            "--max-cert-lifetime", f"{LIFETIME.seconds}s", "--log-level", "DEBUG",
            # Not the default ports: a process of another test or of the machine may hold them.
            "--metrics-addr", f"127.0.0.1:{free_port()}",
            "--health-addr", f"127.0.0.1:{free_port()}",
        ],
        log,
    )  # fmt: skip
    try:
        yield log
    finally:
        await asyncio.to_thread(stop, proc)


def lines(proc: Proc, message: str) -> list[str]:
    return [line for line in proc.output().splitlines() if f": {message}" in line]


def serial_hex(path: Path) -> str:
    return format(load_cert(path).serial_number, "x")


async def test_issued_through_the_controller_rotated_under_an_open_stream(
    apiserver: APIServer, tmp_path: Path
) -> None:
    await nodes(apiserver)
    cluster = Cluster(tmp_path)  # its embedded PKI is not used: every certificate is issued
    server_config = kubeconfig(
        tmp_path / "server.kubeconfig",
        apiserver,
        apiserver.add_service_account("ravenproxy-server", "cloud-1"),
    )
    agent_config = kubeconfig(
        tmp_path / "agent.kubeconfig",
        apiserver,
        apiserver.add_service_account("ravenproxy-agent", "edge-1"),
    )
    server_dir, agent_dir = tmp_path / "server-certs", tmp_path / "agent-certs"
    # A CSR of another signer, there before the controller starts: never touched.
    other_token = apiserver.add_service_account("someone", "edge-1")
    await ask(apiserver, other_token, "not-ours", "edge-1", signer="example.com/other")
    untouched = csr(apiserver, "not-ours")
    try:
        async with (
            controller_process(apiserver, tmp_path) as controller_log,
            tcp_server(echo) as port,
        ):
            server = cluster.start_server(
                "--cert-lifetime", "600",
                extra_source=("--kube-model", "--kubeconfig", str(server_config)),
                cert_dir=server_dir,
            )  # fmt: skip
            await cluster.wait_up(server)
            agent = cluster.start_agent(
                "edge-1",
                f"127.0.0.1:{port}",
                cert_dir=agent_dir,
                extra=("--kubeconfig", str(agent_config), "--cert-lifetime", "600"),
            )
            # Bootstrapped: approved and signed by the controller's CA, connected, serving.
            await cluster.wait_routable(f"edge-1:{port}")
            ca = ca_of(apiserver)
            assert apiserver.get("secrets", CA_SECRET, CA_NAMESPACE) is not None
            agent_cert = load_cert(agent_dir / "tls.crt")
            assert authority.is_issued_by(agent_cert, ca)
            assert authority.is_issued_by(load_cert(server_dir / "tls.crt"), ca)
            # Capped by the controller at LIFETIME, not the 600 s asked for.
            assert agent_cert.not_valid_after_utc <= dt.datetime.now(dt.UTC) + LIFETIME
            first_serial = serial_hex(agent_dir / "tls.crt")
            assert any(f"serial={first_serial}" in ln for ln in lines(server, "agent connected"))
            log = controller_log.read_text()
            assert "CSR approved" in log and "CSR signed" in log

            # A requester bound to edge-1 asking for edge-2: Denied with the reason, unsigned.
            impostor = cluster.start_agent(
                "edge-2",
                f"127.0.0.1:{port}",
                cert_dir=tmp_path / "impostor-certs",
                extra=("--kubeconfig", str(agent_config)),
            )
            await impostor.wait_until(
                lambda: lines(impostor, "certificate request denied"), "a denial", 30
            )
            denied = [
                o
                for o in apiserver.items(CSRS)
                if o["spec"]["signerName"] == "raven.openyurt.io/tunnel-agent"
                and "Denied" in condition_types(o)
            ]
            assert denied and all(certificate(o) is None for o in denied)
            reason = next(c for c in denied[0]["status"]["conditions"] if c["type"] == "Denied")
            assert "edge-1" in reason["message"] and "edge-2" in reason["message"]
            assert "edge-1" in lines(impostor, "certificate request denied")[0]
            assert not (tmp_path / "impostor-certs" / "tls.crt").exists()
            impostor.stop()

            # Rotation at 70-90 % of the lifetime, while a stream stays open.
            reader, writer = await cluster.connect(f"edge-1:{port}")
            pump = Pump(reader, writer)
            try:
                await pump.flowing("before the rotation")
                assert serial_hex(agent_dir / "tls.crt") == first_serial, "rotated too early"
                await agent.wait_until(
                    lambda: serial_hex(agent_dir / "tls.crt") != first_serial,
                    "the agent's certificate rotated",
                    70,
                )
                second_serial = serial_hex(agent_dir / "tls.crt")
                # The server sees the new certificate on the agent's next tunnel...
                await server.wait_until(
                    lambda: any(
                        f"serial={second_serial}" in ln for ln in lines(server, "agent connected")
                    ),
                    "the agent's new tunnel with its new serial",
                    15,
                )
                await agent.wait_until(lambda: lines(agent, "tunnel rotated"), "tunnel rotated")
                # ...and the stream opened on the old one never stopped.
                await pump.flowing("after the rotation")
                await cluster.wait_metric(
                    f'{EXPIRY}{{role="agent"}}',
                    lambda v: v == load_cert(agent_dir / "tls.crt").not_valid_after_utc.timestamp(),
                    proc=agent,
                )
                reader2, writer2 = await cluster.connect(f"edge-1:{port}")
                writer2.write(b"after\n")
                assert await asyncio.wait_for(reader2.readline(), 5) == b"after\n"
                writer2.close()
            finally:
                await pump.close()
            await agent.wait_until(lambda: lines(agent, "tunnel drained"), "old tunnel drained")
    finally:
        cluster.stop_all()
    # The other signer's CSR is exactly as it was.
    assert csr(apiserver, "not-ours") == untouched
