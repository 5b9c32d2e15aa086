"""Relay: two edge gateways, each behind its own NAT, reach each other's pods through the
central (exposed) cloud gateway — over strongSwan and over WireGuard.

```
 a-gw ──lan── nat-a ──wan── hub (cloud-gw, 10.0.0.1) ──wan── nat-b ──lan── b-gw
 pod 10.16.10.5                pods 10.16.0.0/24                        pod 10.16.20.5
```
Neither edge can dial the other (both NATs drop what comes in unasked); each dials the hub,
whose connections carry the other edge's subnets as its own side's selectors."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ravenproxy.l3 import driver, wireguard
from ravenproxy.l3.settings import L3Settings
from ravenproxy.model.snapshot import Model

from ...unit.l3.models import gateway, node
from .cloud_edge import (
    ECHO_PORT,
    ECHO_SERVER,
    FLANNEL_SUPERNET,
    PSK,
    _stop,
    echo,
    start_charon,
    stop_wireguard_go,
)
from .conftest import add_bridge, sh

pytestmark = pytest.mark.root

A_POD, B_POD = "10.16.10.5", "10.16.20.5"
GATEWAYS = ("hub", "a-gw", "b-gw")


class Relay:
    def __init__(self, make: Callable[[], str], workdir: Path, vpn_driver: str) -> None:
        self.hub, self.nat_a, self.a, self.nat_b, self.b = (make() for _ in range(5))
        self.ns = {"hub": self.hub, "a-gw": self.a, "b-gw": self.b}
        self.workdir = workdir
        self.vpn_driver = vpn_driver
        self.tag = self.hub.replace("rp-", "").replace("-", "")[-6:]
        self.procs: list[subprocess.Popen[Any]] = []
        (workdir / "psk").write_text(PSK + "\n")

    def settings(self, name: str) -> L3Settings:
        return L3Settings(
            vpn_driver=self.vpn_driver,
            cni_interface="cni0",
            vici_socket=f"unix://{self.workdir / name / 'charon.vici'}",
            psk_file=str(self.workdir / "psk"),
            wireguard_interface=f"rpr{self.tag}{name[0]}",
            wireguard_key_dir=str(self.workdir / f"wg-{name}"),
        )

    def model(self) -> Model:
        keys = {g: "" for g in GATEWAYS}
        if self.vpn_driver == "wireguard":
            keys = {g: wireguard.public_key(self.settings(g)) for g in GATEWAYS}
        return Model.build(
            nodes=[
                node("hub", "10.0.0.1", "gw-cloud", "10.16.0.0/24"),
                node("a-gw", "192.168.1.10", "gw-a", "10.16.10.0/24"),
                node("b-gw", "192.168.2.10", "gw-b", "10.16.20.0/24"),
            ],
            gateways=[
                gateway("gw-cloud", "hub", exposed=True, public_key=keys["hub"]),
                gateway("gw-a", "a-gw", under_nat=True, public_key=keys["a-gw"]),
                gateway("gw-b", "b-gw", under_nat=True, public_key=keys["b-gw"]),
            ],
        )

    def build(self) -> None:
        add_bridge(self.hub, "eth0", "10.0.0.1/24")
        for i, (nat, gw) in enumerate(((self.nat_a, self.a), (self.nat_b, self.b)), 1):
            wan = f"wan{i}"
            sh("ip", "link", "add", wan, "type", "veth", "peer", "name", "wan0", "netns", nat,
               netns=self.hub)  # fmt: skip
            sh("ip", "addr", "add", f"172.31.{i}.1/24", "dev", wan, netns=self.hub)
            sh("ip", "link", "set", wan, "up", netns=self.hub)
            sh("ip", "addr", "add", f"172.31.{i}.254/24", "dev", "wan0", netns=nat)
            sh("ip", "link", "set", "wan0", "up", netns=nat)
            sh("ip", "route", "add", "10.0.0.0/24", "via", f"172.31.{i}.1", netns=nat)
            sh("ip", "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", gw,
               netns=nat)  # fmt: skip
            sh("ip", "addr", "add", f"192.168.{i}.1/24", "dev", "lan0", netns=nat)
            sh("ip", "link", "set", "lan0", "up", netns=nat)
            sh("ip", "addr", "add", f"192.168.{i}.10/24", "dev", "eth0", netns=gw)
            sh("ip", "link", "set", "eth0", "up", netns=gw)
            sh("ip", "route", "add", "default", "via", f"192.168.{i}.1", netns=gw)
            sh("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=nat)
            sh("iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0", "-j", "MASQUERADE",
               netns=nat)  # fmt: skip
            sh("iptables", "-A", "FORWARD", "-i", "wan0", "-m", "conntrack", "--ctstate", "NEW",
               "-j", "DROP", netns=nat)  # fmt: skip
        for ns, cidr, pod in (
            (self.hub, "10.16.0.1/24", None),
            (self.a, "10.16.10.1/24", A_POD),
            (self.b, "10.16.20.1/24", B_POD),
        ):
            add_bridge(ns, "cni0", cidr)
            if pod:
                sh("ip", "addr", "add", f"{pod}/32", "dev", "cni0", netns=ns)
            sh("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=ns)
            sh("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", FLANNEL_SUPERNET, "!", "-d",
               "224.0.0.0/4", "-j", "MASQUERADE", netns=ns)  # fmt: skip
        if self.vpn_driver == "strongswan":
            for name in GATEWAYS:
                self.procs.append(start_charon(self.ns[name], self.workdir / name))

    def start_echo(self, ns: str, addr: str) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", ECHO_SERVER, addr, str(ECHO_PORT)],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"

    def dump(self) -> str:
        """What each gateway holds, for a failure message."""
        out = []
        for name in GATEWAYS:
            ns, s = self.ns[name], self.settings(name)
            out.append(f"== {name}")
            out.append(sh("ip", "route", "show", "table", "all", netns=ns, check=False))
            if self.vpn_driver == "strongswan":
                uri = f"unix://{s.vici_path}"
                out.append(sh("swanctl", "--list-sas", "--uri", uri, check=False))
                out.append((self.workdir / name / "charon.log").read_text()[-1500:])
            else:
                out.append(sh("wg", "show", s.wireguard_interface, netns=ns, check=False))
        return "\n".join(out)

    def teardown(self) -> None:
        for proc in self.procs:
            _stop(proc)
        for name in GATEWAYS:
            stop_wireguard_go(self.settings(name))


KERNEL_LIBIPSEC_RELAY = (
    "charon's kernel-libipsec (the only IPsec data path on the test bed: no kernel ESP) "
    "installs a route for every outbound policy and needs a local address inside its local "
    "selector; the hub owns none inside a relayed edge's subnets, so it refuses that child "
    "(TS_UNACCEPTABLE). With kernel ESP (kernel-netlink) no such route is needed."
)


@pytest.fixture(
    params=[
        pytest.param(
            "strongswan", marks=pytest.mark.xfail(strict=True, reason=KERNEL_LIBIPSEC_RELAY)
        ),
        "wireguard",
    ]
)
def relay(request: pytest.FixtureRequest, netns_factory: Callable[[], str]) -> Iterator[Relay]:
    workdir = Path(tempfile.mkdtemp(prefix="rp-relay-"))
    r = Relay(netns_factory, workdir, request.param)
    try:
        r.build()
        yield r
    finally:
        r.teardown()
        shutil.rmtree(workdir, ignore_errors=True)


async def test_two_nated_edges_reach_each_other_through_the_hub(relay: Relay):
    r = relay
    model = r.model()
    # The central gateway carries each edge's subnets on its connection to the other.
    for name in GATEWAYS:
        report = await driver.reconcile_once(model, name, r.settings(name), r.ns[name])
        assert report.skipped == (), report.skipped
    r.start_echo(r.a, A_POD)
    r.start_echo(r.b, B_POD)
    deadline = asyncio.get_running_loop().time() + 10
    while echo(r.a, A_POD, B_POD, timeout=0.3, tries=1) != A_POD:
        assert asyncio.get_running_loop().time() < deadline, f"no path a → b: {r.dump()}"
    assert echo(r.b, B_POD, A_POD) == B_POD
