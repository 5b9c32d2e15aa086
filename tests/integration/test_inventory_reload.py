"""Inventory reload against real ``ravenproxy server`` and ``ravenproxy dns`` processes.

Each bad edit (non-UTF-8 bytes, 10 000-deep nesting, an alias bomb, an over-size file) must be
refused with a one-line log naming the file and the reason, while the process keeps serving the
last good model; a later good edit must still be loaded. A bad file at start-up is a one-line
error exit. Every bad edit below also adds node ``edge-9``, so a wrongly accepted edit would show
as a change in routing (404 unknown node → 503 no agent) or in DNS (NXDOMAIN → an address).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import dns.asyncquery
import dns.message
import dns.rcode
import pytest

from ravenproxy.client import ConnectRefused
from ravenproxy.model.inventory import MAX_INVENTORY_BYTES
from tests.helpers import free_port
from tests.integration.cluster import INVENTORY, Cluster, Proc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

EDGE_9 = """\
---
apiVersion: v1
kind: Node
metadata: {name: edge-9}
status:
  addresses: [{type: InternalIP, address: 127.0.0.9}]
  conditions: [{type: Ready, status: "True"}]
"""


def alias_bomb() -> str:
    """Nine levels of nine aliases: ~400 bytes that expand to 9**9 scalars."""
    lines = ["---", "kind: Node", "anchors:", '  a: &a ["lol"' + ',"lol"' * 8 + "]"]
    prev = "a"
    for name in "bcdefghi":
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
        prev = name
    lines += ["metadata:", "  name: edge-10", "  labels: {x: *i}"]
    return "\n".join(lines) + "\n"


def oversize() -> bytes:
    """A valid inventory that adds edge-9, padded with comments past the size limit."""
    line = b"# " + b"x" * 1021 + b"\n"
    pad = line * (MAX_INVENTORY_BYTES // len(line) + 1)
    return (INVENTORY + EDGE_9).encode() + pad


# name → (bytes of the whole file, a fragment of the logged reason)
BAD_EDITS: dict[str, tuple[bytes, str]] = {
    "non-utf8": ((INVENTORY + EDGE_9 + "# caf").encode() + b"\xe9\n", "not UTF-8"),
    "deep": (
        (INVENTORY + EDGE_9 + "spec: {x: " + "[" * 10000 + "]" * 10000 + "}\n").encode(),
        "nested deeper than",
    ),
    "alias-bomb": ((INVENTORY + EDGE_9 + alias_bomb()).encode(), "aliases expand to more than"),
    "oversize": (oversize(), "larger than the limit"),
}


def replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` as a new file moved over ``path`` (an atomic edit, a new inode)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def refusal_lines(proc: Proc, path: Path) -> list[str]:
    return [
        line
        for line in proc.output().splitlines()
        if "inventory edit refused" in line and str(path) in line
    ]


async def wait_refused(proc: Proc, path: Path, seen: int, reason: str) -> None:
    async def logged() -> bool:
        return len(refusal_lines(proc, path)) > seen

    await proc.wait_until(logged, f"a refusal log line for {reason!r}")
    line = refusal_lines(proc, path)[seen]
    assert reason in line, line
    assert len(line) < 600, line  # one short line: no expanded value, no traceback
    assert "Traceback" not in proc.output()


async def route_status(cluster: Cluster, target: str) -> int:
    try:
        _, writer = await cluster.connect(target)
    except ConnectRefused as exc:
        return exc.status
    writer.close()
    return 200


async def test_server_refuses_bad_edits_keeps_the_model_and_loads_a_good_one(
    cluster: Cluster,
) -> None:
    server = cluster.start_server()
    await cluster.wait_up()
    assert await route_status(cluster, "edge-9:10250") == 404
    assert await route_status(cluster, "edge-3:10250") == 503

    for seen, (name, (data, reason)) in enumerate(BAD_EDITS.items()):
        replace_file(cluster.inventory, data)
        await wait_refused(server, cluster.inventory, seen, reason)
        # Still the old model: edge-9 unknown, edge-3 known; health still answers.
        assert await route_status(cluster, "edge-9:10250") == 404, name
        assert await route_status(cluster, "edge-3:10250") == 503, name

    replace_file(cluster.inventory, (INVENTORY + EDGE_9).encode())

    async def loaded() -> bool:
        return await route_status(cluster, "edge-9:10250") == 503

    await server.wait_until(loaded, "the good edit (edge-9 known: 503 no agent)")
    assert server.running


async def dns_a(port: int, name: str) -> dns.message.Message:
    query = dns.message.make_query(name, "A")
    return await dns.asyncquery.udp(query, "127.0.0.1", port=port, timeout=2)


def start_dns(cluster: Cluster, port: int) -> Proc:
    args = [
        "dns", "--inventory", str(cluster.inventory), "--listen", f"127.0.0.1:{port}",
        "--log-level", "DEBUG",
    ]  # fmt: skip
    proc = Proc("dns", args, cluster.base / "dns.log", ports={"dns": port}).start()
    cluster.procs.append(proc)
    return proc


async def test_dns_refuses_bad_edits_keeps_the_map_and_loads_a_good_one(
    cluster: Cluster,
) -> None:
    port = free_port()
    proc = start_dns(cluster, port)

    async def answers() -> bool:
        try:
            reply = await dns_a(port, "edge-1")
        except (OSError, dns.exception.Timeout):
            return False
        return [r.to_text() for rr in reply.answer for r in rr] == ["127.0.0.1"]

    await proc.wait_until(answers, "dns answering edge-1")
    assert (await dns_a(port, "edge-9")).rcode() == dns.rcode.NXDOMAIN

    for seen, (name, (data, reason)) in enumerate(BAD_EDITS.items()):
        replace_file(cluster.inventory, data)
        await wait_refused(proc, cluster.inventory, seen, reason)
        assert proc.running, name
        assert (await dns_a(port, "edge-9")).rcode() == dns.rcode.NXDOMAIN, name
        assert await answers(), name

    replace_file(cluster.inventory, (INVENTORY + EDGE_9).encode())

    async def loaded() -> bool:
        reply = await dns_a(port, "edge-9")
        return [r.to_text() for rr in reply.answer for r in rr] == ["127.0.0.9"]

    await proc.wait_until(loaded, "the good edit (edge-9 answered)")


@pytest.mark.parametrize("command", ["server", "dns"])
@pytest.mark.parametrize("edit", sorted(BAD_EDITS))
async def test_a_bad_inventory_at_start_is_a_one_line_error_exit(
    cluster: Cluster, command: str, edit: str
) -> None:
    data, reason = BAD_EDITS[edit]
    replace_file(cluster.inventory, data)
    if command == "server":
        proc = cluster.start_server()
    else:
        proc = start_dns(cluster, free_port())
    assert proc.popen is not None
    code = await asyncio.to_thread(proc.popen.wait, 30)
    out = proc.output()
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith(f"ravenproxy {command}: error:")]
    assert len(errors) == 1, out
    assert str(cluster.inventory) in errors[0] and reason in errors[0], errors[0]
    assert len(errors[0]) < 600, errors[0]
    assert "Traceback" not in out, out
