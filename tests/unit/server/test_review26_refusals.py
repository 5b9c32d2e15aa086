"""Review of branch gendrain: a refusal's write waits for the client at most --idle-timeout.

gendrain's own tests (test_refuse_bounded.py) hold it for a refusal before any route (404, an
unknown node) and for a 101. Here the other branch of ``_drain_client``'s timeout: a refusal
made after the request was routed (the target's dial failed), so the exchange holds a route,
to a client that reads nothing — the front's task ends within a few --idle-timeout, the
refusal counted once by its status. On ebcf73b the task waits
for as long as the client keeps its socket open (its bare ``writer.drain()``).

Hand-made break: ``_refuse`` awaiting ``self.writer.drain()`` again (ebcf73b's) makes it fail.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from ravenproxy.model.inventory import parse_inventory
from ravenproxy.model.store import ModelStore
from ravenproxy.pki import init_pki
from ravenproxy.server.app import ProxyServer
from ravenproxy.server.http_proxy import HttpProxy
from ravenproxy.server.settings import ServerSettings

from .test_refuse_bounded import BIG, IDLE, _ends_within_idle, _served

pytestmark = pytest.mark.timeout(60)

LONG = "n" * BIG
"""A node whose name is longer than the buffers: the refusal names it ("node: reason")."""


def _inventory() -> str:
    return f"""\
apiVersion: raven.openyurt.io/v1beta1
kind: Gateway
metadata: {{name: gw}}
spec:
  endpoints:
  - {{nodeName: cloud-1, type: proxy}}
---
apiVersion: v1
kind: Node
metadata: {{name: cloud-1, labels: {{raven.openyurt.io/gateway: gw}}}}
status:
  addresses: [{{type: InternalIP, address: 127.0.0.1}}]
---
apiVersion: v1
kind: Node
metadata: {{name: {LONG}, labels: {{raven.openyurt.io/gateway: gw}}}}
status:
  addresses: [{{type: InternalIP, address: 127.0.0.1}}]
"""


def _proxy(base: Path) -> HttpProxy:
    init_pki(base, ("localhost",), ())
    inventory = _inventory()
    (base / "inv.yaml").write_text(inventory)
    s = ServerSettings.from_mapping(
        {
            "inventory": str(base / "inv.yaml"),
            "ca_file": str(base / "ca.crt"),
            "cert_file": str(base / "server.crt"),
            "key_file": str(base / "server.key"),
            "node_name": "cloud-1",  # its gateway (the long-named node's too) dialled directly
            "idle_timeout": IDLE,
            "max_header_size": 2 * BIG,
        }
    )
    return ProxyServer(s, ModelStore(parse_inventory(inventory))).http_front.proxy


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _statuses(proxy: HttpProxy) -> dict[str, float]:
    """The front's request counters by status (those counted)."""
    got: dict[str, float] = {}
    for metric in proxy.ctx.metrics.registry.collect():
        for sample in metric.samples:
            name, labels = sample.name, sample.labels
            if name == "ravenproxy_server_front_requests_total" and labels["front"] == "http":
                got[labels["status"]] = sample.value
    return got


async def test_a_routed_refusal_to_a_client_that_reads_nothing_ends_within_idle_timeout(
    tmp_path: Path,
) -> None:
    proxy = _proxy(tmp_path)
    port = _closed_port()
    async with _served(proxy) as (client, task):
        request = f"GET /x HTTP/1.1\r\nHost: {LONG}:{port}\r\n\r\n".encode()
        await asyncio.get_running_loop().sock_sendall(client, request)
        await _ends_within_idle(client, task)
    statuses = _statuses(proxy)
    assert list(statuses.values()) == [1.0], statuses  # one refusal, counted once
    assert next(iter(statuses)) in ("403", "502"), statuses  # the dial refused or failed
