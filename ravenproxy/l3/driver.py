"""The route driver: read actual state, plan against desired, apply; once or periodically.

Entry points for the CLI (``ravenproxy routes plan|apply|cleanup``) and the agent:
:func:`routes_command`, :func:`reconcile_once`, :class:`Reconciler`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from ravenproxy.errors import RavenProxyError
from ravenproxy.kube.sources import model_once, model_source
from ravenproxy.l3 import (
    apply_iptables,
    apply_netlink,
    apply_strongswan,
    apply_wireguard,
    wireguard,
)
from ravenproxy.l3.desired import desired_state
from ravenproxy.l3.errors import L3Error
from ravenproxy.l3.plan import Op, cleanup_plan, plan
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import (
    Address,
    Chain,
    IpSet,
    Jump,
    Link,
    NodeState,
    Route,
    Rule,
    Sysctl,
    VpnConnection,
    XfrmPolicy,
)
from ravenproxy.l3.topology import topology
from ravenproxy.log import kv
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)

_IPTABLES = (IpSet, Chain, Jump)
_NETLINK = (Link, Address, Route, Rule, Sysctl, XfrmPolicy)
NO_VPN_DRIVER = "no VPN driver settings given"


@dataclass(frozen=True)
class ApplyReport:
    applied: tuple[Op, ...] = ()
    skipped: tuple[tuple[Op, str], ...] = ()


async def read_actual(
    settings: L3Settings,
    sysctl_keys: Sequence[str] = (),
    netns: str | None = None,
    vpn_desired: Sequence[VpnConnection] = (),
) -> NodeState:
    """What ravenproxy owns on this node now (the kernel's and the VPN daemon's view, nothing
    cached). ``vpn_desired`` lets the VPN reader say which loaded connections are as desired
    (see :mod:`ravenproxy.l3.ipsec`)."""
    kernel = await apply_netlink.read_actual(settings.route_table, sysctl_keys, netns)
    state = kernel.merge(await apply_iptables.read_actual(netns))
    return state.merge(await read_vpn(settings, vpn_desired, netns))


async def read_vpn(
    settings: L3Settings, desired: Sequence[VpnConnection], netns: str | None = None
) -> NodeState:
    """The configured VPN driver's connections; none when its daemon cannot be asked (the
    ops that would add them then fail, and say why, instead of the whole pass)."""
    try:
        if settings.vpn_driver == "wireguard":
            return await apply_wireguard.read_actual(settings, desired, netns)
        return await apply_strongswan.read_actual(settings, desired, netns)
    except L3Error as exc:
        log.warning("cannot read VPN state", extra=kv(driver=settings.vpn_driver, error=exc))
        return NodeState()


async def _apply_vpn(ops: Sequence[Op], settings: L3Settings, netns: str | None) -> None:
    if settings.vpn_driver == "wireguard":
        await apply_wireguard.apply(ops, settings, netns)
    else:
        await apply_strongswan.apply(ops, settings)


async def apply_ops(
    ops: Sequence[Op], netns: str | None = None, settings: L3Settings | None = None
) -> ApplyReport:
    """Apply in plan order; consecutive ops of one adapter form one batch. A VPN batch that
    fails (daemon down, no key) is reported as skipped; the other batches still apply."""
    applied: list[Op] = []
    skipped: list[tuple[Op, str]] = []
    for batch in _batches(ops):
        head = batch[0].obj
        if isinstance(head, _IPTABLES):
            await apply_iptables.apply(batch, netns)
            applied.extend(batch)
        elif isinstance(head, _NETLINK):
            left = await apply_netlink.apply(batch, netns)
            skipped.extend(left)
            left_ops = {id(op) for op, _ in left}
            applied.extend(op for op in batch if id(op) not in left_ops)
        else:
            assert isinstance(head, VpnConnection)
            if settings is None:
                skipped.extend((op, NO_VPN_DRIVER) for op in batch)
                continue
            try:
                await _apply_vpn(batch, settings, netns)
            except RavenProxyError as exc:
                log.warning("VPN ops failed", extra=kv(driver=settings.vpn_driver, error=exc))
                skipped.extend((op, str(exc)) for op in batch)
            else:
                applied.extend(batch)
    return ApplyReport(tuple(applied), tuple(skipped))


def _adapter(op: Op) -> str:
    if isinstance(op.obj, _IPTABLES):
        return "iptables"
    if isinstance(op.obj, _NETLINK):
        return "netlink"
    return "vpn"


def _batches(ops: Sequence[Op]) -> list[list[Op]]:
    out: list[list[Op]] = []
    for op in ops:
        if out and _adapter(out[-1][0]) == _adapter(op):
            out[-1].append(op)
        else:
            out.append([op])
    return out


def _recreates_link(ops: Sequence[Op]) -> bool:
    for op in ops:
        if isinstance(op.obj, Link) and op.action == "replace":
            (old,) = op.old
            assert isinstance(old, Link)
            if (old.vni, old.local, old.port) != (op.obj.vni, op.obj.local, op.obj.port) or (
                old.remote is None
            ) != (op.obj.remote is None):
                return True
    return False


async def reconcile_once(
    model: Model, node_name: str, settings: L3Settings, netns: str | None = None
) -> ApplyReport:
    """One pass: desired from the model, actual from the kernel, apply only the difference."""
    desired = desired_state(model, node_name, settings)
    keys = [s.path for s in desired.sysctls]
    vpn = tuple(desired.vpn_connections)
    ops = plan(await read_actual(settings, keys, netns, vpn), desired)
    report = await apply_ops(ops, netns, settings)
    if _recreates_link(ops):
        # Recreating raven0 took its addresses and routes with it; put them back now
        # rather than one period later.
        again = plan(await read_actual(settings, keys, netns, vpn), desired)
        more = await apply_ops(again, netns, settings)
        report = ApplyReport(report.applied + more.applied, more.skipped)
    return report


async def cleanup(settings: L3Settings, netns: str | None = None) -> ApplyReport:
    """Remove exactly what ravenproxy owns (sysctls keep their values)."""
    report = await apply_ops(cleanup_plan(await read_actual(settings, (), netns)), netns, settings)
    try:
        if settings.vpn_driver == "wireguard":
            await apply_wireguard.remove_device(settings, netns)
        else:
            await apply_strongswan.forget_key(settings)
    except L3Error as exc:
        log.warning("VPN cleanup incomplete", extra=kv(error=exc))
    return report


class Reconciler:
    """Level-triggered loop: reconcile on every model change and every ``reconcile_period``.

    A failed pass is logged and retried on the next trigger; the previous kernel state stays.
    """

    def __init__(
        self, store: ModelStore, node_name: str, settings: L3Settings, netns: str | None = None
    ) -> None:
        self.store = store
        self.node_name = node_name
        self.settings = settings
        self.netns = netns
        self.passes = 0

    async def run(self) -> None:
        while True:
            version = self.store.version
            try:
                report = await reconcile_once(
                    self.store.model, self.node_name, self.settings, self.netns
                )
                if report.applied:
                    log.info("reconciled", extra=kv(node=self.node_name, ops=len(report.applied)))
                elif not report.skipped:
                    log.debug("in sync", extra=kv(node=self.node_name))
                for op, why in report.skipped:
                    log.warning("not applied", extra=kv(op=op.obj.describe(), reason=why))
            except Exception as exc:
                # One failed pass (a tool missing, a netlink error, a bug) must not end the
                # loop: the next trigger retries from a fresh read of the kernel.
                log.exception("reconcile failed", extra=kv(node=self.node_name, error=exc))
            self.passes += 1
            try:
                await asyncio.wait_for(
                    self.store.wait_changed(version), timeout=self.settings.reconcile_period
                )
            except TimeoutError:
                pass


async def run_routes(inventory: str, node_name: str, settings: L3Settings) -> None:
    """``ravenproxy routes run``: the route driver alone, for a node that runs no agent (as
    ``agent --l3`` embeds it): reconcile on every inventory change and every
    ``reconcile_period``, until cancelled."""
    store = ModelStore()
    async with model_source(store, inventory=inventory):
        await Reconciler(store, node_name, settings).run()


async def routes_command(
    action: str,
    inventory: str,
    node_name: str,
    settings: L3Settings,
    *,
    netns: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """``ravenproxy routes plan|apply|cleanup``: print the ops (``plan`` only prints).

    Returns the exit status: 0 when everything planned was applied, 3 when some ops were
    left out (printed with the reason, e.g. VPN connections until the VPN drivers exist).
    Failures raise :class:`~ravenproxy.errors.RavenProxyError` subclasses (``ApplyError``,
    ``DesiredStateError``, ``InventoryError``) for the CLI to print and exit 1.
    """
    if action == "cleanup":
        report = await cleanup(settings, netns)
        _print_ops(report.applied, out)
        return _print_skipped(report, out)
    model = await model_once(inventory)
    _print_public_key(model, node_name, settings, out)
    if action == "plan":
        desired = desired_state(model, node_name, settings)
        actual = await read_actual(
            settings, [s.path for s in desired.sysctls], netns, tuple(desired.vpn_connections)
        )
        _print_ops(plan(actual, desired), out)
        return 0
    if action == "apply":
        report = await reconcile_once(model, node_name, settings, netns)
        _print_ops(report.applied, out)
        return _print_skipped(report, out)
    raise ValueError(f"unknown routes action {action!r}")


def _print_public_key(model: Model, node_name: str, settings: L3Settings, out: TextIO) -> None:
    """On a WireGuard tunnel node: the key to publish as the endpoint's ``config.publicKey``
    (created on first use; peers cannot reach this node before they have it)."""
    node = model.node(node_name)
    if settings.vpn_driver != "wireguard" or node is None or node.gateway is None:
        return
    domain = topology(model, settings.vpn_port).domains.get(node.gateway)
    if domain is not None and domain.gateway_node == node_name:
        print(f"# wireguard publicKey: {wireguard.public_key(settings)}", file=out)


def _print_ops(ops: Sequence[Op], out: TextIO) -> None:
    if not ops:
        print("no changes", file=out)
    for op in ops:
        print(op, file=out)


def _print_skipped(report: ApplyReport, out: TextIO) -> int:
    for op, why in report.skipped:
        print(f"! not applied: {op.obj.describe()}: {why}", file=out)
    return 3 if report.skipped else 0
