"""The five-host topology of the issue, in network namespaces, with real VPN daemons.

```
 cloud-node ──eth0── cloud-gw ──wan0── nat-router ──br-lan── edge-gw
 10.0.0.2            10.0.0.1          172.31.0.254  │         192.168.1.10
 pod 10.16.1.5       172.31.0.1        192.168.1.1   └──────── edge-node
                                                               192.168.1.11
                                                               pod 10.16.11.5
```
- Pod CIDRs: cloud-gw 10.16.0.0/24, cloud-node 10.16.1.0/24, edge-gw 10.16.10.0/24,
  edge-node 10.16.11.0/24; each node holds the first address of its CIDR on ``cni0`` (an empty
  bridge), and a "pod" address on it where a test binds its sockets.
- The CNI stand-in: static routes between the nodes of one domain (as Flannel host-gw would
  install) and a Flannel-style MASQUERADE on each gateway (``-s 10.16.0.0/16 ! -d 224.0.0.0/4``).
- nat-router MASQUERADEs the edge out of wan0 and drops NEW connections from wan0: the edge can
  dial the cloud gateway (not under NAT, dialled at its InternalIP), the cloud cannot dial back.
- Nothing in any main table reaches a remote domain's pods: only the route driver does.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ravenproxy.l3 import wireguard
from ravenproxy.l3.settings import L3Settings
from ravenproxy.lab.vpn import charon_argv, write_charon_conf
from ravenproxy.lab.vpn import stop_wireguard_go as lab_stop_wireguard_go
from ravenproxy.model.snapshot import Model

from ...unit.l3.models import gateway, node
from .conftest import add_bridge, sh

_counter = itertools.count()

CLOUD_POD = "10.16.1.5"
EDGE_POD = "10.16.11.5"
FLANNEL_SUPERNET = "10.16.0.0/16"
PSK = "e2e-only-psk-5f1c0b7a9d3e4c21"

#: One UDP echo server per pod: answers each datagram with the source address it saw.
ECHO_SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    data, peer = s.recvfrom(2048)
    s.sendto(peer[0].encode() + b" " + data, peer)
"""

#: Send one datagram from a pod address, print what the far end saw as our source.
ECHO_CLIENT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
s.settimeout(float(sys.argv[4]))
for _ in range(int(sys.argv[5])):
    try:
        s.sendto(b"ping", (sys.argv[2], int(sys.argv[3])))
        print(s.recvfrom(2048)[0].decode().split()[0])
        break
    except OSError:
        continue
else:
    print("timeout")
"""
ECHO_PORT = 7000

#: A stream of numbered datagrams at a fixed rate, from a pod address to an echo server,
#: until SIGTERM; then (after a grace period for replies in flight) prints
#: "<sent> <answered> <answers that saw another source>".
STREAM = """
import select, signal, socket, sys, time
src, dst, port, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((src, 0))
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
sent, got, wrong = 0, set(), 0
def drain(wait):
    global wrong
    r, _, _ = select.select([s], [], [], max(wait, 0))
    while r:
        data = s.recv(2048).decode().split()
        got.add(int(data[1]))
        wrong += data[0] != src
        r, _, _ = select.select([s], [], [], 0)
print("started", flush=True)
step, due = 1 / rate, time.monotonic()
while not stop:
    now = time.monotonic()
    if now >= due:
        try:
            s.sendto(str(sent).encode(), (dst, port))
        except OSError:
            pass  # counted as sent: a send error is a lost packet
        sent += 1
        due += step
    drain(due - time.monotonic())
end = time.monotonic() + 1.5
while time.monotonic() < end:
    drain(end - time.monotonic())
print(sent, len(got), wrong, flush=True)
"""

INVENTORY = """\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-cloud}}
spec:
  endpoints:
  - {{nodeName: cloud-gw, type: tunnel, port: 4500, config: {{publicKey: "{cloud_key}"}}}}
---
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw-edge}}
spec:
  endpoints:
  - {{nodeName: edge-gw, type: tunnel, port: 4500, underNAT: true,
     config: {{publicKey: "{edge_key}"}}}}
""" + "".join(
    f"""---
apiVersion: v1
kind: Node
metadata:
  name: {name}
  labels: {{{{raven.openyurt.io/gateway: {gw}}}}}
spec: {{{{podCIDRs: [{cidr}]}}}}
status:
  addresses: [{{{{type: InternalIP, address: {ip}}}}}]
  conditions: [{{{{type: Ready, status: "True"}}}}]
