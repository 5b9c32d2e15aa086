"""strongSwan connections as data: what is loaded, and reading charon's answers back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ravenproxy.errors import ConfigError
from ravenproxy.l3 import ipsec
from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import VpnConnection

from .models import cloud_and_edge, hub_and_two_nated_edges

PORT = 4500


def conn_of(node: str, model: Any = None) -> VpnConnection:
    (conn,) = desired_state(model or cloud_and_edge(), node, L3Settings()).vpn_connections
    return conn


def as_listed(conn: VpnConnection) -> dict[str, Any]:
    """What charon's list-conns answers for a connection loaded from ``conn_message`` (its
    values arrive as bytes)."""
    ((name, body),) = ipsec.conn_message(conn, PORT).items()
    children = {
        cname.encode(): {
            b"mode": b"TUNNEL",
            b"dpd_action": b"start" if c["dpd_action"] == "restart" else c["dpd_action"].encode(),
            b"close_action": c["close_action"].encode(),
            b"local-ts": [t.encode() for t in c["local_ts"]],
            b"remote-ts": [t.encode() for t in c["remote_ts"]],
        }
        for cname, c in body["children"].items()
    }
    listed = {
        b"local_addrs": [a.encode() for a in body["local_addrs"]],
        b"remote_addrs": [a.encode() for a in body["remote_addrs"]],
        b"version": b"IKEv2",
        b"local-1": {b"id": body["local"]["id"].encode(), b"class": b"pre-shared key"},
        b"remote-1": {b"id": body["remote"]["id"].encode(), b"class": b"pre-shared key"},
        b"children": children,
    }
    return {name.encode(): _str_keys(listed)}


def _str_keys(d: Any) -> Any:
    # The vici package decodes keys to str and leaves values as bytes.
    if isinstance(d, dict):
        return {(k.decode() if isinstance(k, bytes) else k): _str_keys(v) for k, v in d.items()}
    return d


def sa_up(conn: VpnConnection, state: bytes = b"INSTALLED") -> dict[str, Any]:
    child = ipsec.child_name(conn, PORT)
    return {
        conn.name: {
            "state": b"ESTABLISHED",
            "child-sas": {
                f"{child}-1": {
                    "name": child.encode(),
                    "state": state,
                    "packets-in": b"7",
                    "packets-out": b"9",
                }
            },
        }
    }


def test_edge_config_initiates_in_udp_4500_with_psk_identities():
    conn = conn_of("edge-gw")
    ((name, body),) = ipsec.conn_message(conn, PORT).items()
    assert name == "raven-gw-edge-gw-cloud"
    assert body["version"] == 2 and body["encap"] == "yes"
    assert body["remote_addrs"] == ["1.2.3.4"] and body["remote_port"] == 4500
    assert body["local"] == {"auth": "psk", "id": "gw-edge"}
    assert body["remote"] == {"auth": "psk", "id": "gw-cloud"}
    ((_, child),) = body["children"].items()
    # One child SA carries every subnet pair (the merged equivalent of one per pair).
    assert child["local_ts"] == ["10.16.10.0/23"] and child["remote_ts"] == ["10.16.0.0/23"]
    assert child["start_action"] == "start" and child["close_action"] == "start"


def test_cloud_config_answers_any_address_and_never_dials():
    ((_, body),) = ipsec.conn_message(conn_of("cloud-gw"), PORT).items()
    assert body["remote_addrs"] == ["%any"]
    ((_, child),) = body["children"].items()
    assert child["start_action"] == "none" and child["dpd_action"] == "clear"


def test_relay_selectors_carry_the_relayed_domain():
    m = hub_and_two_nated_edges()
    a = conn_of("a-gw", m)
    assert a.peer_gateway == "gw-cloud"
    assert "10.16.20.0/24" in a.remote_ts  # gw-b, reached through the cloud


def test_loaded_as_desired_with_sa_up_reads_back_as_desired():
    conn = conn_of("edge-gw")
    got = ipsec.actual_connections([as_listed(conn)], [sa_up(conn)], [conn], PORT)
    assert got == (conn,)


def test_initiator_without_installed_sa_is_reported_down():
    conn = conn_of("edge-gw")
    for sas in ([], [sa_up(conn, b"INSTALLING")]):
        (got,) = ipsec.actual_connections([as_listed(conn)], sas, [conn], PORT)
        assert got.problem == ipsec.PROBLEM_SA_DOWN and got != conn


def test_responder_without_sa_is_as_desired():
    # It cannot dial; its peer will.
    conn = conn_of("cloud-gw")
    assert ipsec.actual_connections([as_listed(conn)], [], [conn], PORT) == (conn,)


def test_changed_config_reads_back_as_loaded():
    old = conn_of("edge-gw")
    new = replace(old, remote_port=4501)  # not even reported by charon: the digest tells
    (got,) = ipsec.actual_connections([as_listed(old)], [sa_up(old)], [new], PORT)
    assert got.problem == ipsec.PROBLEM_CONFIG
    assert got.peer_gateway == "gw-cloud" and got.remote_addr == "1.2.3.4"
    assert got.local_ts == ("10.16.10.0/23",) and got.initiator


def test_foreign_connections_are_not_ours():
    conn = replace(conn_of("edge-gw"), name="site-to-site")
    assert ipsec.actual_connections([as_listed(conn)], [], [], PORT) == ()


def test_undesired_connection_is_reported_for_removal():
    conn = conn_of("cloud-gw")
    (got,) = ipsec.actual_connections([as_listed(conn)], [], [], PORT)
    assert got.name == conn.name and got.remote_addr is None and not got.initiator


def test_sa_counters_sum_child_sas():
    conn = conn_of("edge-gw")
    assert ipsec.sa_counters([sa_up(conn)]) == {conn.name: (7, 9)}


@pytest.mark.parametrize("text", ["", "  \n", "openyurt-raven\n", "secret", "short-key"])
def test_psk_refused(tmp_path: Path, text: str):
    f = tmp_path / "psk"
    f.write_text(text)
    with pytest.raises(ConfigError):
        ipsec.read_psk(str(f))


def test_psk_missing_file_or_flag(tmp_path: Path):
    with pytest.raises(ConfigError, match="psk_file"):
        ipsec.read_psk(None)
    with pytest.raises(ConfigError, match="cannot read"):
        ipsec.read_psk(str(tmp_path / "nope"))


def test_psk_read_stripped(tmp_path: Path):
    f = tmp_path / "psk"
    f.write_text("  a-long-random-cluster-key-9f3e  \n")
    assert ipsec.read_psk(str(f)) == "a-long-random-cluster-key-9f3e"
    msg = ipsec.shared_key_message("k" * 20)
    assert msg["id"] == ipsec.PSK_ID and msg["owners"] == []


def test_installed_sa_without_its_route_in_charons_table():
    conn = conn_of("edge-gw")
    listed, sas = [as_listed(conn)], [sa_up(conn)]
    assert ipsec.actual_connections(listed, sas, [conn], PORT, {"10.16.0.0/23"}) == (conn,)
    (got,) = ipsec.actual_connections(listed, sas, [conn], PORT, set())
    assert got.problem == ipsec.PROBLEM_ROUTE
    # charon configured not to install routes: nothing to check.
    assert ipsec.actual_connections(listed, sas, [conn], PORT, None) == (conn,)
    # A responder whose SA is not up has no route to have.
    cloud = conn_of("cloud-gw")
    assert ipsec.actual_connections([as_listed(cloud)], [], [cloud], PORT, set()) == (cloud,)
