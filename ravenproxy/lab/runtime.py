"""A running lab: bring it up, read its status, run a command in a host, tear it down.

``up`` writes the state file first, then builds the hosts (:mod:`.netns`), the PKI and the
inventory under DIR, starts every process (:mod:`.supervisor`) and waits until the tunnel, the
DNS, the kubelets and the L3 path answer; any failure tears down what exists and says why.
``down`` stops the processes by PID, kills the wireguard-go the driver started, deletes the
namespaces (their interfaces, routes and iptables rules go with them), the /etc/netns entries,
DIR and the state file; it is idempotent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ravenproxy.errors import LabError
from ravenproxy.l3 import wireguard
from ravenproxy.l3.settings import L3Settings
from ravenproxy.lab import echo, netns, vpn
from ravenproxy.lab import plan as p
from ravenproxy.lab import state as st
from ravenproxy.lab.supervisor import Proc, Supervisor
from ravenproxy.pki import init_pki
from ravenproxy.pki.authority import issue_server_cert
from ravenproxy.pki.pemfiles import load_cert, load_key, write_pem_cert, write_pem_key

#: Tools a lab needs, with the Debian packages that bring them.
TOOLS: dict[str, tuple[str, str]] = {
    "ip": ("ip", "iproute2"),
    "iptables": ("iptables", "iptables"),
    "sysctl": ("sysctl", "procps"),
    "curl": ("curl", "curl"),
}
VPN_TOOLS: dict[str, dict[str, tuple[str, str]]] = {
    "strongswan": {
        "charon": (vpn.CHARON, "strongswan-charon libcharon-extra-plugins "
                   "libstrongswan-extra-plugins"),
        "swanctl": ("swanctl", "strongswan-swanctl"),
    },
    "wireguard": {
        "wireguard-go": ("wireguard-go", "wireguard-go"),
        "wg": ("wg", "wireguard-tools"),
    },
}  # fmt: skip
UP_TIMEOUT = 30.0


@dataclass(frozen=True)
class UpOptions:
    name: str = p.DEFAULT_NAME
    vpn_driver: str = "strongswan"
    directory: Path | None = None
    reconcile_period: float = p.DEFAULT_PERIOD


#: Not under /run: charon runs with a private /run, its VICI socket must be seen outside.
DIRS = Path("/var/lib/ravenproxy-lab")


def default_dir(name: str) -> Path:
    return DIRS / name


def require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("needs root (network namespaces, iptables): run it with sudo")


def missing_tools(vpn_driver: str) -> list[str]:
    """``tool (package)`` for each tool that is not installed."""
    missing = []
    for tool, package in {**TOOLS, **VPN_TOOLS[vpn_driver]}.values():
        found = Path(tool).is_file() if tool.startswith("/") else shutil.which(tool)
        if not found:
            missing.append(f"{Path(tool).name} ({package})")
    return missing


# --- what runs where ----------------------------------------------------------------------
def gw_of(node: str) -> str:
    return "cloud" if node.startswith("cloud") else "edge"


def l3_settings(plan: p.LabPlan, s: st.LabState, node: str) -> L3Settings:
    gw = gw_of(node)
    vici = s.dir / (gw if node.endswith("-gw") else node) / "charon.vici"
    return L3Settings(
        vpn_driver=s.vpn_driver,
        cni_interface="eth0",
        vici_socket=f"unix://{vici}",
        psk_file=str(s.dir / "psk"),
        wireguard_interface=plan.wireguard_interface(node),
        wireguard_key_dir=str(s.dir / f"wg-{gw}"),
        reconcile_period=s.reconcile_period,
    )


def l3_flags(plan: p.LabPlan, s: st.LabState, node: str) -> list[str]:
    """The node's flags for ``agent --l3`` and ``doctor``."""
    l3 = l3_settings(plan, s, node)
    return [
        "--inventory", str(s.dir / "inventory.yaml"), "--node-name", node,
        "--vpn-driver", l3.vpn_driver, "--cni-interface", l3.cni_interface,
        "--vici-socket", l3.vici_socket, "--psk-file", str(l3.psk_file),
        "--wireguard-interface", l3.wireguard_interface,
        "--wireguard-key-dir", l3.wireguard_key_dir,
        "--reconcile-period", f"{l3.reconcile_period:g}",
    ]  # fmt: skip


