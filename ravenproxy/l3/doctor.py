"""``ravenproxy doctor``: find the known L3 failures on a node, and show the evidence.

Checks are pure functions of an :class:`Evidence` record (unit-tested on data); one thin
collector (:func:`collect`) reads the node: desired and actual state, ``iptables-save``,
rp_filter values, and two samples ``interval`` seconds apart of ``/proc/net/xfrm_stat``, the
VPN's SA/peer counters and raven0's receive counter. The failures it knows:

- ``snat-before-skip-snat``: a MASQUERADE/SNAT in nat POSTROUTING runs before the jump into
  our skip-SNAT chain (seed 000: pod sources rewritten, the tunnel's selectors miss);
- ``sa-idle``: members send traffic for remote domains (raven0 receives it) but an SA's
  outbound counter stands still (the same bug seen from the tunnel);
- ``xfrm-errors``: XfrmInNoPols (seed 001: IPVS replies dropped) or XfrmOutNoStates growing;
- ``rp-filter-strict``: strict reverse-path filtering on raven0 or the CNI interface;
- ``missing``: routes, policy rules, the vxlan device or VPN connections that should exist
  and do not (or differ).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TextIO

from ravenproxy.kube.sources import model_once
from ravenproxy.l3 import (
    apply_iptables,
    apply_netlink,
    apply_strongswan,
    apply_wireguard,
    driver,
    ipsec,
    iptables,
)
from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.errors import L3Error
from ravenproxy.l3.plan import plan
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import (
    SKIP_SNAT_CHAIN,
    VXLAN_DEVICE,
    Link,
    NodeState,
    Route,
    Rule,
    VpnConnection,
)
from ravenproxy.model.snapshot import Model

XFRM_COUNTERS = ("XfrmInNoPols", "XfrmOutNoStates")
#: raven0 packets in one interval that count as "members are sending" (not a stray ARP).
MIN_MEMBER_PACKETS = 3

_EMPTY_INTS: Mapping[str, int] = MappingProxyType({})
_EMPTY_PAIRS: Mapping[str, tuple[int, int]] = MappingProxyType({})


@dataclass(frozen=True)
class Finding:
    code: str
    summary: str
    evidence: tuple[str, ...] = ()

    def render(self) -> str:
        return "\n".join([f"✗ [{self.code}] {self.summary}", *(f"    {e}" for e in self.evidence)])


@dataclass(frozen=True)
class Sample:
    """Counters at one instant."""

    xfrm_stat: Mapping[str, int] = field(default_factory=lambda: _EMPTY_INTS)
    #: VPN connection or WireGuard peer → (inbound, outbound) packets (IPsec) or bytes (wg).
    tunnel: Mapping[str, tuple[int, int]] = field(default_factory=lambda: _EMPTY_PAIRS)
    #: raven0 receive packets; ``None`` when there is no raven0.
    raven0_rx: int | None = None


@dataclass(frozen=True)
class Evidence:
    node: str
    interval: float
    desired: NodeState
    actual: NodeState
    #: iptables-save (IPv4), parsed.
    saved: iptables.Saved
    #: /proc/sys paths → values (``net/ipv4/conf/<dev>/rp_filter``, ``.../all/rp_filter``).
    sysctls: Mapping[str, str]
    cni_interface: str
    before: Sample
    after: Sample
    #: Why a part could not be read (e.g. the VPN daemon did not answer).
    unreadable: tuple[str, ...] = field(default=())

    @property
    def is_gateway(self) -> bool:
        return bool(self.desired.vpn_connections)


# --- checks (pure) ------------------------------------------------------------------------------


def check_snat_order(ev: Evidence) -> list[Finding]:
    wants_chain = any(c.name == SKIP_SNAT_CHAIN and c.family == 4 for c in ev.desired.chains)
    if not wants_chain:
        return []
    rules = iptables.snat_before_jump(ev.saved)
    if not rules:
        return []
    return [
        Finding(
            "snat-before-skip-snat",
            "traffic to remote domains is SNATed before ravenproxy can exempt it "
            "(pod sources are rewritten; the tunnel's selectors no longer match)",
            rules,
        )
    ]


def check_tunnel_counters(ev: Evidence) -> list[Finding]:
    if not ev.is_gateway or ev.before.raven0_rx is None or ev.after.raven0_rx is None:
        return []
    members = ev.after.raven0_rx - ev.before.raven0_rx
    if members < MIN_MEMBER_PACKETS:
        return []  # no traffic expected in this window
    out: list[Finding] = []
    for name, (_, sent_after) in sorted(ev.after.tunnel.items()):
        _, sent_before = ev.before.tunnel.get(name, (0, 0))
        if sent_after == sent_before:
            out.append(
                Finding(
                    "sa-idle",
                    f"{name}: nothing sent through the tunnel while member nodes sent "
                    "traffic for remote domains",
                    (
                        f"raven0 received {members} packets in {ev.interval:g}s",
                        f"{name} outbound counter stayed at {sent_after}",
                    ),
                )
            )
    return out


def check_xfrm(ev: Evidence) -> list[Finding]:
    out: list[Finding] = []
    for name in XFRM_COUNTERS:
        a, b = ev.before.xfrm_stat.get(name, 0), ev.after.xfrm_stat.get(name, 0)
        if b > a:
            why = {
                "XfrmInNoPols": "decapsulated packets match no inbound policy (IPVS replies "
                "rewritten to a service address are dropped: set --service-cidr)",
                "XfrmOutNoStates": "packets match an outbound IPsec policy that has no SA "
                "(e.g. SNATed traffic, or an SA that is gone)",
            }[name]
            out.append(
                Finding(
                    "xfrm-errors",
                    f"{name} growing: {why}",
                    (f"/proc/net/xfrm_stat {name}: {a} → {b} in {ev.interval:g}s",),
                )
            )
    return out


def check_rp_filter(ev: Evidence) -> list[Finding]:
    all_value = ev.sysctls.get("net/ipv4/conf/all/rp_filter", "0")
    out: list[Finding] = []
    for dev in (VXLAN_DEVICE, ev.cni_interface):
        path = f"net/ipv4/conf/{dev}/rp_filter"
        value = ev.sysctls.get(path)
        if value is None:
            continue  # no such interface here
        # The kernel applies the larger of conf/all and conf/<dev>.
        effective = max(int(all_value), int(value))
        if effective == 1:
            out.append(
                Finding(
                    "rp-filter-strict",
                    f"strict rp_filter on {dev}: replies from remote domains arrive on it "
                    "while the main table routes them elsewhere, and are dropped",
                    (f"{path}={value}, net/ipv4/conf/all/rp_filter={all_value}",),
                )
            )
    return out


def check_missing(ev: Evidence) -> list[Finding]:
    out: list[Finding] = []
    for op in plan(ev.actual, ev.desired):
        if op.action == "del" or not isinstance(op.obj, Route | Rule | Link | VpnConnection):
            continue
        what = "missing" if op.action == "add" else "differs"
        evidence = [f"want: {op.obj.describe()}"]
        evidence.extend(f"have: {o.describe()}" for o in op.old)
        out.append(Finding("missing", f"{op.obj.kind_name} {what}", tuple(evidence)))
    return out


CHECKS = (check_snat_order, check_tunnel_counters, check_xfrm, check_rp_filter, check_missing)


def diagnose(ev: Evidence) -> list[Finding]:
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(ev))
    return findings


# --- collecting (thin, root) ----------------------------------------------------------------


def parse_xfrm_stat(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def parse_rx_packets(net_dev: str, dev: str) -> int | None:
    for line in net_dev.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name.strip() == dev:
            return int(rest.split()[1])
    return None


def _read_proc_net() -> tuple[str, str]:
    # thread-self: /proc/self/net would show the main thread's namespace.
    base = Path("/proc/thread-self/net")
    try:
        xfrm = (base / "xfrm_stat").read_text()
    except FileNotFoundError:
        xfrm = ""
    return xfrm, (base / "dev").read_text()


async def _tunnel_counters(settings: L3Settings, netns: str | None) -> dict[str, tuple[int, int]]:
    if settings.vpn_driver == "wireguard":
        device = await apply_wireguard.read_device(settings, netns)
        if device is None:
            return {}
        return {f"wireguard peer {p.public_key}": (p.rx_bytes, p.tx_bytes) for p in device.peers}
    if not apply_strongswan.charon_available(settings):
        return {}
    _, sas = await apply_strongswan.query(settings)
    return {f"SA {k}": v for k, v in ipsec.sa_counters(sas).items()}


async def sample(settings: L3Settings, netns: str | None, unreadable: list[str]) -> Sample:
    xfrm, net_dev = await apply_netlink._in_netns(netns, _read_proc_net)
    try:
        tunnel = await _tunnel_counters(settings, netns)
    except L3Error as exc:
        unreadable.append(f"VPN counters: {exc}")
        tunnel = {}
    return Sample(
        xfrm_stat=MappingProxyType(parse_xfrm_stat(xfrm)),
        tunnel=MappingProxyType(tunnel),
        raven0_rx=parse_rx_packets(net_dev, VXLAN_DEVICE),
    )


async def collect(
    model: Model,
    node_name: str,
    settings: L3Settings,
    netns: str | None = None,
    interval: float = 2.0,
) -> Evidence:
    desired = desired_state(model, node_name, settings)
    keys = sorted(
        {
            *(s.path for s in desired.sysctls),
            "net/ipv4/conf/all/rp_filter",
            f"net/ipv4/conf/{VXLAN_DEVICE}/rp_filter",
            f"net/ipv4/conf/{settings.cni_interface}/rp_filter",
        }
    )
    actual = await driver.read_actual(settings, keys, netns, tuple(desired.vpn_connections))
    saved = await apply_iptables.save(4, netns)
    sysctls = await apply_netlink._in_netns(netns, lambda: apply_netlink._read_sysctls(keys))
    unreadable: list[str] = []
    before = await sample(settings, netns, unreadable)
    await asyncio.sleep(interval)
    after = await sample(settings, netns, unreadable)
    return Evidence(
        node=node_name,
        interval=interval,
        desired=desired,
        actual=actual,
        saved=saved,
        sysctls=MappingProxyType({s.path: s.value for s in sysctls}),
        cni_interface=settings.cni_interface,
        before=before,
        after=after,
        unreadable=tuple(dict.fromkeys(unreadable)),
    )


def report(ev: Evidence, findings: Sequence[Finding]) -> str:
    lines = [f"ravenproxy doctor: node {ev.node} ({'gateway' if ev.is_gateway else 'member'})"]
    lines.extend(f"? could not read {u}" for u in ev.unreadable)
    lines.extend(f.render() for f in findings)
    if not findings:
        lines.append("✓ no known failure found")
    return "\n".join(lines)


async def doctor_command(
    inventory: str,
    node_name: str,
    settings: L3Settings,
    *,
    interval: float = 2.0,
    netns: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """``ravenproxy doctor``: print findings with their evidence; exit 1 when any."""
    model = await model_once(inventory)
    ev = await collect(model, node_name, settings, netns, interval)
    findings = diagnose(ev)
    print(report(ev, findings), file=out)
    return 1 if findings else 0
