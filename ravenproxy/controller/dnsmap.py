"""The DNS map: every node name → the address that reaches it, as CoreDNS hosts lines.

Published as ConfigMap ``kube-system/edge-tunnel-nodes``, key ``tunnel-nodes`` (Raven's names, so
an existing CoreDNS ``hosts`` stanza keeps working), and served by the embedded DNS server.

Rules:
- L7 on (some gateway is exposed, and the caller passes the internal Service's ClusterIP):
  every node → that ClusterIP, so
  ``nodename:10250`` enters the proxy server. Otherwise every node → its InternalIPs (all of
  them, so a dual-stack node gets an A and an AAAA line). A node with no address is left out:
  a line without an address would break the hosts file.
- Lines are ``"<IP>\\t<nodeName>"``, sorted as strings, joined with ``"\\n"`` and with *no*
  trailing newline, byte-for-byte what Raven writes, so switching controllers causes no rewrite.
  An empty cluster gives the empty string.
- The ConfigMap is rewritten only when that text changes (:func:`needs_write`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from ravenproxy.model.snapshot import Model

CONFIGMAP_NAME = "edge-tunnel-nodes"
NAMESPACE = "kube-system"
KEY = "tunnel-nodes"


def l7_on(model: Model) -> bool:
    """The internal Service exists exactly while some gateway is exposed."""
    return any(gw.exposed for gw in model.gateways.values())


def node_addresses(model: Model, cluster_ip: str | None = None) -> dict[str, tuple[str, ...]]:
    """Node name → addresses, by the ClusterIP-or-InternalIP rule. ``cluster_ip`` (the internal
    Service's, once assigned) is ignored while no gateway is exposed: that Service is then
    deleted, and its old address would black-hole every node name."""
    if not l7_on(model):
        cluster_ip = None
    out: dict[str, tuple[str, ...]] = {}
    for name in sorted(model.nodes):
        ips = (cluster_ip,) if cluster_ip else model.nodes[name].internal_ips
        if ips:
            out[name] = tuple(dict.fromkeys(ips))
    return out


def hosts_text(addresses: Mapping[str, Sequence[str]]) -> str:
    lines = sorted(f"{ip}\t{name}" for name, ips in addresses.items() for ip in ips)
    return "\n".join(lines)


def tunnel_nodes_data(model: Model, cluster_ip: str | None = None) -> dict[str, str]:
    """The ConfigMap's ``data``."""
    return {KEY: hosts_text(node_addresses(model, cluster_ip))}


def configmap(model: Model, cluster_ip: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CONFIGMAP_NAME, "namespace": NAMESPACE},
        "data": tunnel_nodes_data(model, cluster_ip),
    }


def needs_write(existing_data: Mapping[str, str] | None, desired_data: Mapping[str, str]) -> bool:
    """Whether the ConfigMap must be written: it is missing, or one of our keys differs.

    Other keys someone else keeps in the ConfigMap are not ours and never cause a write (the
    applier patches only our key). The comparison is exact: a hand edit, even of whitespace, is
    put back.
    """
    if existing_data is None:
        return True
    return any(existing_data.get(k) != v for k, v in desired_data.items())


def parse_hosts(text: str) -> dict[str, list[str]]:
    """Hosts-file text (the ConfigMap value) → name → addresses, for the DNS server.

    Tolerates what a person might write: comments, blank lines, several names per line, CRLF.
    Entries whose address is not an IP are skipped. Names are lower-cased.
    """
    out: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        ip, *names = line.split()
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            continue
        for name in names:
            ips = out.setdefault(name.lower().rstrip("."), [])
            if ip not in ips:
                ips.append(ip)
    return out


def dns_map(model: Model, cluster_ip: str | None = None) -> dict[str, list[str]]:
    """The map the embedded DNS server answers from: the same content as the ConfigMap."""
    return parse_hosts(hosts_text(node_addresses(model, cluster_ip)))
