"""The server never proxies to itself (issue 8, item 1).

The default test cluster's cloud-1 is the server's own node and its InternalIP is 127.0.0.1, the
address the server's listeners are bound to, so ``Host: cloud-1:<http front>`` asks the server to
dial its own HTTP front: a loop that once took it from 32 to ~20 000 open files in 6 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest

from tests.helpers import eventually, free_port, run
from tests.integration.cluster import Cluster
from tests.integration.l7.env import curl

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _relay(port: int, target_port: int) -> subprocess.Popen[bytes]:
    """A TCP relay on 127.0.0.1 (socat) to ``target_port``; stopped by its process group."""
    return subprocess.Popen(
        [
            "socat",
            f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork",
            f"TCP:127.0.0.1:{target_port}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


async def _wait_listening(port: int) -> None:
    async def listening() -> bool:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        return True

    await eventually(
        listening, 5, interval=0.05, what=f"a listener on 127.0.0.1:{port}", ignore=(OSError,)
    )


async def test_a_request_for_the_servers_own_front_is_refused_with_508(cluster: Cluster) -> None:
    server = cluster.start_server()
    await cluster.wait_up()
    http, https = server.ports["http"], server.ports["https"]
    fds_before = server.fd_count()

    status, body = await curl(
        "--max-time", "10", "-H", f"Host: cloud-1:{http}", f"http://127.0.0.1:{http}/"
    )
    assert status == 508, body
    assert body == f"cloud-1: loop: 127.0.0.1:{http} is this server's own http front\n"
    # By address (the node's InternalIP) and into the HTTPS front, terminated: the same.
    status, body = await curl(
        "--max-time", "10", f"http://127.0.0.1:{http}/?nodeName=127.0.0.1:{https}"
    )
    assert status == 508, body
    assert body.startswith("cloud-1: loop:")
    # CONNECT to its own front.
    code, out, _ = await run(
        "curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}", "--max-time", "10",
        "-p", "-x", f"http://127.0.0.1:{http}", f"http://cloud-1:{http}/",
    )  # fmt: skip
    assert out.strip() == "508", (code, out)

    assert server.fd_count() < fds_before + 20, "the loop opened sockets"
    m = await cluster.metrics()
    assert m['ravenproxy_server_front_requests_total{front="http",status="508"}'] >= 3
    assert m['ravenproxy_server_loops_total{kind="self_dial"}'] >= 3
    assert "refused" in server.output() and "status=508" in server.output()


async def test_a_wildcard_bind_is_recognised_through_any_local_address(cluster: Cluster) -> None:
    # The HTTP front bound to every address; cloud-1's InternalIP (127.0.0.1) is one of them.
    http = free_port()
    server = cluster.start_server("--http-addr", f":{http}")
    await cluster.wait_up()
    fds_before = server.fd_count()
    status, body = await curl(
        "--max-time", "10", "-H", f"Host: cloud-1:{http}", f"http://127.0.0.1:{http}/"
    )
    assert (status, body) == (
        508,
        f"cloud-1: loop: 127.0.0.1:{http} is this server's own http front\n",
    )
    assert server.fd_count() < fds_before + 20


async def test_a_request_that_comes_back_through_another_hop_is_refused_with_508(
    cluster: Cluster,
) -> None:
    # A relay the server may dial (--allow) leads back to the server's HTTP front: the forwarded
    # request carries the server's Via marker, so its second pass is refused, and the 508 travels
    # back to the client through the first.
    relay_port = free_port()
    server = cluster.start_server("--allow", f"127.0.0.1:{relay_port}")
    await cluster.wait_up()
    relay = _relay(relay_port, server.ports["http"])
    try:
        await _wait_listening(relay_port)
        fds_before = server.fd_count()
        status, body = await curl(
            "--max-time", "10", "-H", f"Host: cloud-1:{relay_port}",
            f"http://127.0.0.1:{server.ports['http']}/",
        )  # fmt: skip
        assert status == 508, body
        assert body.startswith("cloud-1: loop detected: the request already passed through")
        assert server.fd_count() < fds_before + 20
        m = await cluster.metrics()
        assert m['ravenproxy_server_loops_total{kind="via"}'] == 1
    finally:
        os.killpg(relay.pid, signal.SIGKILL)
        relay.wait()
