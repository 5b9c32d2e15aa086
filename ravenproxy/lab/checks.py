"""``lab check``: the checks a person would do, each a row with its command, evidence and
verdict. Every row runs a real client inside a lab host (curl, the exec probe, a UDP datagram
from a pod address, ``ravenproxy doctor``); the probe rows run side by side, then the doctors of
every node side by side (a doctor's traffic counters must not see the probes' own traffic).
"""

from __future__ import annotations

import asyncio
import io
import shlex
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ravenproxy.errors import RavenProxyError
from ravenproxy.l3.doctor import doctor_command
from ravenproxy.lab import plan as p
from ravenproxy.lab import runtime
from ravenproxy.lab import state as st

TIMEOUT = 4
#: How long the logs -f row follows the stream (the stand-in writes a line every 50 ms).
FOLLOW = 2


@dataclass(frozen=True)
class Row:
    name: str
    host: str
    command: str
    evidence: str
    ok: bool


def _run(plan: p.LabPlan, host: str, argv: list[str], timeout: float = 60) -> tuple[int, str, str]:
    full = ["ip", "netns", "exec", plan.namespace(host), *argv]
    try:
        done = subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer within {timeout:g} s"
    return done.returncode, done.stdout, done.stderr


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def rows(plan: p.LabPlan, s: st.LabState) -> list[Row]:
    ca = str(s.dir / "certs" / "ca.crt")
    server = p.SERVER_IP
    front = f"http://{server}:{p.HTTP_PORT}"
    kubelet = f"edge-node:{p.KUBELET_PORT}"
    passthrough = ["--cacert", ca, "--connect-to", f"{kubelet}:{server}:{p.HTTPS_PORT}"]
    exporter = f"edge-node:{p.EXPORTER_PORT}"

    def curl(name: str, args: list[str], judge: Callable[[int, str, str], tuple[bool, str]]) -> Row:
        argv = ["curl", "-sS", "--max-time", str(TIMEOUT), *args]
        code, out, err = _run(plan, "cloud-node", argv)
        ok, evidence = judge(code, out, err)
        return Row(name, "cloud-node", shlex.join(argv), evidence, ok)

    def sni() -> Row:
        def judge(code: int, out: str, err: str) -> tuple[bool, str]:
            subject = next((ln.split("subject:")[1].strip() for ln in err.splitlines()
                            if "subject:" in ln), "?")  # fmt: skip
            ok = code == 0 and out.strip() == "ok" and "CN=edge-node" in subject
            return ok, f"{out.strip() or _short(err[-200:])!r}, TLS peer {subject} (end to end)"

        return curl("kubelet via the HTTPS front (SNI passthrough)",
                    ["-v", *passthrough, f"https://{kubelet}/healthz"], judge)  # fmt: skip

    def http_front() -> Row:
        def judge(code: int, out: str, err: str) -> tuple[bool, str]:
            return code == 0 and out.strip() == "ok", _short(out or err) or f"exit {code}"

        return curl("kubelet via the HTTP front", ["-x", front, f"http://{kubelet}/healthz"], judge)

    def logs() -> Row:
        def judge(code: int, out: str, err: str) -> tuple[bool, str]:
            lines = out.splitlines()
            # curl ends with 28 (its --max-time): the stream never ends by itself.
            return len(lines) >= 10, f"{len(lines)} lines in {FOLLOW} s" + (
                f", last {lines[-1]!r}" if lines else f": {_short(err)}"
            )

        url = f"https://{kubelet}/containerLogs/default/edge-exporter/exporter?follow=true"
        argv = ["-N", "--max-time", str(FOLLOW), *passthrough, url]  # the last --max-time wins
        return curl("logs -f lines arriving", argv, judge)

    def exec_() -> Row:
        url = (
            f"wss://{server}:{p.HTTPS_PORT}/exec/default/edge-exporter/exporter"
            "?command=cat&stdin=true&stdout=true"
        )
        argv = [sys.executable, "-m", "ravenproxy.lab.probe", "exec", url, "--host", kubelet,
                "--ca", ca, "--text", "hello lab\n"]  # fmt: skip
        code, out, err = _run(plan, "cloud-node", argv)
        evidence = f"echoed {out!r}" if code == 0 else _short(out + err) or f"exit {code}"
        return Row("exec echo (WebSocket, HTTPS front)", "cloud-node", shlex.join(argv),
                   evidence, code == 0)  # fmt: skip

    def scrape(name: str, args: list[str]) -> Row:
        def judge(code: int, out: str, err: str) -> tuple[bool, str]:
            line = next((ln for ln in out.splitlines() if ln.startswith("lab_exporter_up")), "")
            return code == 0 and line.endswith(" 1"), line or _short(out or err) or f"exit {code}"

        return curl(name, args, judge)

    def pods(src: str, dst: str) -> Row:
        seen = runtime.pod_echo(plan, src, dst, timeout=1.0, tries=2)
        want = runtime.pod_ip(src)
        host = next(x.node for x in p.PODS if x.name == src)
        verdict = "intact" if seen == want else "REWRITTEN" if seen != "timeout" else "lost"
        evidence = f"{dst} saw source {seen} (sent from {want}: {verdict})"
        command = f"python -m ravenproxy.lab.echo send {want} {runtime.pod_ip(dst)} {p.ECHO_PORT}"
        return Row(f"pod → pod {src} → {dst}", host, command, evidence, seen == want)

    async def doctor(node: str) -> Row:
        # In this process, one task per node (the real doctor, reading each namespace): four
        # interpreters starting at once are what makes a check slow on a busy machine.
        out = io.StringIO()
        try:
            code = await doctor_command(
                str(s.dir / "inventory.yaml"),
                node,
                runtime.l3_settings(plan, s, node),
                interval=1.0,
                netns=plan.namespace(node),
                out=out,
            )
        except RavenProxyError as exc:
            code, out = 2, io.StringIO(str(exc))
        found = [ln for ln in out.getvalue().splitlines() if ln.strip()]
        evidence = "clean" if code == 0 else _short(" | ".join(found), 400)
        shown = f"ravenproxy doctor --node-name {node} --interval 1 (+ the node's L3 flags)"
        return Row(f"doctor on {node}", node, shown, evidence, code == 0)

    async def doctors() -> list[Row]:
        return list(await asyncio.gather(*(doctor(n.name) for n in p.NODES)))

    jobs: list[Callable[[], Row]] = [
        sni,
        http_front,
        logs,
        exec_,
        lambda: scrape("exporter by node name (Host)",
                       ["-H", f"Host: {exporter}", f"{front}/metrics"]),
        lambda: scrape("exporter by proxy_url", ["-x", front, f"http://{exporter}/metrics"]),
        lambda: pods("cloud-echo", "edge-echo"),
        lambda: pods("edge-echo", "cloud-echo"),
    ]  # fmt: skip
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        rows = list(pool.map(lambda job: job(), jobs))
    # The doctors run after the probes, not beside them: a gateway's doctor reads "members send
    # traffic for remote domains" off raven0's receive counter, and the probes' own traffic
    # between the agent on edge-gw and the exporter pod on edge-node crosses raven0 without
    # being for a remote domain (an SA idle meanwhile was reported as sa-idle: a false alarm).
    return rows + asyncio.run(doctors())


def render(result: list[Row]) -> str:
    lines = []
    for r in result:
        lines.append(f"{'PASS' if r.ok else 'FAIL'}  {r.name}  [{r.host}]")
        lines.append(f"      evidence: {r.evidence}")
        lines.append(f"      command:  {r.command}")
    passed = sum(r.ok for r in result)
    lines.append(f"{passed}/{len(result)} checks pass")
    return "\n".join(lines) + "\n"
