"""The egress socket file: mode and owner set before it listens, a stale file replaced, a live
listener or a file that is no socket refused with an error naming the path, and removal that
leaves a successor's file alone; plus the egress settings' checks."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.server.egress import bind_unix, file_id, remove_unix
from ravenproxy.server.settings import ServerSettings, owner_ids


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    p = tmp_path / "egress.sock"
    yield p
    p.unlink(missing_ok=True)


def test_socket_file_mode_and_owner(path: Path) -> None:
    sock = bind_unix(str(path), 0o640, (os.getuid(), -1))
    try:
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640
        assert st.st_uid == os.getuid()
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(path))  # it listens
        client.close()
    finally:
        sock.close()


def test_stale_socket_file_is_replaced(path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a killed server leaves
    sock = bind_unix(str(path), 0o600)
    try:
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(path))  # the new one listens there
        client.close()
    finally:
        sock.close()


def test_live_socket_is_refused_and_kept(path: Path) -> None:
    live = bind_unix(str(path), 0o600)
    try:
        with pytest.raises(ConfigError) as info:
            bind_unix(str(path), 0o600)
        assert str(info.value) == f"--egress-uds: {path}: another process listens on this socket"
        assert stat.S_ISSOCK(path.lstat().st_mode)
    finally:
        live.close()


def test_a_file_that_is_no_socket_is_never_replaced(path: Path) -> None:
    path.write_text("data")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        bind_unix(str(path), 0o600)
    assert path.read_text() == "data"


def test_remove_leaves_a_successors_file(path: Path) -> None:
    first = bind_unix(str(path), 0o600)
    bound = file_id(str(path))
    first.close()
    second = bind_unix(str(path), 0o600)  # replaced the (now stale) first one
    try:
        remove_unix(str(path), bound)
        assert path.exists()
        remove_unix(str(path), file_id(str(path)))
        assert not path.exists()
        remove_unix(str(path), bound)  # gone already: nothing to do
    finally:
        second.close()


def test_owner_by_number_and_name() -> None:
    assert owner_ids("0:0") == (0, 0)
    assert owner_ids("root") == (0, -1)
    assert owner_ids(":0") == (-1, 0)
    with pytest.raises(ConfigError, match="--egress-uds-owner: no user 'no-such-user-x'"):
        owner_ids("no-such-user-x")
    with pytest.raises(ConfigError, match="no group"):
        owner_ids("0:no-such-group-x")


def settings(base: dict[str, str], **values: Any) -> ServerSettings:
    return ServerSettings.from_mapping({**base, **values})


def test_egress_settings(base: dict[str, str], tmp_path: Path) -> None:
    s = settings(base)
    assert (s.egress_uds, s.egress_addr, s.egress_mode, s.allow_pods) == (None, None, 0o600, False)
    uds = str(tmp_path / "k.sock")
    s = settings(base, egress_uds=uds, egress_uds_mode="0660", egress_uds_owner="0:0")
    assert (s.egress_uds, s.egress_mode) == (uds, 0o660)
    s = settings(base, egress_addr="127.0.0.1:8131", egress_client_ca_file=base["ca_file"])
    assert s.egress_addr is not None and s.egress_addr.port == 8131


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"egress_uds_mode": "0680"}, "--egress-uds-mode: '0680' is not an octal mode"),
        ({"egress_uds_mode": "rw"}, "--egress-uds-mode: 'rw' is not an octal mode"),
        ({"egress_uds_mode": "1777"}, "--egress-uds-mode: '1777': only permission bits"),
        ({"egress_uds_owner": "0"}, "--egress-uds-owner: given without --egress-uds"),
        ({"egress_uds": "/no/such/dir/k.sock"}, "--egress-uds: /no/such/dir/k.sock: its directory"),
        ({"egress_uds": "/tmp/" + "x" * 120}, "--egress-uds: /tmp/xxx"),
        ({"egress_addr": "127.0.0.1:8131"}, "--egress-client-ca-file: required with --egress-addr"),
        ({"egress_client_ca_file": "CA"}, "--egress-client-ca-file: given without --egress-addr"),
    ],
)
def test_egress_settings_refused_naming_the_flag(
    base: dict[str, str], values: dict[str, str], message: str
) -> None:
    values = {k: (base["ca_file"] if v == "CA" else v) for k, v in values.items()}
    with pytest.raises(ConfigError) as info:
        settings(base, **values)
    assert str(info.value).startswith(message), str(info.value)
