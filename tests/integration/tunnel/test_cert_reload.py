"""Certificates reloaded from disk by running server and agent processes (real mTLS, CLI).

- Renewal from the same CA, written as an operator would (each file atomically, the key first):
  new handshakes on the tunnel port show the new server serial within 10 s, the agent rotates
  make-before-break (its new tunnel presents its new serial, the old one drains), a stream
  opened before keeps flowing during and after, and the expiry gauges move.
- A half-written certificate file is ignored with a log line while the process keeps serving;
  once complete it is taken.
- The server's CA changed to another CA: a tunnel up is not cut by the reload; the agent's next
  handshake is refused and the server says why.

``renew`` stands in for ``ravenproxy certs renew`` (being built separately) for now.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
import sys
from pathlib import Path

import pytest
from cryptography import x509

from ravenproxy.pki.authority import generate_ca, issue_client_cert, issue_server_cert
from ravenproxy.pki.pemfiles import cert_pem, load_cert, load_key, write_pem_cert, write_pem_key
from tests.helpers import eventually, run
from tests.integration.cluster import Cluster, Proc
from tests.integration.targets import Pump, echo, tcp_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

EXPIRY = "ravenproxy_certificate_expiry_timestamp_seconds"
SERVER_SANS = ["localhost", "127.0.0.1"]


def renew(crt: Path, key: Path, cert: x509.Certificate, private: object) -> None:
    """Write a renewed pair as an operator would: the key first, each file atomically."""
    write_pem_key(key, private)  # type: ignore[arg-type]
    write_pem_cert(crt, cert)


def issue(cluster: Cluster, node: str | None, days: int) -> tuple[x509.Certificate, object]:
    """A certificate from the cluster's CA: the server's (node None) or an agent's."""
    ca, ca_key = load_cert(cluster.certs / "ca.crt"), load_key(cluster.certs / "ca.key")
    not_after = dt.datetime.now(dt.UTC) + dt.timedelta(days=days)
    if node is None:
        return issue_server_cert(ca, ca_key, SERVER_SANS, not_after=not_after)
    return issue_client_cert(ca, ca_key, node, not_after=not_after)


async def tunnel_serial(cluster: Cluster, port: int) -> int:
    """The serial of the certificate a new TLS handshake on the tunnel port shows."""
    ctx = ssl.create_default_context(cafile=str(cluster.certs / "ca.crt"))
    ctx.load_cert_chain(cluster.certs / "edge-3.crt", cluster.certs / "edge-3.key")
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost"), 5
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, OSError):
            await writer.wait_closed()


async def open_pump(cluster: Cluster, echo_port: int) -> Pump:
    reader, writer = await cluster.connect(f"edge-1:{echo_port}")
    pump = Pump(reader, writer)
    await pump.flowing("before the reload")
    return pump


def lines(proc: Proc, message: str) -> list[str]:
    """The log lines of ``proc`` whose message starts with ``message``."""
    return [line for line in proc.output().splitlines() if f": {message}" in line]


async def test_renewed_certificates_are_used_without_a_restart_and_no_stream_is_cut(
    cluster: Cluster,
) -> None:
    server = cluster.start_server()
    async with tcp_server(echo) as echo_port:
        agent = cluster.start_agent("edge-1", f"127.0.0.1:{echo_port}")
        await cluster.wait_routable(f"edge-1:{echo_port}")
        old_server = load_cert(cluster.certs / "server.crt")
        old_agent = load_cert(cluster.certs / "edge-1.crt")
        assert await tunnel_serial(cluster, server.ports["tunnel"]) == old_server.serial_number
        pump = await open_pump(cluster, echo_port)
        try:
            # The operator's way: `certs renew` on the directory both processes read.
            code, out, err = await run(
                sys.executable,
                "-m",
                "ravenproxy",
                "certs",
                "renew",
                "--dir",
                str(cluster.certs),
                "--force",
                "--days",
                "30",
            )
            assert code == 0, out + err
            new_server = load_cert(cluster.certs / "server.crt")
            new_agent = load_cert(cluster.certs / "edge-1.crt")
            assert new_server.serial_number != old_server.serial_number
            assert new_agent.serial_number != old_agent.serial_number

            # New handshakes on the tunnel port show the new server certificate within 10 s.
            async def new_serial() -> bool:
                return await tunnel_serial(cluster, server.ports["tunnel"]) == (
                    new_server.serial_number
                )

            await eventually(new_serial, 10, what=lambda: f"new server serial\n{cluster.logs()}")

            # The agent rotates: a new tunnel with its new certificate, then the old drains.
            agent_serial = format(new_agent.serial_number, "x")
            await server.wait_until(
                lambda: any(
                    f"serial={agent_serial}" in ln for ln in lines(server, "agent connected")
                ),
                "the agent's new tunnel with its new serial",
                10,
            )
            await agent.wait_until(lambda: lines(agent, "tunnel rotated"), "tunnel rotated", 10)
            [rotated] = lines(agent, "certificate rotated")
            assert f"old_serial={format(old_agent.serial_number, 'x')}" in rotated
            assert f"new_serial={agent_serial}" in rotated
            await pump.flowing("after the rotation")

            # The expiry gauges moved to the new certificates.
            await cluster.wait_metric(
                f'{EXPIRY}{{role="server"}}',
                lambda v: v == new_server.not_valid_after_utc.timestamp(),
            )
            await cluster.wait_metric(
                f'{EXPIRY}{{role="agent"}}',
                lambda v: v == new_agent.not_valid_after_utc.timestamp(),
                proc=agent,
            )
            # A new stream goes over the new tunnel; the old one still carries the pump.
            reader, writer = await cluster.connect(f"edge-1:{echo_port}")
            writer.write(b"new stream\n")
            assert await asyncio.wait_for(reader.readline(), 5) == b"new stream\n"
            writer.close()
            assert lines(agent, "tunnel drained") == []
            await pump.flowing("while its tunnel drains")
        finally:
            await pump.close()
        # Its last stream done, the old tunnel closes.
        await agent.wait_until(lambda: lines(agent, "tunnel drained"), "old tunnel drained", 10)
        await cluster.wait_metric("ravenproxy_server_agents_connected", lambda v: v == 1)
        assert "cannot open a replacement" not in agent.output()
        assert "ignored" not in server.output()


