"""Thin adapter: links, addresses, routes, rules (pyroute2), sysctls (/proc/sys) and xfrm
policies (``ip xfrm``, which pyroute2 does not speak), optionally inside a network namespace.

Reads only what ravenproxy owns: the ``raven0`` device and its addresses, every route in our
table, rules that look our table up, our xfrm priority, and the sysctl keys asked for.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import ipaddress
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pyroute2 import AsyncIPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ravenproxy.l3 import xfrm
from ravenproxy.l3.commands import run
from ravenproxy.l3.errors import ApplyError
from ravenproxy.l3.plan import Op
from ravenproxy.l3.state import (
    VXLAN_DEVICE,
    Address,
    Link,
    NodeState,
    Route,
    Rule,
    StateObject,
    Sysctl,
    XfrmPolicy,
)
from ravenproxy.log import kv

log = logging.getLogger(__name__)

T = TypeVar("T")

RTNH_F_ONLINK = 4
AF_INET, AF_INET6 = 2, 10
_FAMILY = {AF_INET: 4, AF_INET6: 6}
CLONE_NEWNET = 0x40000000
PROC_SYS = Path("/proc/sys")

KINDS = (Link, Address, Route, Rule, Sysctl, XfrmPolicy)
_GONE = frozenset({errno.ESRCH, errno.ENOENT, errno.ENODEV, errno.EADDRNOTAVAIL})


# --- reading ---------------------------------------------------------------------------------


async def read_actual(
    route_table: int, sysctl_keys: Iterable[str] = (), netns: str | None = None
) -> NodeState:
    async with AsyncIPRoute(netns=netns) as ipr:
        names: dict[int, str] = {}
        links: list[Link] = []
        raven_index: int | None = None
        async for msg in await ipr.link("dump"):
            name = msg.get("IFLA_IFNAME")
            names[msg["index"]] = name
            if name == VXLAN_DEVICE:
                raven_index = msg["index"]
                links.append(_link_of(msg))
        addresses: list[Address] = []
        if raven_index is not None:
            async for msg in await ipr.addr("dump", index=raven_index):
                addr = ipaddress.ip_address(msg.get("IFA_ADDRESS"))
                if addr.is_link_local:  # the kernel's own IPv6 address, not ours
                    continue
                addresses.append(Address(VXLAN_DEVICE, f"{addr}/{msg['prefixlen']}"))
        routes: list[Route] = []
        for family in (AF_INET, AF_INET6):
            async for msg in await ipr.route("dump", family=family, table=route_table):
                if msg.get("RTA_TABLE", msg["table"]) == route_table:
                    routes.append(_route_of(msg, names))
        rules: list[Rule] = []
        for family in (AF_INET, AF_INET6):
            async for msg in await ipr.rule("dump", family=family):
                if msg.get("FRA_TABLE", msg["table"]) == route_table:
                    rules.append(_rule_of(msg))
    sysctls = await _in_netns(netns, lambda: _read_sysctls(sysctl_keys))
    policies = xfrm.parse_policies(await run(["ip", "-o", "xfrm", "policy", "list"], netns=netns))
    return NodeState.of([*links, *addresses, *routes, *rules, *sysctls]).merge(policies)


def _link_of(msg: Any) -> Link:
    info = msg.get("IFLA_LINKINFO")
    data = info.get("IFLA_INFO_DATA") if info is not None else None
    if info is None or info.get("IFLA_INFO_KIND") != "vxlan" or data is None:
        # Our name on something that is not our vxlan: vni 0 never equals a desired link,
        # so the planner replaces it.
        return Link(VXLAN_DEVICE, 0, "", None, 0, msg.get("IFLA_MTU") or 0)
    return Link(
        name=VXLAN_DEVICE,
        vni=data.get("IFLA_VXLAN_ID"),
        local=data.get("IFLA_VXLAN_LOCAL") or data.get("IFLA_VXLAN_LOCAL6") or "",
        remote=data.get("IFLA_VXLAN_GROUP") or data.get("IFLA_VXLAN_GROUP6") or None,
        port=data.get("IFLA_VXLAN_PORT"),
        mtu=msg.get("IFLA_MTU"),
    )


def _route_of(msg: Any, names: dict[int, str]) -> Route:
    fam = msg["family"]
    dst = msg.get("RTA_DST") or ("0.0.0.0" if fam == AF_INET else "::")
    return Route(
        dst=str(ipaddress.ip_network(f"{dst}/{msg['dst_len']}")),
        table=msg.get("RTA_TABLE", msg["table"]),
        dev=names.get(msg.get("RTA_OIF"), ""),
        gateway=msg.get("RTA_GATEWAY"),
        src=msg.get("RTA_PREFSRC"),
        onlink=bool(msg["flags"] & RTNH_F_ONLINK),
    )


def _rule_of(msg: Any) -> Rule:
    return Rule(
        family=_FAMILY[msg["family"]],
        priority=msg.get("FRA_PRIORITY") or 0,
        fwmark=msg.get("FRA_FWMARK") or 0,
        mask=msg.get("FRA_FWMASK") or 0,
        table=msg.get("FRA_TABLE", msg["table"]),
    )


def _read_sysctls(keys: Iterable[str]) -> list[Sysctl]:
    out: list[Sysctl] = []
    for key in keys:
        try:
            out.append(Sysctl(key, (PROC_SYS / key).read_text().strip()))
        except FileNotFoundError:
            continue  # the interface does not exist (yet): nothing to compare
    return out


# --- namespaces --------------------------------------------------------------------------


async def _in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a fresh thread that has joined ``netns``: /proc/sys/net shows the
    network namespace of the task that looks, and setns() moves only the calling thread,
    which then ends instead of going back to a pool."""
    if netns is None:
        return await asyncio.to_thread(fn)
    return await asyncio.to_thread(_call_in_netns, netns, fn)


