"""kube-apiserver's kubelet client, emulated step by step from its flags and Pod DNS settings.

What kube-apiserver does to reach a kubelet for ``kubectl logs/exec``:

1. pick the Node's address by ``--kubelet-preferred-address-types`` (the first type in that order
   the Node reports; ``Hostname`` falls back to the ``kubernetes.io/hostname`` label), and the
   port from ``status.daemonEndpoints.kubeletEndpoint.Port``;
2. resolve that name with the Pod's resolver (``dnsConfig``: nameservers, search domains tried
   first while the name has fewer dots than ``ndots``) — here real DNS queries (dnspython) to
   the real ``ravenproxy dns`` process;
3. dial the resolved address on that port with TLS, SNI = the name, verifying the kubelet against
   ``--kubelet-certificate-authority`` and presenting ``--kubelet-client-certificate``/``-key``;
4. send the request (``GET /containerLogs/…?follow=true``, an exec WebSocket upgrade).

aiohttp does steps 3 and 4 given a resolver for step 2: it sends the URL's host as SNI and
verifies the certificate against it, as Go's ``net/http`` does.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import dns.asyncquery
import dns.message
import dns.rcode
import dns.rdatatype
from aiohttp.abc import AbstractResolver, ResolveResult


@dataclass(frozen=True)
class KubeletClient:
    """The kube-apiserver settings this emulation follows (parsed from docs/apiserver.md)."""

    preferred_address_types: tuple[str, ...]
    ca_file: Path
    cert_file: Path
    key_file: Path
    nameserver: tuple[str, int]
    searches: tuple[str, ...]
    ndots: int

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx

    def kubelet_address(self, node: dict[str, Any]) -> tuple[str, int]:
        """(host, port) kube-apiserver dials for this Node object."""
        status = node.get("status", {})
        addresses = status.get("addresses", [])
        port = int(status["daemonEndpoints"]["kubeletEndpoint"]["Port"])
        for kind in self.preferred_address_types:
            for address in addresses:
                if address["type"] == kind:
                    return str(address["address"]), port
            label = node.get("metadata", {}).get("labels", {}).get("kubernetes.io/hostname")
            if kind == "Hostname" and label:
                return str(label), port
        raise AssertionError(f"node {node['metadata']['name']} has no preferred address")

    def candidates(self, name: str) -> list[str]:
        """The names the resolver asks, in order (resolv.conf's search and ndots rules)."""
        absolute = name.rstrip(".") + "."
        searched = [f"{name}.{domain}." for domain in self.searches]
        if name.endswith("."):
            return [name]
        return [*searched, absolute] if name.count(".") < self.ndots else [absolute, *searched]

    async def resolve(self, name: str) -> tuple[str, list[str]]:
        """(address, names asked) through the configured nameserver; fails on no answer. An IP
        is its own address (kube-apiserver dials an InternalIP as it is)."""
        try:
            return str(ipaddress.ip_address(name)), []
        except ValueError:
            pass
        host, port = self.nameserver
        asked = []
        for candidate in self.candidates(name):
            asked.append(candidate)
            query = dns.message.make_query(candidate, dns.rdatatype.A)
            reply = await dns.asyncquery.udp(query, host, port=port, timeout=2)
            if reply.rcode() == dns.rcode.NOERROR and reply.answer:
                return reply.answer[0][0].to_text(), asked
        raise OSError(f"{name}: no address from {host}:{port} (asked {asked})")

    def session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            resolver=_Resolver(self), ssl=self.ssl_context(), force_close=True
        )
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(30))


class _Resolver(AbstractResolver):
    def __init__(self, client: KubeletClient) -> None:
        self.client = client

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address, _ = await self.client.resolve(host)
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
        ]

    async def close(self) -> None:
        return None
