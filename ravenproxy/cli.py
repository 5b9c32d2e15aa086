"""``ravenproxy``: one console script, one subcommand per job (see README "Command line")."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from ravenproxy import __version__
from ravenproxy import config as cfg
from ravenproxy import log as logsetup
from ravenproxy.errors import ConfigError, RavenProxyError

log = logging.getLogger("ravenproxy")


def raise_fd_limit() -> None:
    """A proxy holds two sockets per stream: lift the soft descriptor limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - best effort
        pass


def run_async(main: Coroutine[Any, Any, int], *, fast_loop: bool = True) -> int:
    """Run under uvloop when it is installed (it roughly doubles relay throughput).

    ``fast_loop=False`` keeps asyncio's own loop: uvloop cannot open netlink sockets, which
    pyroute2 needs for the L3 driver.
    """
    raise_fd_limit()
    if not fast_loop:
        return asyncio.run(main)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        result: int = runner.run(main)
        return result


async def until_signalled() -> None:
    """Wait for SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


# -- certs ----------------------------------------------------------------------------------
def cmd_certs_init(args: argparse.Namespace) -> int:
    from ravenproxy.pki import init_pki

    report = init_pki(
        Path(args.dir),
        args.server_san or ("localhost", "127.0.0.1"),
        args.agent or (),
    )
    for path in report.created:
        print(f"created {path}")
    for path in report.kept:
        print(f"kept    {path}")
    for warning in report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


# -- server ---------------------------------------------------------------------------------


def cmd_server(args: argparse.Namespace) -> int:
    from ravenproxy.server.settings import FIELDS, ServerSettings

    settings = ServerSettings.from_mapping(cfg.gather(args, FIELDS))
    return run_async(_server_main(settings))


async def _server_main(settings: Any) -> int:
    from ravenproxy.kube.sources import model_source
    from ravenproxy.model.store import ModelStore
    from ravenproxy.server.app import ProxyServer

    store = ModelStore()
    async with model_source(
        store,
        inventory=settings.inventory,
        kube=settings.kube_model,
        kubeconfig=settings.kubeconfig,
        pods=True,  # kubelet pod paths are routed to the pod's node
    ):
        server = ProxyServer(settings, store)
        await server.start()
        try:
            await until_signalled()
        finally:
            await server.stop()
    return 0


# -- agent ----------------------------------------------------------------------------------


def cmd_agent(args: argparse.Namespace) -> int:
    from ravenproxy.agent.settings import FIELDS, AgentSettings

    settings = AgentSettings.from_mapping(cfg.gather(args, FIELDS))
    from ravenproxy.agent.app import Agent

    # uvloop cannot open the netlink sockets the L3 driver needs.
    return run_async(_forever(Agent(settings).run()), fast_loop=settings.l3 is None)


# -- routes (L3) ----------------------------------------------------------------------------
def _l3_settings(args: argparse.Namespace) -> Any:
    from ravenproxy.l3.settings import settings_from

    return settings_from(vars(args))


def cmd_routes(args: argparse.Namespace) -> int:
    from ravenproxy.l3.driver import routes_command

    node = args.node_name or cfg.env_node_name()
    if args.action != "cleanup":
        if not args.inventory:
            raise ConfigError("--inventory", "is required for plan and apply")
        if not node:
            raise ConfigError("--node-name", "is required (or set NODE_NAME)")
    settings = _l3_settings(args)
    return run_async(
        routes_command(args.action, args.inventory or "", node or "", settings), fast_loop=False
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from ravenproxy.l3.doctor import doctor_command

    node = args.node_name or cfg.env_node_name()
    if not args.inventory:
        raise ConfigError("--inventory", "is required")
    if not node:
        raise ConfigError("--node-name", "is required (or set NODE_NAME)")
    if not args.interval > 0:
        raise ConfigError("--interval", "must be positive")
    return run_async(
        doctor_command(args.inventory, node, _l3_settings(args), interval=args.interval),
        fast_loop=False,
    )


def cmd_controller(args: argparse.Namespace) -> int:
    from ravenproxy.controller import agents, dryrun, runtime
    from ravenproxy.controller.election import DEFAULT_GRACE

    if args.inventory and args.kubeconfig:
        raise ConfigError("--inventory", "give either --inventory or --kubeconfig, not both")
    grace = DEFAULT_GRACE
    if args.agent_grace is not None:
        grace = cfg.positive(args.agent_grace, "--agent-grace")
    urls = tuple(agents.agents_url(u) for u in args.agents_url or ())
    settings = runtime.ControllerSettings(agent_grace=grace, agents_urls=urls)
    if args.inventory:
        if args.dry_run:
            print(dryrun.dry_run_inventory(args.inventory), end="")
            return 0
        return run_async(
            _forever(
                dryrun.run_inventory_controller(
                    args.inventory, _write, agents_urls=urls, agent_grace=settings.agent_grace
                )
            )
        )
    kubeconfig = Path(args.kubeconfig) if args.kubeconfig else None
    if args.dry_run:

        async def show() -> int:
            print(await runtime.dry_run_kube(kubeconfig), end="")
            return 0

        return run_async(show())
    return run_async(_forever(runtime.run_controller(kubeconfig, settings)))


def cmd_dns(args: argparse.Namespace) -> int:
    from ravenproxy.controller import dns, dnsfeed

    listen = cfg.parse_address(args.listen, "--listen")
    where = (listen.host or "0.0.0.0", listen.port)
    if bool(args.inventory) == bool(args.kubeconfig):
        raise ConfigError("--inventory", "give exactly one of --inventory or --kubeconfig")
    given: dict[str, Any] = {}
    if args.tcp_idle_timeout is not None:
        given["idle_timeout"] = cfg.positive(args.tcp_idle_timeout, "--tcp-idle-timeout")
    for key, flag in (
        ("max_clients", "--max-tcp-clients"),
        ("max_clients_per_source", "--max-tcp-clients-per-source"),
    ):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            given[key] = int(cfg.positive(value, flag, integer=True))
    limits = dns.TCPLimits(**given)
    if args.inventory:
        inventory = Path(cfg.existing_file(args.inventory, "--inventory"))
        return run_async(
            _forever(
                dnsfeed.run_dns(
                    inventory, where, args.suffix, cluster_ip=args.cluster_ip, limits=limits
                )
            )
        )
    return run_async(
        _forever(dnsfeed.run_dns_kube(Path(args.kubeconfig), where, args.suffix, limits=limits))
    )


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def _forever(job: Coroutine[Any, Any, None]) -> int:
    """Run a serve-until-cancelled coroutine until SIGINT/SIGTERM; its errors propagate."""
    task = asyncio.ensure_future(job)
    stop = asyncio.ensure_future(until_signalled())
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    for t in (task, stop):
        t.cancel()
    for result in await asyncio.gather(task, stop, return_exceptions=True):
        if isinstance(result, Exception) and not isinstance(result, asyncio.CancelledError):
            raise result
    return 0


# -- demo -----------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from ravenproxy.demo import DemoOptions, run_demo

    options = DemoOptions(
        directory=Path(args.dir) if args.dir else None,
        keep_running=args.keep_running,
        upload_mib=args.upload_mib,
    )
    return run_async(run_demo(options))


# -- parser ---------------------------------------------------------------------------------
def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (flags win)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ravenproxy",
        description="Cloud-edge networking for Kubernetes clusters whose edge nodes sit "
        "behind NAT.",
    )
    parser.add_argument("--version", action="version", version=f"ravenproxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="run PKI, server, agent and a sample target locally and send real requests",
        description="Create a PKI and an inventory, start a server, an agent for an edge node and "
        "a sample HTTP target only the agent may dial, send requests through the tunnel (a "
        "small GET, a streamed response, an upload checked by SHA-256), print a summary.",
    )
    demo.add_argument("--dir", help="where to write certs and the inventory (default: a temp dir)")
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="leave everything up and print curl commands to paste",
    )
    demo.add_argument("--upload-mib", type=int, default=100, help="size of the upload (MiB)")
    demo.add_argument("--log-level", default="WARNING")
    demo.set_defaults(func=cmd_demo)

    certs = sub.add_parser("certs", help="embedded PKI")
    certs_sub = certs.add_subparsers(dest="certs_command", metavar="ACTION", required=True)
    init = certs_sub.add_parser(
        "init",
        help="write a CA, a server certificate and agent certificates (keeps what exists)",
    )
    init.add_argument("--dir", default="certs", help="output directory (default: certs)")
    init.add_argument(
        "--server-san",
        action="append",
        metavar="NAME|IP",
        help="subject alternative name of the server certificate (repeatable; "
        "default: localhost and 127.0.0.1)",
    )
    init.add_argument(
        "--agent",
        action="append",
        metavar="NODE",
        help="write NODE.crt/NODE.key for an agent node (repeatable)",
    )
    init.add_argument("--log-level", default="INFO")
    init.set_defaults(func=cmd_certs_init)

    server = sub.add_parser("server", help="run the cloud proxy server")
    _add_common(server)
    server.add_argument(
        "--inventory", metavar="FILE", help="YAML inventory of Nodes and Gateways (or --kube-model)"
    )
    server.add_argument("--ca-file", metavar="F", help="CA that signs agent certificates")
    server.add_argument("--cert-file", metavar="F", help="server certificate")
    server.add_argument("--key-file", metavar="F", help="server key")
    server.add_argument("--node-name", metavar="NODE", help="node this server runs on (NODE_NAME)")
    server.add_argument("--tunnel-addr", metavar="H:P", help="agent listener (default :10262)")
    server.add_argument("--https-addr", metavar="H:P", help="HTTPS front (default :10263)")
    server.add_argument("--http-addr", metavar="H:P", help="HTTP/CONNECT front (default :10264)")
    server.add_argument(
        "--metrics-addr", metavar="H:P", help="Prometheus metrics (default 127.0.0.1:10266)"
    )
    server.add_argument(
        "--health-addr", metavar="H:P", help="/healthz and /readyz (default :10275)"
    )
    server.add_argument(
        "--open-timeout",
        type=float,
        metavar="S",
        help="seconds a stream open waits for the agent (default 15)",
    )
    server.add_argument(
        "--ping-interval", type=float, metavar="S", help="keepalive interval (default 10)"
    )
    server.add_argument(
        "--dead-after",
        type=float,
        metavar="S",
        help="a silent agent is dead after this (default 30)",
    )
    server.add_argument(
        "--max-stream-window",
        type=int,
        metavar="BYTES",
        help="cap of a stream's auto-tuned receive window (default 8 MiB)",
    )
    server.add_argument(
        "--drain-timeout",
        type=float,
        metavar="S",
        help="how long shutdown waits for open streams (default 10)",
    )
    server.add_argument(
        "--kubelet-ca-file",
        metavar="F",
        help="CA that verifies kubelet certificates when TLS is re-originated (default: the "
        "system store)",
    )
    server.add_argument(
        "--kubelet-cert-file", metavar="F", help="client certificate presented to kubelets"
    )
    server.add_argument("--kubelet-key-file", metavar="F", help="its key")
    server.add_argument(
        "--front-client-ca-file",
        metavar="F",
        help="CA whose client certificates authenticate clients of the HTTPS front; only for "
        "them is --kubelet-cert-file presented (others reach kubelets without a client "
        "certificate)",
    )
    server.add_argument(
        "--kubelet-insecure-skip-verify",
        action="store_true",
        default=None,
        help="do not verify kubelet certificates (logged as a warning)",
    )
    server.add_argument(
        "--max-header-size",
        type=int,
        metavar="BYTES",
        help="largest HTTP request/response head the fronts accept (default 65536)",
    )
    server.add_argument(
        "--dial-timeout",
        type=float,
        metavar="S",
        help="timeout of the server's own dials to targets in its gateway (default 5)",
    )
    server.add_argument(
        "--allow",
        action="append",
        metavar="HOST:PORT",
        help="also let the server dial this in its own gateway (repeatable; port N, N-M or *); "
        "the gateway's kubelet ports and --metrics-port are allowed already",
    )
    server.add_argument(
        "--metrics-port",
        dest="metrics_ports",
        action="append",
        type=int,
        metavar="PORT",
        help="also allow this port on every node of the server's gateway (repeatable)",
    )
    server.add_argument(
        "--header-timeout",
        type=float,
        metavar="S",
        help="longest a request head may take once begun, and the TLS ClientHello and "
        "handshake on the HTTPS front; 408 where HTTP can answer, else closed (default 10)",
    )
    server.add_argument(
        "--max-front-connections",
        type=int,
        metavar="N",
        help="connections open on the HTTP and HTTPS fronts together; beyond it new ones are "
        "closed at once (default 8192, lowered to stay well under the descriptor limit)",
    )
    server.add_argument(
        "--idle-timeout",
        type=float,
        metavar="S",
        help="close a relayed connection (CONNECT, upgraded stream, SNI passthrough, request) "
        "on which no byte moved either way for this long (default 14400: 4 h)",
    )
    server.add_argument(
        "--max-streams-per-client",
        type=int,
        metavar="N",
        help="concurrent streams of one client address; beyond it 429, or closed on SNI "
        "passthrough (default 1000)",
    )
    server.add_argument(
        "--agent-leases",
        action="store_true",
        default=None,
        help="publish a Lease per connected agent in kube-system (the controller's liveness "
        "signal); uses --kubeconfig or the in-cluster service account",
    )
    server.add_argument(
        "--kube-model",
        action="store_true",
        default=None,
        help="read Nodes, Gateways and Pods from the Kubernetes API (list-then-watch) "
        "instead of --inventory",
    )
    server.add_argument(
        "--kubeconfig",
        metavar="F",
        help="API access for --agent-leases and --kube-model (default: in-cluster account)",
    )
    server.set_defaults(func=cmd_server)

    agent = sub.add_parser("agent", help="run the edge agent")
    _add_common(agent)
    agent.add_argument(
        "--node-name",
        metavar="NODE",
        help="this node's name (default: NODE_NAME, else the node --cert-file names); must be "
        "the node in --cert-file, as the server knows the agent by its certificate",
    )
    agent.add_argument("--server-addr", metavar="wss://H:P", help="the server's tunnel address")
    agent.add_argument("--ca-file", metavar="F", help="CA that signs the server certificate")
    agent.add_argument("--cert-file", metavar="F", help="this agent's client certificate")
    agent.add_argument("--key-file", metavar="F", help="this agent's key")
    agent.add_argument(
        "--allow",
        action="append",
        metavar="HOST:PORT",
        help="a target the agent may dial (repeatable; HOST may be an IP, CIDR or "
        "name; PORT N, N-M or *). Added to the inventory-derived default.",
    )
    agent.add_argument(
        "--inventory",
        metavar="FILE",
        help="derive the default allowlist: the InternalIPs of this gateway's "
        "nodes on their kubelet port",
    )
    agent.add_argument(
        "--metrics-port",
        dest="metrics_ports",
        action="append",
        type=int,
        metavar="PORT",
        help="also allow this port on the gateway's nodes",
    )
    agent.add_argument("--metrics-addr", metavar="H:P", help="serve metrics and health here")
    agent.add_argument("--dial-timeout", type=float, metavar="S", help="default 5")
    agent.add_argument("--ping-interval", type=float, metavar="S", help="default 10")
    agent.add_argument("--dead-after", type=float, metavar="S", help="default 30")
    agent.add_argument("--backoff-base", type=float, metavar="S", help="default 0.5")
    agent.add_argument("--backoff-cap", type=float, metavar="S", help="default 30")
    agent.add_argument(
        "--no-server-hostname-check",
        action="store_true",
        default=None,
        help="verify the server's chain but not its name (NAT'd public IP)",
    )
    agent.add_argument(
        "--kube-model",
        action="store_true",
        default=None,
        help="read Nodes and Gateways from the Kubernetes API instead of --inventory",
    )
    agent.add_argument(
        "--kubeconfig", metavar="F", help="API access for --kube-model (default: in-cluster)"
    )
    agent.add_argument(
        "--l3",
        action="store_true",
        default=None,
        help="also run the L3 route driver (as `ravenproxy routes apply`, reconciled on every "
        "inventory change and every 60 s); needs --inventory and root",
    )
    _add_l3_driver_flags(agent)
    agent.set_defaults(func=cmd_agent)
    routes = sub.add_parser(
        "routes",
        help="L3 route driver: plan, apply or clean up this node's data path",
        description="Compute this node's desired L3 state (raven0 vxlan, fwmark routing, "
        "skip-SNAT chain, xfrm policies, rp_filter, VPN connections) from the inventory and "
        "print (plan), apply (apply) the difference to the kernel, or remove everything "
        "ravenproxy owns (cleanup). Exit 3 when some ops could not be applied.",
    )
    routes.add_argument("action", choices=("plan", "apply", "cleanup"))
    _add_l3_flags(routes)
    routes.add_argument("--log-level", default="INFO")
    routes.set_defaults(func=cmd_routes)

    doctor = sub.add_parser(
        "doctor",
        help="find known L3 failures on this node and show the evidence",
        description="Reads this node's data path (iptables, routes, rules, rp_filter, "
        "/proc/net/xfrm_stat, the VPN's SA counters over --interval seconds) and reports each "
        "known failure with its evidence: a MASQUERADE before the skip-SNAT rule, SAs that "
        "send nothing while members send traffic, growing XfrmInNoPols/XfrmOutNoStates, "
        "strict rp_filter on raven0 or the CNI interface, missing routes or policy rules. "
        "Exit 1 when something is found.",
    )
    _add_l3_flags(doctor)
    doctor.add_argument(
        "--interval", type=float, default=2.0, metavar="S", help="sampling window (default 2)"
    )
    doctor.add_argument("--log-level", default="WARNING")
    doctor.set_defaults(func=cmd_doctor)

    controller = sub.add_parser(
        "controller",
        help="elect gateway endpoints, keep the Services and the DNS map",
        description="Against Kubernetes (--kubeconfig, or in-cluster config) it writes Gateway "
        "status, the internal and public Services and the edge-tunnel-nodes ConfigMap, with "
        "leader election. With --inventory it prints, as YAML, the objects it would write, "
        "and again whenever they change. --dry-run prints them once and exits.",
    )
    controller.add_argument("--kubeconfig", metavar="F")
    controller.add_argument("--inventory", metavar="FILE")
    controller.add_argument("--dry-run", action="store_true")
    controller.add_argument(
        "--agent-grace",
        type=float,
        metavar="S",
        help="an edge gateway whose agent no server has reported for this long fails over "
        "(default 30)",
    )
    controller.add_argument(
        "--agents-url",
        action="append",
        metavar="URL",
        help="poll this server's GET /agents (H:P of its health address, or a URL; repeatable) "
        "instead of watching the servers' agent Leases; with --inventory, the only source",
    )
    controller.add_argument("--log-level", default="INFO")
    controller.set_defaults(func=cmd_controller)

    dns = sub.add_parser(
        "dns",
        help="embedded DNS server answering node names from the tunnel DNS map",
        description="Answers A/AAAA for node names (optionally under --suffix) over UDP and "
        "TCP, NXDOMAIN for unknown names; follows inventory changes or the ConfigMap.",
    )
    dns.add_argument("--inventory", metavar="FILE")
    dns.add_argument("--kubeconfig", metavar="F")
    dns.add_argument("--listen", required=True, metavar="H:P")
    dns.add_argument("--suffix", metavar="S", help="also answer NODE.S")
    dns.add_argument(
        "--cluster-ip",
        metavar="IP",
        help="answer this address (the internal Service) for every node",
    )
    # Defaults live in controller.dns.TCPLimits; the help repeats them for the reader.
    dns.add_argument(
        "--tcp-idle-timeout",
        metavar="S",
        help="close a TCP client that takes longer than this for a whole query, the wait for "
        "it included, or to read a reply (default 3)",
    )
    dns.add_argument(
        "--max-tcp-clients",
        metavar="N",
        help="TCP connections served at once; when full, the longest-idle one is closed for a "
        "new client (default 256)",
    )
    dns.add_argument(
        "--max-tcp-clients-per-source",
        metavar="N",
        help="TCP connections from one address (IPv6: one /64); more are closed at once "
        "(default 16)",
    )
    dns.add_argument("--log-level", default="INFO")
    dns.set_defaults(func=cmd_dns)
    return parser


def _add_l3_flags(p: argparse.ArgumentParser) -> None:
    """``routes`` and ``doctor``: the node and inventory, then the driver's own flags."""
    p.add_argument("--inventory", metavar="FILE")
    p.add_argument("--node-name", metavar="NODE", help="this node (NODE_NAME)")
    _add_l3_driver_flags(p)


