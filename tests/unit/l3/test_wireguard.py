"""WireGuard as data: keys on disk, ``wg show dump`` read back into connections, commands."""

from __future__ import annotations

import base64
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from ravenproxy.l3 import wireguard
from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.errors import ParseError
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import VpnConnection
from ravenproxy.model.snapshot import Model

from .models import cloud_and_edge, gateway

CLOUD_KEY = base64.b64encode(b"c" * 32).decode()
EDGE_KEY = base64.b64encode(b"e" * 32).decode()


def settings(tmp_path: Path) -> L3Settings:
    return L3Settings(vpn_driver="wireguard", wireguard_key_dir=str(tmp_path / "wg"))


def edge_conn() -> VpnConnection:
    cloud = gateway("gw-cloud", "cloud-gw", public_ip="1.2.3.4", exposed=True, public_key=CLOUD_KEY)
    edge = gateway("gw-edge", "edge-gw", under_nat=True, public_key=EDGE_KEY)
    m = Model.build(nodes=list(cloud_and_edge().nodes.values()), gateways=[cloud, edge])
    (conn,) = desired_state(m, "edge-gw", L3Settings(vpn_driver="wireguard")).vpn_connections
    return conn


def dump(private: str, *peers: str, port: int = 4500) -> str:
    head = f"{private}\t{wireguard.public_of(private)}\t{port}\toff"
    return "\n".join([head, *peers]) + "\n"


def peer_line(key: str, endpoint: str, allowed: str, keepalive: str, hs: int = 0) -> str:
    return f"{key}\t(none)\t{endpoint}\t{allowed}\t{hs}\t100\t200\t{keepalive}"


def test_key_pair_is_created_once_with_0600(tmp_path: Path):
    s = settings(tmp_path)
    first = wireguard.public_key(s)
    path = wireguard.key_path(s)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert wireguard.public_key(s) == first  # kept, not regenerated
    assert len(base64.b64decode(first)) == 32


def test_peer_as_desired_reads_back_as_desired(tmp_path: Path):
    s = settings(tmp_path)
    priv = wireguard.ensure_private_key(s)
    conn = edge_conn()
    text = dump(priv, peer_line(CLOUD_KEY, "1.2.3.4:4500", "10.16.0.0/23", "25", hs=17))
    device = wireguard.parse_dump(text)
    assert device.peers[0].latest_handshake == 17 and device.peers[0].tx_bytes == 200
    assert wireguard.actual_connections(device, priv, [conn], s) == (conn,)


@pytest.mark.parametrize(
    ("endpoint", "allowed", "keepalive"),
    [
        ("1.2.3.5:4500", "10.16.0.0/23", "25"),  # endpoint moved
        ("1.2.3.4:4500", "10.16.0.0/24", "25"),  # allowed-ips narrowed by hand
        ("1.2.3.4:4500", "10.16.0.0/23", "off"),  # keepalive lost: the NAT mapping expires
    ],
)
def test_peer_that_differs_is_replaced(tmp_path: Path, endpoint: str, allowed: str, keepalive: str):
    s = settings(tmp_path)
    priv = wireguard.ensure_private_key(s)
    conn = edge_conn()
    device = wireguard.parse_dump(dump(priv, peer_line(CLOUD_KEY, endpoint, allowed, keepalive)))
    (got,) = wireguard.actual_connections(device, priv, [conn], s)
    assert got == replace(conn, problem=wireguard.PROBLEM_PEER)


def test_wrong_port_or_key_marks_every_peer(tmp_path: Path):
    s = settings(tmp_path)
    priv = wireguard.ensure_private_key(s)
    conn = edge_conn()
    line = peer_line(CLOUD_KEY, "1.2.3.4:4500", "10.16.0.0/23", "25")
    device = wireguard.parse_dump(dump(priv, line, port=51820))
    (got,) = wireguard.actual_connections(device, priv, [conn], s)
    assert got.problem == wireguard.PROBLEM_DEVICE


def test_unknown_peer_is_reported_for_removal(tmp_path: Path):
    s = settings(tmp_path)
    priv = wireguard.ensure_private_key(s)
    stranger = base64.b64encode(b"x" * 32).decode()
    device = wireguard.parse_dump(dump(priv, peer_line(stranger, "(none)", "(none)", "off")))
    (got,) = wireguard.actual_connections(device, priv, [], s)
    assert got.problem == wireguard.PROBLEM_UNKNOWN and got.remote_public_key == stranger
    assert got.remote_addr is None and got.remote_ts == ()
    assert wireguard.actual_connections(None, priv, [edge_conn()], s) == ()


def test_commands(tmp_path: Path):
    s = settings(tmp_path)
    conn = edge_conn()
    assert wireguard.peer_command("wg0", conn, s) == [
        "wg", "set", "wg0", "peer", CLOUD_KEY, "allowed-ips", "10.16.0.0/23",
        "endpoint", "1.2.3.4:4500", "persistent-keepalive", "25",
    ]  # fmt: skip
    responder = replace(conn, remote_addr=None, initiator=False)
    assert wireguard.peer_command("wg0", responder, s)[-4:] == [
        "allowed-ips", "10.16.0.0/23", "persistent-keepalive", "off",
    ]  # fmt: skip
    assert wireguard.remove_peer_command("wg0", CLOUD_KEY)[-1] == "remove"


@pytest.mark.parametrize("text", ["", "only\ttwo\n", "k\tp\t1\toff\nshort\tline\n"])
def test_unreadable_dump(text: str):
    with pytest.raises(ParseError):
        wireguard.parse_dump(text)
