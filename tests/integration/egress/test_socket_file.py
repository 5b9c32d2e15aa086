"""The egress socket file across server lifetimes: a stale one (left by a killed server) is
replaced on start, a live one refused with an error naming it, the mode and owner flags hold,
and a clean stop removes it."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from tests.integration.cluster import Cluster
from tests.integration.egress.env import NOWHERE, ConnectRefused, egress_dial

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def stale_socket_file(path: Path) -> None:
    """What a killed server leaves: a socket file nobody listens on."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    assert stat.S_ISSOCK(path.lstat().st_mode)


async def test_stale_socket_replaced_live_one_refused(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "konnectivity-server.socket"
    stale_socket_file(path)
    server = cluster.start_server(
        "--egress-uds", str(path), "--egress-uds-mode", "0660",
        "--egress-uds-owner", f"{os.getuid()}:{os.getgid()}",
    )  # fmt: skip
    await cluster.wait_up(server)
    st = path.lstat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    with pytest.raises(ConnectRefused) as refused:  # served: routed and refused by the router
        await egress_dial(f"{NOWHERE}:443", uds=path)
    assert refused.value.status == 404
    assert "stale socket file replaced" in server.output()

    second = cluster.start_server("--egress-uds", str(path), name="second")
    assert second.popen is not None
    code = second.popen.wait(30)
    assert code != 0
    assert f"--egress-uds: {path}: another process listens on this socket" in second.output()
    assert "Traceback" not in second.output()
    # The first one still serves on it.
    with pytest.raises(ConnectRefused):
        await egress_dial(f"{NOWHERE}:443", uds=path)

    assert server.stop() == 0
    assert not path.exists()  # removed on a clean stop


async def test_a_file_that_is_no_socket_is_left_alone(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "egress.sock"
    path.write_text("not a socket")
    server = cluster.start_server("--egress-uds", str(path))
    assert server.popen is not None
    assert server.popen.wait(30) != 0
    assert f"{path} exists and is not a socket" in server.output()
    assert path.read_text() == "not a socket"