def _add_l3_driver_flags(p: argparse.ArgumentParser) -> None:
    """Flags of the L3 route driver, shared by ``routes``, ``doctor`` and ``agent --l3``.
    No argparse defaults: what is not given comes from the config file or L3Settings."""
    p.add_argument("--vpn-driver", choices=("strongswan", "wireguard"), help="default strongswan")
    p.add_argument(
        "--cni-interface",
        metavar="IF",
        help="CNI interface whose rp_filter is set to loose (default flannel.1)",
    )
    p.add_argument(
        "--service-cidr",
        metavar="CIDR",
        help="service CIDR: install xfrm policies so IPVS replies are not dropped",
    )
    p.add_argument(
        "--skip-nat-cidr",
        action="append",
        metavar="CIDR",
        help="fix the skip-SNAT set by configuration (repeatable)",
    )
    p.add_argument(
        "--psk-file",
        metavar="F",
        help="IPsec pre-shared key file (an empty or default key is refused)",
    )
    p.add_argument(
        "--vici-socket",
        metavar="PATH",
        help="strongSwan charon's VICI socket (default /var/run/charon.vici)",
    )
    p.add_argument(
        "--wireguard-interface",
        metavar="IF",
        help="WireGuard device on gateway nodes (default raven-wg0)",
    )
    p.add_argument(
        "--wireguard-key-dir",
        metavar="DIR",
        help="where the WireGuard key pair is kept, 0600 (default /var/lib/ravenproxy/wireguard)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logsetup.setup(getattr(args, "log_level", "INFO"))
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except RavenProxyError as exc:
        print(f"ravenproxy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