async def test_a_half_written_certificate_is_ignored_until_complete(cluster: Cluster) -> None:
    server = cluster.start_server()
    async with tcp_server(echo) as echo_port:
        cluster.start_agent("edge-1", f"127.0.0.1:{echo_port}")
        await cluster.wait_routable(f"edge-1:{echo_port}")
        old = load_cert(cluster.certs / "server.crt")
        new, key = issue(cluster, None, days=30)
        write_pem_key(cluster.certs / "server.key", key)  # type: ignore[arg-type]
        # A writer that died half-way through the certificate (not atomic).
        (cluster.certs / "server.crt").write_bytes(cert_pem(new)[:300])
        await server.wait_until(
            lambda: lines(server, "new certificate files ignored"), "the ignored set logged", 10
        )
        [ignored] = lines(server, "new certificate files ignored")
        assert f"file={cluster.certs / 'server.crt'}" in ignored
        assert "incomplete PEM" in ignored
        # Still serving, with the old set: handshakes and streams.
        assert await tunnel_serial(cluster, server.ports["tunnel"]) == old.serial_number
        reader, writer = await cluster.connect(f"edge-1:{echo_port}")
        writer.write(b"still here\n")
        assert await asyncio.wait_for(reader.readline(), 5) == b"still here\n"
        writer.close()
        await asyncio.sleep(1.5)  # more looks at the same files: no second warning
        assert len(lines(server, "new certificate files ignored")) == 1

        write_pem_cert(cluster.certs / "server.crt", new)  # completed

        async def taken() -> bool:
            return await tunnel_serial(cluster, server.ports["tunnel"]) == new.serial_number

        await eventually(taken, 10, what=lambda: f"the completed certificate\n{cluster.logs()}")
        assert lines(server, "certificates reloaded")


async def test_a_new_ca_on_the_server_refuses_agents_of_the_old_one_at_their_next_handshake(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The server's own copies of its files (the agent's stay as they are); the agent trusts
    # both CAs, so it is the server's refusal, not its own, that the test sees.
    sdir = tmp_path / "server-certs"
    sdir.mkdir()
    for name in ("ca.crt", "server.crt", "server.key"):
        (sdir / name).write_bytes((cluster.certs / name).read_bytes())
    (sdir / "server.key").chmod(0o600)
    new_ca, new_ca_key = generate_ca("ravenproxy-ca-2")
    both = tmp_path / "both-cas.crt"
    both.write_bytes((cluster.certs / "ca.crt").read_bytes() + cert_pem(new_ca))
    server = cluster.start_server(
        "--ca-file", str(sdir / "ca.crt"),
        "--cert-file", str(sdir / "server.crt"),
        "--key-file", str(sdir / "server.key"),
    )  # fmt: skip
    async with tcp_server(echo) as echo_port:
        agent_extra = ("--ca-file", str(both))
        agent = cluster.start_agent("edge-1", f"127.0.0.1:{echo_port}", extra=agent_extra)
        await cluster.wait_routable(f"edge-1:{echo_port}")
        pump = await open_pump(cluster, echo_port)
        try:
            cert, key = issue_server_cert(new_ca, new_ca_key, SERVER_SANS)
            write_pem_cert(sdir / "ca.crt", new_ca)
            renew(sdir / "server.crt", sdir / "server.key", cert, key)
            await server.wait_until(
                lambda: lines(server, "CA bundle changed"), "the CA change logged", 10
            )
            # The reload cuts nothing: the tunnel and its stream stay up.
            await pump.flowing("after the CA change")
            assert lines(server, "agent TLS handshake refused") == []
        finally:
            await pump.close()
        # The agent's next handshake (a restart) is refused, and the server says why.
        agent.stop()
        agent = cluster.start_agent("edge-1", f"127.0.0.1:{echo_port}", extra=agent_extra)
        await server.wait_until(
            lambda: lines(server, "agent TLS handshake refused"), "the refusal logged", 15
        )
        [refusal, *_] = lines(server, "agent TLS handshake refused")
        assert "certificate" in refusal
        assert 'ca="CN=ravenproxy-ca-2"' in refusal
        await cluster.wait_metric(
            'ravenproxy_server_agent_sessions_total{outcome="tls_refused"}', lambda v: v >= 1
        )
        await agent.wait_until(
            lambda: lines(agent, "cannot reach the server"), "the agent refused", 10
        )
