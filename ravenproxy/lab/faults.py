"""``lab fault NAME``: inject one of the seed failures, for learning.

- ``skip-snat`` — delete the jump into the skip-SNAT chain on cloud-gw (seed 000): the Flannel
  MASQUERADE rewrites cloud pod sources, the tunnel's selectors miss them;
- ``rp-filter`` — strict reverse-path filtering on raven0 of edge-node;
- ``route`` — delete a policy route (table 9027) on cloud-node: its pods lose the edge;
- ``agent`` — kill the agent on edge-gw: the tunnel (L7) is gone until it restarts.

The L3 faults are injected right after a reconcile pass of the node's route driver (its log
says so),
so they stay visible for one whole ``--reconcile-period``; the next pass repairs them. The
agent's keeper restarts a killed agent after the same period. ``lab status`` shows when.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass

from ravenproxy.errors import LabError
from ravenproxy.l3.settings import L3Settings
from ravenproxy.lab import netns
from ravenproxy.lab import plan as p
from ravenproxy.lab import state as st
from ravenproxy.lab.runtime import driver_name
from ravenproxy.lab.supervisor import Supervisor

FAULTS = p.FAULTS
HOST = {
    "skip-snat": "cloud-gw",
    "rp-filter": "edge-node",
    "route": "cloud-node",
    "agent": "edge-gw",
}
SKIP_SNAT_JUMP = ("-m", "comment", "--comment", "ravenproxy", "-j", "RAVEN-POSTROUTING")
_PASS = re.compile(r"^(\S+ \S+) \S+ \S+: (in sync|reconciled)\b", re.M)


@dataclass(frozen=True)
class Repair:
    at: str  # when, as the log or the keeper saw it
    how: str


def agent_log(sup: Supervisor, host: str) -> str:
    """The log of the host's route driver (``agent --l3`` or ``routes run``)."""
    try:
        return sup.log_file(driver_name(host)).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _after_next_pass(sup: Supervisor, host: str, period: float) -> None:
    """Return right after the node's agent logs its next reconcile pass."""
    start = len(agent_log(sup, host))
    deadline = time.monotonic() + period + 10
    while time.monotonic() < deadline:
        if _PASS.search(agent_log(sup, host)[start:]):
            return
        time.sleep(0.05)
    raise LabError(f"the route driver on {host} logged no pass in {period + 10:g} s")


def inject(plan: p.LabPlan, s: st.LabState, fault: str) -> st.Fault:
    if fault not in FAULTS:
        raise LabError(f"FAULT: {fault!r} is not one of {', '.join(FAULTS)}")
    host = HOST[fault]
    ns = plan.namespace(host)
    sup = Supervisor(s.dir)
    if fault == "agent":
        pid = sup.child_pid(f"agent-{host}")
        if pid is None:
            raise LabError(f"the agent on {host} is not running (restarting?): try again")
        os.kill(pid, signal.SIGKILL)
        evidence = f"killed the agent on {host} (pid {pid}, SIGKILL)"
        return st.Fault(fault, host, time.time(), evidence)
    _after_next_pass(sup, host, s.reconcile_period)
    offset = len(agent_log(sup, host).encode())
    if fault == "skip-snat":
        netns.run(["iptables", "-t", "nat", "-D", "POSTROUTING", *SKIP_SNAT_JUMP], netns=ns)
        evidence = (
            f"deleted `iptables -t nat -A POSTROUTING {' '.join(SKIP_SNAT_JUMP)}` on {host}: "
            "the Flannel MASQUERADE now rewrites pod sources bound for the tunnel"
        )
    elif fault == "rp-filter":
        netns.run(["sysctl", "-qw", "net.ipv4.conf.raven0.rp_filter=1"], netns=ns)
        evidence = f"set net.ipv4.conf.raven0.rp_filter=1 (strict) on {host}"
    else:
        table = str(L3Settings().route_table)
        routes = netns.run(["ip", "route", "show", "table", table], netns=ns).splitlines()
        if not routes:
            raise LabError(f"{host} has no route in table {table} to delete")
        route = routes[0].split()
        netns.run(["ip", "route", "del", *route, "table", table], netns=ns)
        evidence = f"deleted `{' '.join(route)}` from table {table} on {host}"
    return st.Fault(fault, host, time.time(), evidence, offset)


def repaired(s: st.LabState, fault: st.Fault) -> Repair | None:
    """When the fault was repaired: the agent's first ``reconciled`` pass after it, or the
    keeper's restart of the killed agent; None while it is not."""
    sup = Supervisor(s.dir)
    if fault.name == "agent":
        later = [t for t in sup.restarts(f"agent-{fault.host}") if t > fault.injected_at]
        if not later:
            return None
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(later[0]))
        return Repair(when, "the keeper restarted the agent")
    text = agent_log(sup, fault.host).encode()[fault.log_offset :].decode(errors="replace")
    for m in _PASS.finditer(text):
        if m.group(2) == "reconciled":
            return Repair(m.group(1), "the route driver's next reconcile pass put it back")
    return None
