"""``ravenproxy``: one console script, one subcommand per job (see README "Command line")."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ravenproxy import __version__, flags
from ravenproxy import config as cfg
from ravenproxy import log as logsetup
from ravenproxy.errors import ConfigError
from ravenproxy.lifecycle import (
    check_listen,
    run_async,
    serve_until_signalled,
    settled,
    typed_error,
    until_signalled,
)
from ravenproxy.log import kv

log = logging.getLogger("ravenproxy")


# -- start-up -------------------------------------------------------------------------------
def starting(
    command: str, cls: type, settings: object, *, listen: bool = True, udp: tuple[str, ...] = ()
) -> None:
    """Before any part starts: each listen address of ``settings`` resolves and is free (else
    one line naming its flag, exit 2), then one log line with the version and the effective
    settings (paths of keys and PSK files, never their contents: no setting holds a secret).
    ``listen=False``: the command serves nothing (the controller's ``--inventory``); ``udp``:
    flags that bind UDP as well as TCP."""
    values: dict[str, object] = {}
    for o in flags.options(cls):
        value: Any = settings
        for name in o.path:
            value = getattr(value, name, None)
        if value is None:
            continue
        if o.kind == "address" and listen:
            if o.flag in udp:  # bound first, as the DNS server does
                check_listen(o.flag, value, udp=True)
            check_listen(o.flag, value)
        if shown := _shown(value):
            values.setdefault(o.path[-1], shown)
    log.info(f"ravenproxy {command} starting", extra=kv(version=__version__, **values))


if TYPE_CHECKING:
    import argparse

    from ravenproxy.server.settings import ServerSettings


def _shown(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


# -- server ---------------------------------------------------------------------------------
def cmd_server(args: argparse.Namespace) -> int:
    from ravenproxy.server.settings import ServerSettings

    settings = ServerSettings.from_mapping(flags.gather(args, ServerSettings))
    starting("server", ServerSettings, settings)
    return run_async(_server_main(settings))


async def _server_main(settings: ServerSettings) -> int:
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
        settled()
        try:
            await until_signalled()
        finally:
            await server.stop()
    return 0


# -- agent ----------------------------------------------------------------------------------
def cmd_agent(args: argparse.Namespace) -> int:
    from ravenproxy.agent.app import Agent
    from ravenproxy.agent.settings import AgentSettings

    settings = AgentSettings.from_mapping(flags.gather(args, AgentSettings))
    starting("agent", AgentSettings, settings)
    settled()
    # uvloop cannot open the netlink sockets the L3 driver needs.
    return run_async(serve_until_signalled(Agent(settings).run()), fast_loop=settings.l3 is None)


# -- routes and doctor (L3) -----------------------------------------------------------------
def _node(values: dict[str, Any]) -> tuple[str | None, str | None]:
    """The inventory and this node (``--node-name``, else ``NODE_NAME``)."""
    return values.get("inventory"), values.get("node_name") or cfg.env_node_name()


def cmd_routes(args: argparse.Namespace) -> int:
    from ravenproxy.l3.driver import routes_command
    from ravenproxy.l3.settings import NodeSettings, settings_from

    values = flags.gather(args, NodeSettings)
    inventory, node = _node(values)
    if args.action != "cleanup":
        if not inventory:
            raise ConfigError("--inventory", "is required for plan and apply")
        if not node:
            raise ConfigError("--node-name", "is required (or set NODE_NAME)")
    settings = settings_from(values)
    if args.action == "run":
        from ravenproxy.l3.driver import run_routes

        job = run_routes(inventory or "", node or "", settings)
        return run_async(serve_until_signalled(job), fast_loop=False)
    return run_async(
        routes_command(args.action, inventory or "", node or "", settings), fast_loop=False
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from ravenproxy.l3.doctor import doctor_command
    from ravenproxy.l3.settings import DoctorSettings, settings_from

    values = flags.gather(args, DoctorSettings)
    inventory, node = _node(values)
    if not inventory:
        raise ConfigError("--inventory", "is required")
    if not node:
        raise ConfigError("--node-name", "is required (or set NODE_NAME)")
    interval = flags.read(DoctorSettings, values)["interval"]
    return run_async(
        doctor_command(inventory, node, settings_from(values), interval=interval),
        fast_loop=False,
    )


# -- controller and dns ---------------------------------------------------------------------
def cmd_controller(args: argparse.Namespace) -> int:
    from ravenproxy.controller import agents, dryrun, runtime
    from ravenproxy.controller.settings import ControllerCommand

    cmd = ControllerCommand.from_mapping(flags.gather(args, ControllerCommand))
    if not cmd.dry_run:
        starting("controller", ControllerCommand, cmd, listen=not cmd.inventory)
    urls = tuple(agents.agents_url(u) for u in cmd.agents_urls)
    settings = runtime.ControllerSettings(
        agent_grace=cmd.agent_grace,
        agents_urls=urls,
        certificates=cmd.issuing,
        metrics_addr=cmd.metrics_addr,
        health_addr=cmd.health_addr,
        lease_duration=cmd.lease_duration,
        renew_deadline=cmd.renew_deadline,
        retry_period=cmd.retry_period,
    )
    if cmd.inventory:
        if cmd.dry_run:
            inventory = cmd.inventory

            async def show_inventory() -> int:
                print(await dryrun.dry_run_inventory(inventory), end="")
                return 0

            return run_async(show_inventory())
        return run_async(
            serve_until_signalled(
                dryrun.run_inventory_controller(
                    cmd.inventory, _write, agents_urls=urls, agent_grace=settings.agent_grace
                )
            )
        )
    kubeconfig = Path(cmd.kubeconfig) if cmd.kubeconfig else None
    if cmd.dry_run:

        async def show() -> int:
            print(await runtime.dry_run_kube(kubeconfig), end="")
            return 0

        return run_async(show())
    return run_async(serve_until_signalled(runtime.run_controller(kubeconfig, settings)))


def cmd_dns(args: argparse.Namespace) -> int:
    from ravenproxy.controller import dnsfeed
    from ravenproxy.controller.settings import DnsCommand

    cmd = DnsCommand.from_mapping(flags.gather(args, DnsCommand))
    starting("dns", DnsCommand, cmd, udp=("--listen",))
    if cmd.inventory:
        job = dnsfeed.run_dns(
            Path(cmd.inventory),
            cmd.where,
            cmd.suffix,
            cluster_ip=cmd.cluster_ip,
            limits=cmd.limits,
        )
    else:
        job = dnsfeed.run_dns_kube(
            Path(cmd.kubeconfig or ""), cmd.where, cmd.suffix, limits=cmd.limits
        )
    return run_async(serve_until_signalled(_naming_listen(job)))


async def _naming_listen(job: Coroutine[Any, Any, None]) -> None:
    """A DNS server that cannot bind is an error of ``--listen``."""
    from ravenproxy.controller.dns import DNSServerError

    try:
        await job
    except DNSServerError as exc:
        raise ConfigError("--listen", str(exc)) from None


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# -- demo -----------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from ravenproxy.demo import DemoOptions, run_demo

    options = DemoOptions(
        directory=Path(args.dir) if args.dir else None,
        keep_running=args.keep_running,
        upload_mib=args.upload_mib,
        http_addr=cfg.parse_address(args.http_addr, "--http-addr"),
        metrics_addr=cfg.parse_address(args.metrics_addr, "--metrics-addr"),
        target_port=cfg.port_list([args.target_port], "--target-port")[0],
    )
    return run_async(run_demo(options))


# -- parser ---------------------------------------------------------------------------------
COMMON: dict[str, tuple[str, str | None]] = {
    "--config": ("config", None),
    "--log-level": ("log_level", "INFO"),
}
"""The flags most commands take besides their settings': each one's dest and default."""


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML file of settings (flags win)")
    logsetup.add_level_flag(p, str(COMMON["--log-level"][1]))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser. With ``command`` (a command's name) only that command is built: a
    process imports the settings of the command it runs and no other (``ravenproxy agent``
    loads neither the server's, the controller's nor the lab's)."""
    from ravenproxy.cli_parser import Parser  # not for an agent's plain command line

    parser = Parser(
        prog="ravenproxy",
        description="Cloud-edge networking for Kubernetes clusters whose edge nodes sit "
        "behind NAT.",
    )
    parser.add_argument("--version", action="version", version=f"ravenproxy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, add in COMMANDS.items():
        if command is None or command == name:
            add(sub)
    return parser


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="run PKI, server, agent and a sample target locally and send real requests",
        description="Create a PKI and an inventory, start a server, an agent for an edge node and "
        "a sample HTTP target only the agent may dial, send requests through the tunnel (a "
        "small GET, a streamed response, an upload checked by SHA-256), print a summary.",
    )
    demo.add_argument(
        "--dir",
        help="where to write certs and the inventory, kept afterwards (default: a temporary "
        "directory, removed when the demo ends)",
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="leave everything up and print curl commands to paste (the README's Quick start "
        "shows them); Ctrl-C stops it and removes the temporary directory",
    )
    demo.add_argument(
        "--upload-mib", type=int, default=100, help="size of the upload (MiB) (default 100)"
    )
    demo.add_argument(
        "--http-addr",
        default="127.0.0.1:10264",
        metavar="H:P",
        help="the server's HTTP front, the proxy of the curl commands (default 127.0.0.1:10264)",
    )
    demo.add_argument(
        "--metrics-addr",
        default="127.0.0.1:10266",
        metavar="H:P",
        help="the server's /metrics (default 127.0.0.1:10266)",
    )
    demo.add_argument(
        "--target-port",
        default="9100",
        metavar="PORT",
        help="the sample target's port on edge-1 (127.0.0.1) (default 9100)",
    )
    logsetup.add_level_flag(demo, "WARNING")
    demo.set_defaults(func=cmd_demo)


def _add_certs(sub: Any) -> None:
    from ravenproxy.pki.command import add_parser

    add_parser(sub)


def _add_server(sub: Any) -> None:
    from ravenproxy.server.settings import ServerSettings

    server = sub.add_parser("server", help="run the cloud proxy server")
    _add_common(server)
    flags.add_flags(server, ServerSettings)
    server.set_defaults(func=cmd_server)


def _add_agent(sub: Any) -> None:
    from ravenproxy.agent.settings import AgentSettings

    agent = sub.add_parser("agent", help="run the edge agent")
    _add_common(agent)
    flags.add_flags(agent, AgentSettings)
    agent.set_defaults(func=cmd_agent)


def _add_routes(sub: Any) -> None:
    from ravenproxy.l3.settings import NodeSettings

    routes = sub.add_parser(
        "routes",
        help="L3 route driver: plan, apply, keep applying or clean up this node's data path",
        description="Compute this node's desired L3 state (raven0 vxlan, fwmark routing, "
        "skip-SNAT chain, xfrm policies, rp_filter, VPN connections) from the inventory and "
        "print (plan), apply (apply) the difference to the kernel, keep applying it on every "
        "inventory change and every --reconcile-period until stopped (run: the driver of a "
        "node without an agent), or remove everything ravenproxy owns (cleanup). Exit 3 when "
        "some ops could not be applied.",
    )
    routes.add_argument("action", choices=("plan", "apply", "run", "cleanup"))
    _add_common(routes)
    flags.add_flags(routes, NodeSettings)
    routes.set_defaults(func=cmd_routes)


def _add_doctor(sub: Any) -> None:
    from ravenproxy.l3.settings import DoctorSettings

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
    flags.add_flags(doctor, DoctorSettings)
    doctor.add_argument("--config", metavar="FILE", help="YAML file of settings (flags win)")
    logsetup.add_level_flag(doctor, "WARNING")
    doctor.set_defaults(func=cmd_doctor)


def _add_controller(sub: Any) -> None:
    from ravenproxy.controller.settings import ControllerCommand

    controller = sub.add_parser(
        "controller",
        help="elect gateway endpoints, keep the Services and the DNS map, sign certificates",
        description="Against Kubernetes (--kubeconfig, or in-cluster config) it writes Gateway "
        "status, the internal and public Services and the edge-tunnel-nodes ConfigMap, and "
        "approves and signs the agents' and servers' certificate signing requests bound to "
        "their node (CA in Secret kube-system/ravenproxy-ca), with leader election. "
        "With --inventory it prints, as YAML, the objects it would write, "
        "and again whenever they change. --dry-run prints them once and exits.",
    )
    _add_common(controller)
    flags.add_flags(controller, ControllerCommand)
    controller.set_defaults(func=cmd_controller)


def _add_dns(sub: Any) -> None:
    from ravenproxy.controller.settings import DnsCommand

    dns = sub.add_parser(
        "dns",
        help="embedded DNS server answering node names from the tunnel DNS map",
        description="Answers A/AAAA for node names (optionally under --suffix) over UDP and "
        "TCP, NXDOMAIN for unknown names; follows inventory changes or the ConfigMap.",
    )
    _add_common(dns)
    flags.add_flags(dns, DnsCommand)
    dns.set_defaults(func=cmd_dns)


def _add_lab(sub: Any) -> None:
    from ravenproxy.lab.command import add_parser

    add_parser(sub)


COMMANDS: dict[str, Callable[[Any], None]] = {
    "demo": _add_demo,
    "certs": _add_certs,
    "server": _add_server,
    "agent": _add_agent,
    "routes": _add_routes,
    "doctor": _add_doctor,
    "controller": _add_controller,
    "dns": _add_dns,
    "lab": _add_lab,
}
"""Each command and what adds its parser, in the order ``--help`` lists them."""


def _plain_agent_args(argv: Sequence[str]) -> Any:
    """``ravenproxy agent`` written plainly (:func:`ravenproxy.flags.plain_values`): the
    arguments argparse would give, read without argparse, which an agent then never imports
    (issue 15: an idle agent's memory). None: argparse reads them (help, errors)."""
    from ravenproxy.agent.settings import AgentSettings

    values = flags.plain_values(argv[1:], AgentSettings, COMMON)
    return None if values is None else SimpleNamespace(command="agent", func=cmd_agent, **values)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # `ravenproxy COMMAND ...` builds that command's parser only; anything else (no command,
    # --help, --version, a misspelt command) gets the whole CLI and its message.
    command = argv[0] if argv and argv[0] in COMMANDS else None
    if command == "agent":
        # Before the agent's imports (and argparse's): modules its libraries import and it
        # never uses are deferred (issue 15: an idle agent's memory).
        from ravenproxy.agent.deferred import defer_unused

        defer_unused()
    # The parser is let go once it has read the arguments (the command runs for the process's
    # life, this frame with it).
    args = _plain_agent_args(argv) if command == "agent" else None
    if args is None:
        args = build_parser(command).parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        logsetup.setup(getattr(args, "log_level", "INFO"))
        return func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        # Our own errors (also a group of them, from parts started together) are one line.
        typed = typed_error(exc)
        if typed is None:
            raise
        sub = getattr(args, "certs_command", None) or getattr(args, "lab_command", None)
        command = " ".join(filter(None, (args.command, sub)))
        print(f"ravenproxy {command}: error: {typed}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
