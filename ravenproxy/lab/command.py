"""The CLI adapter of ``ravenproxy lab up|status|exec|check|fault|down``: parses, calls
:mod:`.runtime`, :mod:`.checks` and :mod:`.faults`, prints. Every action takes ``--name NAME``
after the action (default ``lab``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ravenproxy.lab import plan as p
from ravenproxy.lab import state as st
from ravenproxy.lab.supervisor import Supervisor


def _say(text: str) -> None:
    print(text, flush=True)


def next_steps(s: st.LabState) -> list[str]:
    name = "" if s.name == p.DEFAULT_NAME else f" --name {s.name}"
    ca = s.dir / "certs" / "ca.crt"
    # sudo drops PATH: name the console script of this interpreter's environment.
    script = Path(sys.executable).parent / "ravenproxy"
    lab = f"sudo {script if script.exists() else 'ravenproxy'} lab"
    front = f"http://{p.SERVER_IP}:{p.HTTP_PORT}"
    return [
        f"{lab} status{name}                      # hosts, pods, processes, tunnel, L3",
        f"{lab} check{name}                       # every check with its evidence",
        f"{lab} exec{name} cloud-node -- curl -s --cacert {ca} "
        f"--connect-to edge-node:10250:{p.SERVER_IP}:{p.HTTPS_PORT} https://edge-node:10250/healthz",
        f"{lab} exec{name} cloud-node -- curl -s -x {front} http://edge-node:9400/metrics",
        f"{lab} exec{name} edge-node -- getent hosts cloud-node     # the lab's DNS",
        f"{lab} fault{name} skip-snat && {lab} check{name}   # seed 000, see docs/lab.md",
        f"{lab} down{name}",
    ]


def cmd_up(args: argparse.Namespace) -> int:
    from ravenproxy.lab import runtime

    options = runtime.UpOptions(
        name=args.name,
        vpn_driver=args.vpn_driver,
        directory=Path(args.dir) if args.dir else None,
        reconcile_period=args.reconcile_period,
    )
    s = runtime.up(options, _say)
    print(f"files and logs: {s.dir} (logs in {s.dir / 'run'})")
    print("Try:")
    for line in next_steps(s):
        print(f"  {line}")
    return 0


def status_data(plan: p.LabPlan, s: st.LabState) -> dict[str, Any]:
    from ravenproxy.lab import faults, runtime

    sup = Supervisor(s.dir)
    procs = {}
    for proc in runtime.processes(plan, s):
        keeper, child = sup.keeper_pid(proc.name), sup.child_pid(proc.name)
        restarts = sup.restarts(proc.name)
        procs[proc.name] = {
            "host": proc.host,
            "pid": child,
            "keeper_pid": keeper,
            "state": "running" if child else "restarting" if keeper else "stopped",
            "restarts": len(restarts),
            "last_restart": _utc(restarts[-1]) if restarts else None,
        }
    fault_rows = []
    for f in s.faults:
        fixed = faults.repaired(s, f)
        fault_rows.append(
            {
                "fault": f.name,
                "host": f.host,
                "injected_at": _utc(f.injected_at),
                "evidence": f.evidence,
                "repaired_at": fixed.at if fixed else None,
                "repaired_by": fixed.how if fixed else None,
            }
        )
    return {
        "name": s.name,
        "directory": str(s.dir),
        "vpn_driver": s.vpn_driver,
        "reconcile_period": s.reconcile_period,
        "hosts": {
            h: {"namespace": plan.namespace(h), "addresses": plan.addresses(h)} for h in p.HOSTS
        },
        "pods": {x.name: {"node": x.node, "ip": x.ip, "port": x.port} for x in p.PODS},
        "server": {
            "tunnel": f"{p.SERVER_IP}:{p.TUNNEL_PORT}",
            "http": f"{p.SERVER_IP}:{p.HTTP_PORT}",
            "https": f"{p.SERVER_IP}:{p.HTTPS_PORT}",
        },
        "dns": f"{p.SERVER_IP}:{p.DNS_PORT}",
        "processes": procs,
        "tunnel": {"edge-gw": "connected" if runtime.agent_connected(plan, "edge-gw") else "down"},
        "l3": {
            f"{a} → {b}": runtime.pod_echo(plan, a, b)
            for a, b in (("cloud-echo", "edge-echo"), ("edge-echo", "cloud-echo"))
        },
        "faults": fault_rows,
    }


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def cmd_status(args: argparse.Namespace) -> int:
    from ravenproxy.lab import runtime

    plan, s = runtime.loaded(args.name)
    data = status_data(plan, s)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"lab {s.name} ({s.vpn_driver}, reconcile every {s.reconcile_period:g} s), {s.dir}")
    print("hosts:")
    for h, v in data["hosts"].items():
        print(f"  {h:<11} {v['namespace']:<22} {', '.join(v['addresses'])}")
    print("pods:")
    for name, v in data["pods"].items():
        print(f"  {name:<14} on {v['node']:<10} {v['ip']}:{v['port']}")
    srv = data["server"]
    print(f"server: tunnel {srv['tunnel']}, HTTP {srv['http']}, HTTPS {srv['https']}; "
          f"dns {data['dns']}")  # fmt: skip
    print("processes:")
    for name, v in data["processes"].items():
        again = f", {v['restarts']} restart(s), last {v['last_restart']}" if v["restarts"] else ""
        print(f"  {name:<24} {v['host']:<10} {v['state']:<10} pid {v['pid']}{again}")
    print(f"tunnel: edge-gw {data['tunnel']['edge-gw']}")
    for path, seen in data["l3"].items():
        print(f"L3: {path}: the far pod saw {seen}")
    for f in data["faults"]:
        fixed = (
            f"repaired at {f['repaired_at']} ({f['repaired_by']})"
            if f["repaired_at"]
            else "NOT repaired yet"
        )
        print(f"fault {f['fault']} on {f['host']} at {f['injected_at']}: {fixed}")
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    from ravenproxy.lab import runtime

    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    return runtime.exec_(args.name, args.host, argv)


def cmd_check(args: argparse.Namespace) -> int:
    # The doctor (netlink, the L3 drivers) is loaded here, not when the CLI parser is built:
    # every ravenproxy command builds it, and an agent must not carry pyroute2 for it.
    from ravenproxy.lab import checks, runtime

    plan, s = runtime.loaded(args.name)
    result = checks.rows(plan, s)
    print(checks.render(result), end="")
    return 0 if all(r.ok for r in result) else 1


def cmd_fault(args: argparse.Namespace) -> int:
    from ravenproxy.lab import faults, runtime

    plan, s = runtime.loaded(args.name)
    fault = faults.inject(plan, s, args.fault)
    s.faults.append(fault)
    st.save(s)
    print(f"fault {fault.name}: {fault.evidence}")
    name = "" if s.name == p.DEFAULT_NAME else f" --name {s.name}"
    print(f"see it: sudo ravenproxy lab check{name}; repaired within {s.reconcile_period:g} s "
          f"(sudo ravenproxy lab status{name} shows when)")  # fmt: skip
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from ravenproxy.lab import runtime

    removed = runtime.down(args.name)
    if not removed:
        print(f"lab {args.name!r}: nothing to remove")
    for item in removed:
        print(f"removed {item}")
    return 0


def _name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--name", default=p.DEFAULT_NAME, help=f"the lab's name (default {p.DEFAULT_NAME})"
    )
    parser.add_argument("--log-level", default="WARNING", help=argparse.SUPPRESS)


def add_parser(sub: Any) -> None:
    lab = sub.add_parser(
        "lab",
        help="a cloud and a NAT'd edge on this machine (root): up, status, exec, check, "
        "fault, down",
        description="Five network namespaces NAME-cloud-node, NAME-cloud-gw, NAME-nat-router, "
        "NAME-edge-gw, NAME-edge-node with the server, DNS, agents with the L3 driver, the VPN "
        "daemons, kubelet stand-ins and an edge exporter as real processes. Needs root. "
        "See docs/lab.md.",
    )
    actions = lab.add_subparsers(dest="lab_command", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="build the lab and start its processes (< 15 s)")
    _name(up)
    up.add_argument("--vpn-driver", choices=("strongswan", "wireguard"), default="strongswan",
                    help="VPN between the gateways (default strongswan)")  # fmt: skip
    up.add_argument(
        "--dir",
        help="where the PKI, inventory, PID files and logs go; must be new or empty, removed "
        "by lab down (default /var/lib/ravenproxy-lab/NAME)",
    )
    up.add_argument(
        "--reconcile-period",
        type=float,
        default=p.DEFAULT_PERIOD,
        metavar="S",
        help="the agents' --reconcile-period and the keeper's restart delay: how soon a fault "
        f"is repaired (default {p.DEFAULT_PERIOD:g})",
    )
    up.set_defaults(func=cmd_up)
    status = actions.add_parser("status", help="hosts, addresses, pods, processes, tunnel, L3")
    _name(status)
    status.add_argument("--json", action="store_true", help="as JSON")
    status.set_defaults(func=cmd_status)
    exec_ = actions.add_parser("exec", help="run a command in a lab host; its exit status")
    _name(exec_)
    exec_.add_argument("host", metavar="HOST", help=", ".join(p.HOSTS))
    exec_.add_argument("argv", metavar="-- CMD ...", nargs=argparse.REMAINDER)
    exec_.set_defaults(func=cmd_exec)
    check = actions.add_parser("check", help="every check with its evidence; exit 0 iff all pass")
    _name(check)
    check.set_defaults(func=cmd_check)
    fault = actions.add_parser("fault", help="inject a seed failure: " + ", ".join(p.FAULTS))
    _name(fault)
    fault.add_argument("fault", metavar="FAULT", choices=p.FAULTS,
                       help=", ".join(p.FAULTS))  # fmt: skip
    fault.set_defaults(func=cmd_fault)
    down = actions.add_parser("down", help="remove everything of the lab (idempotent)")
    _name(down)
    down.set_defaults(func=cmd_down)
