"""The applier of :mod:`ravenproxy.lab.plan`: namespaces, links, addresses, routes, iptables,
and ``/etc/netns/<ns>/resolv.conf`` (``ip netns exec`` bind-mounts it over /etc/resolv.conf),
by running ``ip``, ``sysctl`` and ``iptables`` — inside the lab's namespaces only.

Everything of a lab lives in its namespaces: deleting them removes its interfaces, routes and
iptables rules with them; the host's own network is never touched (no command here runs
outside a namespace except ``ip netns add/del`` of the lab's own names).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ravenproxy.errors import LabError
from ravenproxy.lab import plan as p

NETNS_ETC = Path("/etc/netns")
NETNS_RUN = Path("/run/netns")


def run(argv: Sequence[str], *, netns: str | None = None, check: bool = True) -> str:
    full = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    done = subprocess.run(full, capture_output=True, text=True, check=False, timeout=30)
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(full)} failed: {done.stderr.strip()}")
    return done.stdout


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise LabError(f"setns: {os.strerror(err)}")


def socket_in(namespace: str, family: int, kind: int) -> socket.socket:
    """A socket that lives in ``namespace``: a socket belongs to the network namespace of the
    thread that creates it, so this thread enters the namespace, creates it, and goes back
    (no interpreter started per probe)."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_RUN / namespace, os.O_RDONLY)
        try:
            _setns(target)
            try:
                return socket.socket(family, kind)
            finally:
                _setns(own)
        finally:
            os.close(target)
    except FileNotFoundError:
        raise LabError(f"namespace {namespace} does not exist") from None
    finally:
        os.close(own)


def existing(plan: p.LabPlan) -> list[str]:
    """The lab's namespaces that exist now."""
    return [ns for ns in plan.namespaces.values() if (NETNS_RUN / ns).exists()]


def build(plan: p.LabPlan, dns_server: str) -> None:
    """Create the lab's hosts; on any failure the caller tears down what exists."""
    ns = plan.namespaces
    for host in p.HOSTS:
        run(["ip", "netns", "add", ns[host]])
        run(["ip", "link", "set", "lo", "up"], netns=ns[host])
        write_resolv_conf(ns[host], dns_server)
    for host, bridge in p.BRIDGES:
        run(["ip", "link", "add", bridge, "type", "bridge"], netns=ns[host])
        run(["ip", "link", "set", bridge, "up"], netns=ns[host])
    for link in p.LINKS:
        a, b = ns[link.a], ns[link.b]
        run(["ip", "link", "add", link.a_if, "type", "veth", "peer", "name", link.b_if,
             "netns", b], netns=a)  # fmt: skip
        if link.bridge:
            run(["ip", "link", "set", link.a_if, "master", link.bridge], netns=a)
        run(["ip", "link", "set", link.a_if, "up"], netns=a)
        run(["ip", "link", "set", link.b_if, "up"], netns=b)
    for addr in p.ADDRESSES:
        run(["ip", "addr", "add", addr.cidr, "dev", addr.dev], netns=ns[addr.host])
    for route in p.ROUTES:
        run(["ip", "route", "add", route.dest, "via", route.via], netns=ns[route.host])
    for host in p.FORWARDING:
        run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], netns=ns[host])
    for rule in p.RULES:
        run(["iptables", "-t", rule.table, "-A", *rule.args], netns=ns[rule.host])


def write_resolv_conf(namespace: str, server: str) -> None:
    d = NETNS_ETC / namespace
    d.mkdir(parents=True, exist_ok=True)
    (d / "resolv.conf").write_text(
        f"# written by ravenproxy lab: the lab's own DNS (ravenproxy dns)\nnameserver {server}\n"
    )


def remove(plan: p.LabPlan) -> list[str]:
    """Delete the lab's namespaces and /etc/netns entries; what was there (idempotent)."""
    removed = []
    for namespace in plan.namespaces.values():
        if (NETNS_RUN / namespace).exists():
            run(["ip", "netns", "del", namespace], check=False)
            removed.append(f"namespace {namespace}")
        etc = NETNS_ETC / namespace
        if etc.exists():
            shutil.rmtree(etc, ignore_errors=True)
            removed.append(str(etc))
    return removed
