"""IPsec connections as strongSwan VICI data: render ``load-conn`` messages, read
``list-conns``/``list-sas`` answers back into :class:`~ravenproxy.l3.state.VpnConnection`.

Pure functions; :mod:`ravenproxy.l3.apply_strongswan` talks to charon.

The configuration (IKEv2, PSK, ESP always in UDP 4500, the side under NAT initiates, one child
SA carrying every local/remote subnet pair — the merged equivalent of one child per pair) is a
function of the connection alone. Charon does not report every field back (the port it dials,
for instance), so the child SA's name carries a digest of the rendered configuration: a loaded
connection is "as desired" exactly when its child name is the desired one. That makes a
restarted agent find its connections in place instead of reloading them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ravenproxy.errors import ConfigError
from ravenproxy.l3.state import VpnConnection

#: Connections ravenproxy owns start with this (desired names are ``raven-<local>-<peer>``).
CONN_PREFIX = "raven-"
#: The id under which the pre-shared key is loaded (``get-shared`` lists it).
PSK_ID = "ravenproxy-psk"

IKE_PROPOSALS = ("aes256gcm16-prfsha384-x25519", "aes256-sha256-x25519", "default")
ESP_PROPOSALS = ("aes256gcm16-x25519", "aes128gcm16-x25519", "default")
DPD_DELAY = "10s"

PROBLEM_SA_DOWN = "sa down"
PROBLEM_CONFIG = "config differs"
PROBLEM_ROUTE = "route missing"

#: Keys that ship as examples or defaults somewhere (Raven's and strongSwan's docs, tutorials):
#: a tunnel keyed with one of them is open to anybody who has read the same page.
DEFAULT_KEYS = frozenset(
    {
        "openyurt-raven",
        "raven",
        "ravenproxy",
        "secret",
        "changeme",
        "change-me",
        "password",
        "psk",
        "default",
        "test",
        "strongswan",
        "this is very secure",
    }
)
MIN_PSK_LENGTH = 16


def read_psk(path: str | None) -> str:
    """The pre-shared key from its file; refuse a missing, empty, default or short key."""
    if not path:
        raise ConfigError("psk_file", "IPsec needs a pre-shared key file (--psk-file)")
    try:
        key = Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError("psk_file", f"cannot read {path}: {exc.strerror}") from None
    if not key:
        raise ConfigError("psk_file", f"{path} holds an empty key")
    if key.lower() in DEFAULT_KEYS:
        raise ConfigError("psk_file", f"{path} holds a well-known default key; generate one")
    if len(key) < MIN_PSK_LENGTH:
        raise ConfigError("psk_file", f"{path}: key shorter than {MIN_PSK_LENGTH} characters")
    return key


def shared_key_message(key: str) -> dict[str, Any]:
    """``load-shared``: no owners, so it serves every gateway identity (one cluster key)."""
    return {"id": PSK_ID, "type": "IKE", "data": key, "owners": []}


def _child_config(conn: VpnConnection) -> dict[str, Any]:
    # The initiator restarts what goes away (peer closed it, DPD timed out); the responder
    # only clears it and waits to be dialled again.
    restart = conn.initiator
    return {
        "mode": "tunnel",
        "local_ts": list(conn.local_ts),
        "remote_ts": list(conn.remote_ts),
        "esp_proposals": list(ESP_PROPOSALS),
        "start_action": "start" if restart else "none",
        "dpd_action": "restart" if restart else "clear",
        "close_action": "start" if restart else "none",
    }


def _conn_body(conn: VpnConnection, port: int) -> dict[str, Any]:
    return {
        "version": 2,
        "local_addrs": [conn.local_addr],
        "remote_addrs": [conn.remote_addr or "%any"],
        # The initiator dials the peer's NAT-T port directly and UDP encapsulation is forced,
        # so IKE and ESP both travel in UDP 4500 whether or not a NAT is detected.
        "remote_port": conn.remote_port,
        "local_port": port,
        "encap": "yes",
        "mobike": "no",
        "proposals": list(IKE_PROPOSALS),
        "dpd_delay": DPD_DELAY,
        "local": {"auth": "psk", "id": conn.local_gateway or conn.local_addr},
        "remote": {"auth": "psk", "id": conn.peer_gateway},
        "children": {"net": _child_config(conn)},
    }


def digest(conn: VpnConnection, port: int) -> str:
    text = json.dumps(_conn_body(conn, port), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def child_name(conn: VpnConnection, port: int) -> str:
    return f"{conn.name}-{digest(conn, port)}"


def conn_message(conn: VpnConnection, port: int) -> dict[str, Any]:
    """The ``load-conn`` message for one connection."""
    body = _conn_body(conn, port)
    body["children"] = {child_name(conn, port): body["children"]["net"]}
    return {conn.name: body}


# --- reading charon's answers -----------------------------------------------------------------


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def _texts(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, bytes | bytearray | str):
        return (_text(value),)
    return tuple(_text(v) for v in value)


def loaded_connection(name: str, body: Mapping[str, Any]) -> VpnConnection:
    """What charon reports of a connection, as far as it can be read back."""
    remote = _texts(body.get("remote_addrs"))
    children = body.get("children") or {}
    local_ts: tuple[str, ...] = ()
    remote_ts: tuple[str, ...] = ()
    initiator = False
    for child in children.values():
        local_ts += _texts(child.get("local-ts"))
        remote_ts += _texts(child.get("remote-ts"))
        initiator = initiator or _text(child.get("close_action", "")) == "start"
    local_auth = body.get("local-1") or {}
    remote_auth = body.get("remote-1") or {}
    local_addrs = _texts(body.get("local_addrs"))
    return VpnConnection(
        name=name,
        kind="ipsec",
        peer_gateway=_text(remote_auth.get("id", "")),
        local_addr=local_addrs[0] if local_addrs else "",
        remote_addr=remote[0] if remote and remote[0] != "%any" else None,
        remote_port=0,
        local_ts=local_ts,
        remote_ts=remote_ts,
        initiator=initiator,
        local_gateway=_text(local_auth.get("id", "")),
        problem=PROBLEM_CONFIG,
    )


def installed_children(sas: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """conn name → names of its child configs with an INSTALLED child SA under an
    ESTABLISHED IKE SA (``list-sas`` answers)."""
    out: dict[str, set[str]] = {}
    for answer in sas:
        for ike_name, ike in answer.items():
            if _text(ike.get("state", "")) != "ESTABLISHED":
                continue
            names = out.setdefault(_text(ike_name), set())
            for child in (ike.get("child-sas") or {}).values():
                if _text(child.get("state", "")) == "INSTALLED":
                    names.add(_text(child.get("name", "")))
    return out


def actual_connections(
    conns: Iterable[Mapping[str, Any]],
    sas: Iterable[Mapping[str, Any]],
    desired: Sequence[VpnConnection],
    port: int,
    routed: Collection[str] | None = None,
) -> tuple[VpnConnection, ...]:
    """Our loaded connections. One that is loaded exactly as desired and, when we initiate,
    has its SA up is reported as the desired object itself; any other is reported as read,
    with a ``problem``, so that the planner replaces it.

    ``routed``: destinations in charon's routing table (None: charon installs no routes).
    An installed SA whose remote subnets lack their route there carries no traffic even
    though charon believes it does (the route was removed by hand)."""
    want = {c.name: c for c in desired}
    up = installed_children(sas)
    out: list[VpnConnection] = []
    for answer in conns:
        for raw_name, body in answer.items():
            name = _text(raw_name)
            if not name.startswith(CONN_PREFIX):
                continue
            loaded = loaded_connection(name, body)
            target = want.get(name)
            children = {_text(c) for c in (body.get("children") or {})}
            if target is None or children != {child_name(target, port)}:
                out.append(loaded)
            elif target.initiator and child_name(target, port) not in up.get(name, set()):
                out.append(replace(target, problem=PROBLEM_SA_DOWN))
            elif (
                routed is not None
                and child_name(target, port) in up.get(name, set())
                and not set(target.remote_ts) <= set(routed)
            ):
                out.append(replace(target, problem=PROBLEM_ROUTE))
            else:
                out.append(target)
    return tuple(out)


def sa_counters(sas: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """conn name → (packets in, packets out) summed over its installed child SAs."""
    out: dict[str, tuple[int, int]] = {}
    for answer in sas:
        for ike_name, ike in answer.items():
            pin, pout = out.get(_text(ike_name), (0, 0))
            for child in (ike.get("child-sas") or {}).values():
                pin += int(_text(child.get("packets-in", "0")))
                pout += int(_text(child.get("packets-out", "0")))
            out[_text(ike_name)] = (pin, pout)
    return out