"""
    for name, gw, cidr, ip in (
        ("cloud-gw", "gw-cloud", "10.16.0.0/24", "10.0.0.1"),
        ("cloud-node", "gw-cloud", "10.16.1.0/24", "10.0.0.2"),
        ("edge-gw", "gw-edge", "10.16.10.0/24", "192.168.1.10"),
        ("edge-node", "gw-edge", "10.16.11.0/24", "192.168.1.11"),
    )
)


@dataclass
class CloudEdge:
    cloud_node: str
    cloud_gw: str
    nat_router: str
    edge_gw: str
    edge_node: str
    workdir: Path
    tag: str
    vpn_driver: str = "strongswan"
    pids: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    # --- model and settings ---------------------------------------------------------------

    @property
    def netns_of(self) -> dict[str, str]:
        return {
            "cloud-node": self.cloud_node,
            "cloud-gw": self.cloud_gw,
            "edge-gw": self.edge_gw,
            "edge-node": self.edge_node,
        }

    def settings(self, node_name: str, **overrides: Any) -> L3Settings:
        gw = "cloud" if node_name.startswith("cloud") else "edge"
        # Each node its own charon socket: only the gateways run one (a node that finds a
        # charon with our connections while it is no gateway unloads them).
        vici = self.workdir / (gw if node_name.endswith("-gw") else node_name) / "charon.vici"
        base: dict[str, Any] = {
            "vpn_driver": self.vpn_driver,
            "cni_interface": "eth0",
            "vici_socket": f"unix://{vici}",
            "psk_file": str(self.workdir / "psk"),
            "wireguard_interface": f"rpw{self.tag}{gw[0]}",
            "wireguard_key_dir": str(self.workdir / f"wg-{gw}"),
        }
        base.update(overrides)
        return L3Settings(**base)

    def public_key(self, gw: str) -> str:
        return wireguard.public_key(self.settings(f"{gw}-gw"))

    def model(self) -> Model:
        keys = {"cloud": "", "edge": ""}
        if self.vpn_driver == "wireguard":
            keys = {g: self.public_key(g) for g in keys}
        return Model.build(
            nodes=[
                node("cloud-gw", "10.0.0.1", "gw-cloud", "10.16.0.0/24"),
                node("cloud-node", "10.0.0.2", "gw-cloud", "10.16.1.0/24"),
                node("edge-gw", "192.168.1.10", "gw-edge", "10.16.10.0/24"),
                node("edge-node", "192.168.1.11", "gw-edge", "10.16.11.0/24"),
            ],
            gateways=[
                gateway("gw-cloud", "cloud-gw", public_key=keys["cloud"]),
                gateway("gw-edge", "edge-gw", under_nat=True, public_key=keys["edge"]),
            ],
        )

    def inventory(self) -> Path:
        """The model as an inventory file, for the ``ravenproxy`` CLI."""
        keys = {"cloud_key": "", "edge_key": ""}
        if self.vpn_driver == "wireguard":
            keys = {f"{g}_key": self.public_key(g) for g in ("cloud", "edge")}
        path = self.workdir / "inventory.yaml"
        path.write_text(INVENTORY.format(**keys))
        return path

    def cli_flags(self, node_name: str) -> list[str]:
        s = self.settings(node_name)
        return [
            "--inventory", str(self.inventory()), "--node-name", node_name,
            "--vpn-driver", s.vpn_driver, "--cni-interface", s.cni_interface,
            "--vici-socket", s.vici_socket, "--psk-file", str(s.psk_file),
            "--wireguard-interface", s.wireguard_interface,
            "--wireguard-key-dir", s.wireguard_key_dir,
        ]  # fmt: skip

    # --- processes ------------------------------------------------------------------------

    def start_charon(self, gw: str) -> None:
        ns = self.cloud_gw if gw == "cloud" else self.edge_gw
        self.procs.append(start_charon(ns, self.workdir / gw))

    def start_echo(self, ns: str, addr: str, port: int = ECHO_PORT) -> None:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-c", ECHO_SERVER, addr, str(port)],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"ready"

    def start_stream(self, ns: str, src: str, dst: str, rate: float = 200) -> subprocess.Popen[Any]:
        proc = self.spawn(
            ns, sys.executable, "-c", STREAM, src, dst, str(ECHO_PORT), str(rate),
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        return proc

    @staticmethod
    def stop_stream(proc: subprocess.Popen[Any]) -> tuple[int, int, int]:
        """(sent, answered, answers that saw a rewritten source)."""
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        sent, got, wrong = (int(x) for x in out.split())
        return sent, got, wrong

    def spawn(self, ns: str, *argv: str, **kw: Any) -> subprocess.Popen[Any]:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def teardown(self) -> None:
        for proc in self.procs:
            _stop(proc)
        for gw in ("cloud", "edge"):
            stop_wireguard_go(self.settings(f"{gw}-gw"))


def start_charon(ns: str, d: Path, install_routes: bool = True) -> subprocess.Popen[Any]:
    """charon for one gateway, as ``ravenproxy lab`` runs it: its own strongswan.conf and VICI
    socket (``d/charon.vici``), a private /run (its pidfile path is fixed)."""
    conf = write_charon_conf(d, install_routes)
    env = {**os.environ, "STRONGSWAN_CONF": str(conf)}
    with open(d / "charon.out", "ab") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, *charon_argv()],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    deadline = time.monotonic() + 10
    while not (d / "charon.vici").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError(f"charon in {ns} did not start: {(d / 'charon.out').read_text()}")
        time.sleep(0.02)
    return proc


def stop_wireguard_go(settings: L3Settings) -> None:
    """Kill the wireguard-go the driver started for ``settings`` (pid kept next to the key)."""
    lab_stop_wireguard_go(settings)


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def echo(ns: str, src: str, dst: str, *, timeout: float = 1.0, tries: int = 3) -> str:
    """The source address the far pod saw, or ``"timeout"``."""
    out = sh(
        sys.executable, "-c", ECHO_CLIENT, src, dst, str(ECHO_PORT), str(timeout), str(tries),
        netns=ns,
    )  # fmt: skip
    return out.strip()


def _veth(a: str, a_if: str, b: str, b_if: str) -> None:
    sh("ip", "link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b, netns=a)
    sh("ip", "link", "set", a_if, "up", netns=a)
    sh("ip", "link", "set", b_if, "up", netns=b)


def _addr(ns: str, dev: str, cidr: str) -> None:
    sh("ip", "addr", "add", cidr, "dev", dev, netns=ns)


def _route(ns: str, *spec: str) -> None:
    sh("ip", "route", "add", *spec, netns=ns)


def build(make_netns: Any, workdir: Path, vpn_driver: str) -> CloudEdge:
    names = [make_netns() for _ in range(5)]
    tag = f"{os.getpid() % 10000}{next(_counter)}"
    t = CloudEdge(*names, workdir=workdir, tag=tag, vpn_driver=vpn_driver)
    (workdir / "psk").write_text(PSK + "\n")
    os.chmod(workdir / "psk", 0o600)
    cn, cg, nr, eg, en = names

    # Cloud LAN and the "internet" between the cloud gateway and the NAT router.
    _veth(cn, "eth0", cg, "eth0")
    _addr(cn, "eth0", "10.0.0.2/24")
    _addr(cg, "eth0", "10.0.0.1/24")
    _veth(cg, "wan0", nr, "wan0")
    _addr(cg, "wan0", "172.31.0.1/24")
    _addr(nr, "wan0", "172.31.0.254/24")
    _route(nr, "10.0.0.0/24", "via", "172.31.0.1")
    # A node's default route goes to a router that knows no pod network (here: none at all).
    _route(cn, "default", "via", "10.0.0.254")

    # Edge LAN: a bridge in the router with the edge gateway and the edge node on it.
    add_bridge(nr, "br-lan", "192.168.1.1/24")
    for ns, port, ip in ((eg, "lan-gw", "192.168.1.10/24"), (en, "lan-node", "192.168.1.11/24")):
        _veth(nr, port, ns, "eth0")
        sh("ip", "link", "set", port, "master", "br-lan", netns=nr)
        _addr(ns, "eth0", ip)
        _route(ns, "default", "via", "192.168.1.1")
    sh("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=nr)
    sh("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "192.168.1.0/24", "-o", "wan0",
       "-j", "MASQUERADE", netns=nr)  # fmt: skip
    sh("iptables", "-A", "FORWARD", "-i", "wan0", "-m", "conntrack", "--ctstate", "NEW",
       "-j", "DROP", netns=nr)  # fmt: skip

    # Pods, and the CNI stand-in within each domain.
    for ns, cidr, pod in (
        (cg, "10.16.0.1/24", None),
        (cn, "10.16.1.1/24", CLOUD_POD),
        (eg, "10.16.10.1/24", None),
        (en, "10.16.11.1/24", EDGE_POD),
    ):
        add_bridge(ns, "cni0", cidr)
        if pod:
            _addr(ns, "cni0", f"{pod}/32")
    _route(cg, "10.16.1.0/24", "via", "10.0.0.2")
    _route(cn, "10.16.0.0/24", "via", "10.0.0.1")
    _route(eg, "10.16.11.0/24", "via", "192.168.1.11")
    _route(en, "10.16.10.0/24", "via", "192.168.1.10")
    for gw in (cg, eg):
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=gw)
        sh("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", FLANNEL_SUPERNET, "!", "-d",
           "224.0.0.0/4", "-j", "MASQUERADE", netns=gw)  # fmt: skip
    return t


@contextlib.contextmanager
def cloud_edge(make_netns: Any, workdir: Path, vpn_driver: str) -> Iterator[CloudEdge]:
    t: CloudEdge | None = None
    try:
        t = build(make_netns, workdir, vpn_driver)
        if vpn_driver == "strongswan":
            t.start_charon("cloud")
            t.start_charon("edge")
        yield t
    finally:
        if t is not None:
            t.teardown()