def _call_in_netns(netns: str, fn: Callable[[], T]) -> T:
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"netns-{netns}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


# --- applying ----------------------------------------------------------------------------


async def apply(ops: Sequence[Op], netns: str | None = None) -> tuple[tuple[Op, str], ...]:
    """Apply the link/address/route/rule/sysctl/xfrm ops among ``ops``, in order.

    Returns the ops left out, with why: a sysctl of an interface that does not exist yet
    (the CNI's device appears when its first pod starts; the next period sets it).
    """
    mine = [op for op in ops if isinstance(op.obj, KINDS)]
    skipped: list[tuple[Op, str]] = []
    if not mine:
        return ()
    async with AsyncIPRoute(netns=netns) as ipr:
        for op in mine:
            obj = op.obj
            log.info("apply", extra=kv(op=op.action, obj=obj.describe(), netns=netns or ""))
            if isinstance(obj, Sysctl):
                missing = await _in_netns(netns, functools.partial(_write_sysctl, obj))
                if missing:
                    log.warning("sysctl not set", extra=kv(key=obj.path, reason=missing))
                    skipped.append((op, missing))
            elif isinstance(obj, XfrmPolicy):
                for argv in xfrm.commands([op]):
                    await run(argv, netns=netns)
            else:
                try:
                    await _apply_rtnl(ipr, op, obj)
                except NetlinkError as exc:
                    if op.action == "del" and exc.code in _GONE:
                        # Already gone (e.g. routes of a raven0 that was just recreated):
                        # the goal of a delete is reached.
                        log.debug("already gone", extra=kv(obj=obj.describe()))
                        continue
                    raise ApplyError(f"{op.action} {obj.describe()}", str(exc)) from None
    return tuple(skipped)


async def _apply_rtnl(ipr: Any, op: Op, obj: StateObject) -> None:
    if isinstance(obj, Link):
        await _apply_link(ipr, op, obj)
    elif isinstance(obj, Address):
        index = await _index(ipr, obj.dev)
        net = ipaddress.ip_interface(obj.cidr)
        verb = "del" if op.action == "del" else "add"
        await ipr.addr(verb, index=index, address=str(net.ip), prefixlen=net.network.prefixlen)
    elif isinstance(obj, Route):
        if op.action == "del":
            await ipr.route("del", dst=obj.dst, table=obj.table)
            return
        # replace creates when missing: one call, no window without a route.
        args: dict[str, Any] = {"dst": obj.dst, "table": obj.table}
        args["oif"] = await _index(ipr, obj.dev)
        if obj.gateway:
            args["gateway"] = obj.gateway
        if obj.src:
            args["prefsrc"] = obj.src
        if obj.onlink:
            args["flags"] = RTNH_F_ONLINK
        await ipr.route("replace", **args)
    elif isinstance(obj, Rule):
        verb = "del" if op.action == "del" else "add"
        for old in op.old:
            assert isinstance(old, Rule)
            await ipr.rule("del", **_rule_args(old))
        await ipr.rule(verb, **_rule_args(obj))


def _rule_args(r: Rule) -> dict[str, Any]:
    return {
        "family": AF_INET6 if r.family == 6 else AF_INET,
        "priority": r.priority,
        "fwmark": r.fwmark,
        "fwmask": r.mask,
        "table": r.table,
    }


async def _apply_link(ipr: Any, op: Op, link: Link) -> None:
    if op.action == "del":
        await ipr.link("del", index=await _index(ipr, link.name))
        return
    if op.action == "replace":
        (old,) = op.old
        assert isinstance(old, Link)
        index = await _index(ipr, link.name)
        same_device = (old.vni, old.local, old.port) == (link.vni, link.local, link.port)
        if same_device and (old.remote is None) == (link.remote is None):
            # vxlan changes its remote and MTU in place; routes and addresses stay. Two
            # requests: the kernel refuses (EOPNOTSUPP) an MTU inside a vxlan changelink.
            if link.remote != old.remote:
                await ipr.link("set", index=index, kind="vxlan", vxlan_group=link.remote)
            if link.mtu != old.mtu:
                await ipr.link("set", index=index, mtu=link.mtu)
            return
        # VNI, port or local address cannot change on a live vxlan: recreate. This drops
        # the device's addresses and routes; the reconciler plans again right after.
        await ipr.link("del", index=index)
    args: dict[str, Any] = {
        "ifname": link.name,
        "kind": "vxlan",
        "vxlan_id": link.vni,
        "vxlan_local": link.local,
        "vxlan_port": link.port,
        "mtu": link.mtu,
    }
    if link.remote is not None:
        args["vxlan_group"] = link.remote
    await ipr.link("add", **args)
    await ipr.link("set", index=await _index(ipr, link.name), state="up")


async def _index(ipr: Any, name: str) -> int:
    found = await ipr.link_lookup(ifname=name)
    if not found:
        raise NetlinkError(errno.ENODEV, f"no device {name}")
    index: int = found[0]
    return index


def _write_sysctl(s: Sysctl) -> str:
    """Set the value; return why not when the key's directory does not exist, else ``""``."""
    path = PROC_SYS / s.path
    if not path.parent.is_dir():
        return f"{path.parent} does not exist"
    try:
        path.write_text(s.value + "\n")
    except OSError as exc:
        raise ApplyError(f"sysctl {s.path}={s.value}", str(exc)) from None
    return ""
