"""WireGuard as data: the key pair on disk, ``wg show <if> dump`` parsed, ``wg set``
commands rendered, and the loaded peers read back into
:class:`~ravenproxy.l3.state.VpnConnection`.

One peer per connection, keyed by the peer gateway's public key (from its Gateway endpoint's
``config.publicKey``); its allowed-ips are the connection's remote subnets (cryptokey routing
is the traffic selector). The side under NAT names the peer's endpoint and sends keepalives
so the NAT mapping stays open; the other side learns the endpoint from the handshake.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from ravenproxy.l3.errors import ParseError
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import VpnConnection

PROBLEM_PEER = "peer differs"
PROBLEM_DEVICE = "device differs"
PROBLEM_UNKNOWN = "unknown peer"


# --- keys -------------------------------------------------------------------------------------


def key_path(settings: L3Settings) -> Path:
    return Path(settings.wireguard_key_dir) / f"{settings.wireguard_interface}.key"


def pid_path(settings: L3Settings) -> Path:
    return Path(settings.wireguard_key_dir) / f"{settings.wireguard_interface}.pid"


def public_of(private_b64: str) -> str:
    raw = base64.b64decode(private_b64)
    pub = X25519PrivateKey.from_private_bytes(raw).public_key()
    return base64.b64encode(pub.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def ensure_private_key(settings: L3Settings) -> str:
    """The node's private key, created on first use (directory 0700, file 0600) and kept:
    the public key is published in the Gateway, so it must survive restarts."""
    path = key_path(settings)
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    text = base64.b64encode(key).decode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process won the race: use its key
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return text


def public_key(settings: L3Settings) -> str:
    """What to publish as the tunnel endpoint's ``config.publicKey``."""
    return public_of(ensure_private_key(settings))


# --- wg show dump -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    latest_handshake: int
    rx_bytes: int
    tx_bytes: int
    keepalive: int


@dataclass(frozen=True)
class Device:
    private_key: str
    public_key: str
    listen_port: int
    peers: tuple[Peer, ...]


def _none(value: str) -> str | None:
    return None if value in ("(none)", "off", "") else value


def parse_dump(text: str) -> Device:
    lines = [line.split("\t") for line in text.splitlines() if line.strip()]
    if not lines or len(lines[0]) < 4:
        raise ParseError(f"wg show dump: cannot read {text[:80]!r}")
    head = lines[0]
    peers: list[Peer] = []
    for n, f in enumerate(lines[1:], 2):
        if len(f) < 8:
            raise ParseError(f"wg show dump line {n}: {len(f)} fields")
        allowed = _none(f[3])
        try:
            peers.append(
                Peer(
                    public_key=f[0],
                    endpoint=_none(f[2]),
                    allowed_ips=tuple(sorted(allowed.split(","))) if allowed else (),
                    latest_handshake=int(f[4]),
                    rx_bytes=int(f[5]),
                    tx_bytes=int(f[6]),
                    keepalive=int(_none(f[7]) or 0),
                )
            )
        except ValueError as exc:
            raise ParseError(f"wg show dump line {n}: {exc}") from None
    return Device(
        private_key=head[0],
        public_key=head[1],
        listen_port=int(head[2]) if head[2].isdigit() else 0,
        peers=tuple(peers),
    )


def _endpoint(conn: VpnConnection) -> str | None:
    return f"{conn.remote_addr}:{conn.remote_port}" if conn.remote_addr else None


def peer_as_desired(peer: Peer, conn: VpnConnection, settings: L3Settings) -> bool:
    want_keepalive = settings.wireguard_keepalive if conn.initiator else 0
    return (
        peer.allowed_ips == tuple(sorted(conn.remote_ts))
        and (conn.remote_addr is None or peer.endpoint == _endpoint(conn))
        and peer.keepalive == want_keepalive
    )


def actual_connections(
    device: Device | None,
    private_key: str | None,
    desired: Sequence[VpnConnection],
    settings: L3Settings,
) -> tuple[VpnConnection, ...]:
    """Our peers as connections: a desired one whose peer is configured as wanted is reported
    as itself; others as read, with a ``problem`` so the planner replaces or removes them."""
    if device is None:
        return ()
    device_ok = device.listen_port == settings.vpn_port and device.private_key == private_key
    by_key = {c.remote_public_key: c for c in desired}
    out: list[VpnConnection] = []
    for peer in device.peers:
        want = by_key.get(peer.public_key)
        if want is not None and device_ok and peer_as_desired(peer, want, settings):
            out.append(want)
            continue
        if want is not None:
            out.append(replace(want, problem=PROBLEM_PEER if device_ok else PROBLEM_DEVICE))
            continue
        addr, _, port = (peer.endpoint or "").rpartition(":")
        out.append(
            VpnConnection(
                name=f"raven-wg-peer-{peer.public_key[:8]}",
                kind="wireguard",
                peer_gateway="",
                local_addr="",
                remote_addr=addr or None,
                remote_port=int(port) if port.isdigit() else 0,
                local_ts=(),
                remote_ts=peer.allowed_ips,
                initiator=peer.keepalive > 0,
                remote_public_key=peer.public_key,
                problem=PROBLEM_UNKNOWN,
            )
        )
    return tuple(out)


def peer_command(ifname: str, conn: VpnConnection, settings: L3Settings) -> list[str]:
    """``wg set`` for one peer; allowed-ips replaces the peer's whole list."""
    argv = ["wg", "set", ifname, "peer", conn.remote_public_key]
    argv += ["allowed-ips", ",".join(conn.remote_ts)]
    endpoint = _endpoint(conn)
    if endpoint:
        argv += ["endpoint", endpoint]
    keepalive = settings.wireguard_keepalive if conn.initiator else 0
    argv += ["persistent-keepalive", str(keepalive) if keepalive else "off"]
    return argv


def remove_peer_command(ifname: str, public_key: str) -> list[str]:
    return ["wg", "set", ifname, "peer", public_key, "remove"]
