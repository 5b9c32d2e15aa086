"""Settings of the L3 route driver: one frozen dataclass, validated once when built."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ravenproxy import flags
from ravenproxy.errors import ConfigError
from ravenproxy.flags import setting
from ravenproxy.l3.cidrs import parse_network
from ravenproxy.l3.errors import CidrError

VPN_DRIVERS = ("strongswan", "wireguard")

# Linux IFNAMSIZ is 16 including the NUL. The name also becomes a /proc/sys path component, so
# anything that could walk out of the directory is refused, not just what the kernel refuses.
_IFNAME = re.compile(r"^[A-Za-z0-9_.\-]{1,15}$")


def _check_ifname(field: str, name: str) -> None:
    if not _IFNAME.match(name) or name in (".", ".."):
        raise ConfigError(field, f"{name!r} is not a valid interface name")


@dataclass(frozen=True)
class L3Settings:
    """How this node's L3 data path is built. Every field has a working default."""

    #: ``strongswan`` (IPsec IKEv2, ESP in UDP 4500) or ``wireguard`` (wireguard-go).
    vpn_driver: str = setting(
        "strongswan", "--vpn-driver", None, "VPN between gateways", choices=VPN_DRIVERS
    )
    #: The CNI's overlay interface; it gets rp_filter=2 because replies from remote domains
    #: come in on it while the main table would route them out elsewhere.
    cni_interface: str = setting(
        "flannel.1", "--cni-interface", "IF", "CNI interface whose rp_filter is set to loose"
    )
    #: Service CIDR; when set, xfrm policies let IPVS-rewritten replies in (XfrmInNoPols bug).
    service_cidr: str | None = setting(
        None,
        "--service-cidr",
        "CIDR",
        "service CIDR: install xfrm policies so IPVS replies are not dropped",
    )
    #: Fixed skip-SNAT supernets chosen by the operator; when empty they are computed from
    #: the gateways' subnets and never widened.
    skip_nat_cidrs: tuple[str, ...] = setting(
        (),
        "--skip-nat-cidr",
        "CIDR",
        "fix the skip-SNAT set by configuration (repeatable)",
    )
    #: MTU of the underlay interface; raven0 gets this minus the vxlan overhead.
    underlay_mtu: int = 1500
    #: VNI and UDP port of raven0 (Raven uses 1 and 4478; 4789 is often taken by the CNI).
    vxlan_vni: int = 1
    vxlan_port: int = 4478
    #: Policy routing: traffic marked ``fwmark/fwmark`` looks up ``route_table`` first.
    route_table: int = 9027
    fwmark: int = 0x40
    rule_priority: int = 100
    #: UDP port the VPN listens on / dials (IKE NAT-T and WireGuard).
    vpn_port: int = 4500
    #: Name of the WireGuard interface on a gateway node.
    wireguard_interface: str = setting(
        "raven-wg0", "--wireguard-interface", "IF", "WireGuard device on gateway nodes"
    )
    #: Seconds between full reconciliations (besides every model change): how soon a change
    #: made by hand (a deleted rule, a strict rp_filter) is repaired.
    reconcile_period: float = setting(
        60.0,
        "--reconcile-period",
        "S",
        "seconds between full reconciliations, besides every model change",
    )
    #: strongSwan's VICI socket (charon must run on gateway nodes with the vici plugin).
    vici_socket: str = setting(
        "/var/run/charon.vici", "--vici-socket", "PATH", "strongSwan charon's VICI socket"
    )
    #: Table charon installs its routes in (strongswan.conf ``charon.routing_table``); 0 when
    #: charon runs with ``install_routes = no``. Checked so that a route removed by hand is
    #: noticed (charon would not notice) and brought back.
    ipsec_route_table: int = 220
    #: File holding the IPsec pre-shared key (one line). Read when a tunnel is applied; an
    #: empty or well-known default key is refused.
    psk_file: str | None = setting(
        None,
        "--psk-file",
        "F",
        "IPsec pre-shared key file (an empty or default key is refused)",
    )
    #: Where the WireGuard private key (0600) and the wireguard-go pidfile are kept.
    wireguard_key_dir: str = setting(
        "/var/lib/ravenproxy/wireguard",
        "--wireguard-key-dir",
        "DIR",
        "where the WireGuard key pair is kept, 0600",
    )
    #: Seconds between WireGuard keepalives from the side under NAT (keeps the NAT mapping).
    wireguard_keepalive: int = 25

    def __post_init__(self) -> None:
        if self.vpn_driver not in VPN_DRIVERS:
            raise ConfigError("vpn_driver", f"{self.vpn_driver!r} is not one of {VPN_DRIVERS}")
        _check_ifname("cni_interface", self.cni_interface)
        _check_ifname("wireguard_interface", self.wireguard_interface)
        if self.service_cidr is not None:
            _check_cidr("service_cidr", self.service_cidr)
        if isinstance(self.skip_nat_cidrs, str):
            raise ConfigError("skip_nat_cidrs", "expected a sequence of CIDRs, got one string")
        for cidr in self.skip_nat_cidrs:
            _check_cidr("skip_nat_cidrs", cidr)
        # 1280 is the IPv6 minimum; anything smaller cannot carry the overlay either.
        if not 1280 <= self.underlay_mtu <= 65535:
            raise ConfigError("underlay_mtu", f"{self.underlay_mtu} is outside 1280..65535")
        if not 0 < self.vxlan_vni < 2**24:
            raise ConfigError("vxlan_vni", f"{self.vxlan_vni} is outside 1..16777215")
        _check_port("vxlan_port", self.vxlan_port)
        _check_port("vpn_port", self.vpn_port)
        # 253..255 are the kernel's default/main/local tables; 0 means "unspecified".
        if not 0 < self.route_table < 2**32 or self.route_table in (253, 254, 255):
            raise ConfigError("route_table", f"{self.route_table} is reserved or out of range")
        if not 0 < self.fwmark < 2**32:
            raise ConfigError("fwmark", f"{self.fwmark:#x} is outside 1..0xffffffff")
        # Rule 0 is the local-table lookup; 32766/32767 are main/default.
        if not 0 < self.rule_priority < 32766:
            raise ConfigError("rule_priority", f"{self.rule_priority} is outside 1..32765")
        if not self.reconcile_period > 0:
            raise ConfigError("reconcile_period", f"{self.reconcile_period} must be positive")
        if not 0 <= self.ipsec_route_table < 2**32:
            raise ConfigError("ipsec_route_table", f"{self.ipsec_route_table} is out of range")
        if not self.vici_socket.removeprefix("unix://"):
            raise ConfigError("vici_socket", "must name a unix socket path")
        if not 0 < self.wireguard_keepalive < 65536:
            raise ConfigError("wireguard_keepalive", f"{self.wireguard_keepalive} is out of range")

    @property
    def vici_path(self) -> str:
        """The VICI socket as a filesystem path (``unix://`` URIs as swanctl writes them)."""
        return self.vici_socket.removeprefix("unix://")

    @property
    def vxlan_mtu(self) -> int:
        """Underlay MTU minus vxlan over IPv4: 14 inner Ethernet + 8 VXLAN + 8 UDP + 20 IP."""
        return self.underlay_mtu - VXLAN_OVERHEAD


VXLAN_OVERHEAD = 50


def _check_cidr(field: str, text: str) -> None:
    try:
        parse_network(text, strict=True)
    except CidrError as exc:
        raise ConfigError(field, str(exc)) from None


def _check_port(field: str, port: int) -> None:
    if not 0 < port < 65536:
        raise ConfigError(field, f"{port} is outside 1..65535")


def settings_from(values: Mapping[str, Any]) -> L3Settings:
    """L3Settings from flag/config values; what is None or absent keeps its default."""
    return flags.build(L3Settings, values)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class NodeSettings:
    """``ravenproxy routes``: this node and its inventory, then the driver's own settings."""

    inventory: str | None = setting(None, "--inventory", "FILE", "the inventory to plan from")
    node_name: str | None = setting(None, "--node-name", "NODE", "this node (NODE_NAME)")
    l3: L3Settings = field(default_factory=L3Settings, metadata={"options": "*"})


@dataclass(frozen=True)
class DoctorSettings(NodeSettings):
    """``ravenproxy doctor``: also the sampling window."""

    interval: float = setting(2.0, "--interval", "S", "sampling window")