def _rp(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "ravenproxy", *args)


def _py(module: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", f"ravenproxy.lab.{module}", *args)


def driver_name(node: str) -> str:
    """The process that runs ``node``'s route driver: the agent on edge-gw, ``routes run``
    elsewhere (the server is cloud-gw's tunnel end; non-gateway nodes run no agent)."""
    return "agent-edge-gw" if node == "edge-gw" else f"routes-{node}"


def driver_proc(plan: p.LabPlan, s: st.LabState, node: str) -> Proc:
    certs = s.dir / "certs"
    if node != "edge-gw":
        # DEBUG: one "in sync" line per pass, which lab fault waits for.
        argv = _rp("routes", "run", *l3_flags(plan, s, node), "--log-level", "DEBUG")
        return Proc(driver_name(node), node, argv)
    return Proc(driver_name(node), node, _rp(
        "agent", "--l3", *l3_flags(plan, s, node),
        "--server-addr", f"wss://{p.SERVER_IP}:{p.TUNNEL_PORT}", "--backoff-cap", "1",
        "--ca-file", str(certs / "ca.crt"),
        "--cert-file", str(certs / f"{node}.crt"), "--key-file", str(certs / f"{node}.key"),
        "--metrics-port", str(p.EXPORTER_PORT),
    ))  # fmt: skip


def processes(plan: p.LabPlan, s: st.LabState) -> list[Proc]:
    d, certs = s.dir, s.dir / "certs"
    server = p.SERVER_IP
    procs: list[Proc] = []
    if s.vpn_driver == "strongswan":
        for gw in ("cloud", "edge"):
            conf = d / gw / "strongswan.conf"
            procs.append(
                Proc(f"charon-{gw}", f"{gw}-gw", tuple(vpn.charon_argv()),
                     (("STRONGSWAN_CONF", str(conf)),))
            )  # fmt: skip
    procs.append(
        Proc("server", "cloud-gw", _rp(
            "server", "--inventory", str(d / "inventory.yaml"),
            "--ca-file", str(certs / "ca.crt"),
            "--cert-file", str(certs / "server.crt"), "--key-file", str(certs / "server.key"),
            "--node-name", "cloud-gw",
            "--tunnel-addr", f"{server}:{p.TUNNEL_PORT}",
            "--https-addr", f"{server}:{p.HTTPS_PORT}",
            "--http-addr", f"{server}:{p.HTTP_PORT}",
            "--metrics-addr", f"{server}:{p.METRICS_PORT}",
            "--health-addr", f"{server}:{p.HEALTH_PORT}",
            "--kubelet-ca-file", str(certs / "ca.crt"),
            "--metrics-port", str(p.EXPORTER_PORT),
        ))
    )  # fmt: skip
    procs.append(
        Proc("dns", "cloud-gw", _rp(
            "dns", "--listen", f"{server}:{p.DNS_PORT}", "--inventory", str(d / "inventory.yaml"),
        ))
    )  # fmt: skip
    for n in p.NODES:
        procs.append(driver_proc(plan, s, n.name))
        procs.append(
            Proc(f"kubelet-{n.name}", n.name, _py(
                "kubelet", "--host", "0.0.0.0", "--tls-port", str(p.KUBELET_PORT),
                "--http-port", "10255",
                "--cert", str(certs / f"kubelet-{n.name}.crt"),
                "--key", str(certs / f"kubelet-{n.name}.key"),
                "--ca", str(certs / "ca.crt"),
                "--ready-file", str(d / "run" / f"kubelet-{n.name}.ready"),
            ))
        )  # fmt: skip
    for pod in p.PODS:
        if pod.protocol == "udp":
            argv = _py("echo", "serve", pod.ip, str(pod.port))
        else:
            argv = _py("exporter", "--host", "0.0.0.0", "--port", str(pod.port), "--node", pod.node)
        procs.append(Proc(f"pod-{pod.name}", pod.node, argv))
    return procs


# --- up -----------------------------------------------------------------------------------
def up(options: UpOptions, say: Callable[[str], None]) -> st.LabState:
    require_root()
    name = p.check_name(options.name)
    if options.vpn_driver not in VPN_TOOLS:
        raise LabError(f"--vpn-driver: {options.vpn_driver!r} is not one of strongswan, wireguard")
    if not options.reconcile_period > 0:
        raise LabError(f"--reconcile-period: {options.reconcile_period} must be positive")
    if missing := missing_tools(options.vpn_driver):
        raise LabError(
            "missing tools: " + ", ".join(missing) + " — install the Debian packages in brackets"
        )
    plan = p.LabPlan(name)
    existing = st.load(name)
    if existing is not None or netns.existing(plan):
        where = existing.directory if existing else ", ".join(netns.existing(plan))
        raise LabError(
            f"lab {name!r} is up already ({where}): `ravenproxy lab down --name {name}` first"
        )
    directory = (options.directory or default_dir(name)).absolute()
    if directory.resolve().is_relative_to("/run"):
        raise LabError(f"--dir: {directory} is under /run, which charon replaces: choose another")
    if directory.exists() and any(directory.iterdir()):
        raise LabError(f"--dir: {directory} is not empty (lab down removes it: give a new one)")
    started = time.time()
    s = st.LabState(name, str(directory), options.vpn_driver, options.reconcile_period, started)
    st.save(s)
    try:
        _up(plan, s, say)
    except BaseException:
        down(name)
        raise
    say(f"lab {name!r} is up in {time.time() - started:.1f} s ({options.vpn_driver})")
    return s


def _up(plan: p.LabPlan, s: st.LabState, say: Callable[[str], None]) -> None:
    d = s.dir
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    netns.build(plan, p.SERVER_IP)
    _pki(d / "certs")
    psk = d / "psk"
    psk.write_text(os.urandom(24).hex() + "\n")
    psk.chmod(0o600)
    keys = {}
    if s.vpn_driver == "wireguard":
        for n in ("cloud-gw", "edge-gw"):
            keys[p.node(n).gateway] = wireguard.public_key(l3_settings(plan, s, n))
    (d / "inventory.yaml").write_text(p.inventory(keys))
    if s.vpn_driver == "strongswan":
        for gw in ("cloud", "edge"):
            vpn.write_charon_conf(d / gw)
    sup = Supervisor(d)
    procs = processes(plan, s)
    drivers = {driver_name(n.name) for n in p.NODES}

    # The critical path first: charon, then the cloud side's route drivers (a VPN connection
    # they could not load would wait a whole reconcile period), then the edge's once cloud-gw
    # has loaded its side (an initiation the peer refuses is retried only on the next pass).
    # Everything else starts in between (the agent keeps dialling until the server listens).
    def start(which: Callable[[Proc], bool]) -> None:
        for proc in procs:
            if which(proc):
                sup.start(proc, plan.namespace(proc.host), s.reconcile_period)

    start(lambda proc: proc.name.startswith("charon-"))
    for gw in ("cloud", "edge") if s.vpn_driver == "strongswan" else ():
        _wait((d / gw / "charon.vici").exists, f"charon on {gw}-gw", sup)
    start(lambda proc: proc.name in drivers and proc.host.startswith("cloud"))
    start(lambda proc: proc.name not in drivers and not proc.name.startswith("charon-"))
    _wait(lambda: " reconciled node=cloud-gw" in _text(sup.log_file(driver_name("cloud-gw"))),
          "the route driver on cloud-gw", sup)  # fmt: skip
    start(lambda proc: proc.name in drivers and proc.host.startswith("edge"))
    say(f"hosts, PKI and inventory ready; {len(procs)} processes started")
    ready: list[tuple[str, Callable[[], bool]]] = [
        (f"kubelet on {n.name}", (d / "run" / f"kubelet-{n.name}.ready").exists) for n in p.NODES
    ]
    ready.append(("the edge agent's tunnel", lambda: agent_connected(plan, "edge-gw")))
    for src, dst in (("cloud-echo", "edge-echo"), ("edge-echo", "cloud-echo")):
        ready.append((f"pod {src} → {dst}", _echoes(plan, src, dst)))
    for what, check in ready:
        _wait(check, what, sup)


def _echoes(plan: p.LabPlan, src: str, dst: str) -> Callable[[], bool]:
    return lambda: pod_echo(plan, src, dst) == pod_ip(src)


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _pki(certs: Path) -> None:
    init_pki(certs, (p.SERVER_IP, "cloud-gw", "localhost"), ["edge-gw"])
    ca_cert, ca_key = load_cert(certs / "ca.crt"), load_key(certs / "ca.key")
    for n in p.NODES:
        cert, key = issue_server_cert(ca_cert, ca_key, [n.name, n.ip], common_name=n.name)
        write_pem_cert(certs / f"kubelet-{n.name}.crt", cert)
        write_pem_key(certs / f"kubelet-{n.name}.key", key)


def _wait(ready: Callable[[], bool], what: str, sup: Supervisor) -> None:
    deadline = time.monotonic() + UP_TIMEOUT
    while not ready():
        if time.monotonic() > deadline:
            raise LabError(f"{what} did not come up in {UP_TIMEOUT:g} s; logs: {sup.run_dir}")
        time.sleep(0.1)


def agent_connected(plan: p.LabPlan, node: str) -> bool:
    """The server lists ``node``'s agent as connected (its ``/agents``)."""
    out = netns.run(
        ["curl", "-s", "--max-time", "2", f"http://{p.SERVER_IP}:{p.METRICS_PORT}/agents"],
        netns=plan.namespace("cloud-gw"),
        check=False,
    )
    return f'"{node}"' in out


def pod_ip(pod: str) -> str:
    return next(x.ip for x in p.PODS if x.name == pod)


def pod_echo(plan: p.LabPlan, src: str, dst: str, timeout: float = 0.5, tries: int = 2) -> str:
    """The source address the ``dst`` echo pod saw for a datagram from pod ``src``."""
    a = next(x for x in p.PODS if x.name == src)
    b = next(x for x in p.PODS if x.name == dst)
    ns = plan.namespace(a.node)
    try:
        return echo.send(
            a.ip,
            b.ip,
            b.port,
            timeout,
            tries,
            lambda: netns.socket_in(ns, socket.AF_INET, socket.SOCK_DGRAM),
        )
    except (OSError, LabError) as exc:
        return f"error: {exc}"


# --- exec ---------------------------------------------------------------------------------
def exec_(name: str, host: str, argv: Sequence[str]) -> int:
    require_root()
    plan = p.LabPlan(p.check_name(name))
    if host not in p.HOSTS:
        raise LabError(f"HOST: {host!r} is not one of {', '.join(p.HOSTS)}")
    if not argv:
        raise LabError("CMD: give a command after --, e.g. lab exec cloud-node -- ip addr")
    if plan.namespace(host) not in netns.existing(plan):
        raise LabError(f"lab {name!r} is not up: `ravenproxy lab up --name {name}`")
    return subprocess.call(["ip", "netns", "exec", plan.namespace(host), *argv])


def loaded(name: str) -> tuple[p.LabPlan, st.LabState]:
    require_root()
    plan = p.LabPlan(p.check_name(name))
    s = st.load(name)
    if s is None:
        raise LabError(f"lab {name!r} is not up: `ravenproxy lab up --name {name}`")
    return plan, s


# --- down ---------------------------------------------------------------------------------
def down(name: str) -> list[str]:
    """Remove everything of lab ``name``; what was removed (empty: nothing was there)."""
    require_root()
    plan = p.LabPlan(p.check_name(name))
    s = st.load(name)
    removed: list[str] = []
    directory = s.dir if s is not None else default_dir(name)
    sup = Supervisor(directory)
    removed += [f"process {x}" for x in sup.stop(sup.names())]
    if s is not None:
        for gw in ("cloud-gw", "edge-gw"):
            settings = l3_settings(plan, s, gw)
            if vpn.stop_wireguard_go(settings):
                removed.append(f"wireguard-go {settings.wireguard_interface}")
    for gw in ("cloud-gw", "edge-gw"):  # the sockets, also without a state file
        sock = Path(f"/var/run/wireguard/{plan.wireguard_interface(gw)}.sock")
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
            removed.append(str(sock))
    removed += netns.remove(plan)
    if directory.exists():
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(str(directory))
    with contextlib.suppress(OSError):
        DIRS.rmdir()  # with its last lab
    if st.remove(name):
        removed.append(str(st.path_of(name)))
    return removed
