"""Publishing this node's WireGuard public key in its Gateway (``endpoints[].config.publicKey``),
where the remote gateways' route drivers read it.

The change is computed as data (:func:`with_public_key`) and written with a replace that
carries the resourceVersion it was computed from, so a concurrent edit of the Gateway is never
overwritten: on a conflict the object is read again and the change recomputed.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Mapping
from typing import Any

from ravenproxy.errors import RavenProxyError
from ravenproxy.kube.rest import KubeError, RestClient, status_message
from ravenproxy.l3 import wireguard
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.topology import topology
from ravenproxy.log import kv
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "raven.openyurt.io", "v1beta1", "gateways"
GATEWAYS = f"/apis/{GROUP}/{VERSION}/{PLURAL}"


class PublishError(RavenProxyError):
    """The key could not be written to the Gateway."""


def with_public_key(gateway: Mapping[str, Any], node: str, key: str) -> dict[str, Any] | None:
    """The Gateway with ``key`` in the config of ``node``'s tunnel endpoints, or None when it
    is already there (or the node has no tunnel endpoint). ``gateway`` is never modified."""
    updated = copy.deepcopy(dict(gateway))
    changed = False
    for endpoint in (updated.get("spec") or {}).get("endpoints") or []:
        if endpoint.get("nodeName") == node and endpoint.get("type") == "tunnel":
            config = endpoint.setdefault("config", {}) or {}
            endpoint["config"] = config
            if config.get("publicKey") != key:
                config["publicKey"] = key
                changed = True
    return updated if changed else None


async def publish_public_key(
    api: RestClient, gateway: str, node: str, key: str, attempts: int = 5
) -> bool:
    """Write ``key`` into the Gateway; True when a write was needed."""
    path = f"{GATEWAYS}/{gateway}"
    for _ in range(attempts):
        status, current = await api.request("GET", path)
        if status != 200:
            why = status_message(current, status)
            raise PublishError(f"Gateway {gateway}: HTTP {status} {why}")
        updated = with_public_key(current, node, key)
        if updated is None:
            return False
        status, answer = await api.request("PUT", path, body=updated)
        if status == 409:
            continue  # edited meanwhile: read it again
        if status >= 300:
            why = status_message(answer, status)
            raise PublishError(f"Gateway {gateway}: HTTP {status} {why}")
        log.info("published the WireGuard public key", extra=kv(gateway=gateway, node=node))
        return True
    raise PublishError(f"Gateway {gateway}: still conflicting after {attempts} attempts")


class KeyPublisher:
    """On every model change: if this node is its gateway's tunnel node and the Gateway does
    not carry its current public key, publish it (so a re-keyed or new node is reachable)."""

    def __init__(self, store: ModelStore, api: RestClient, node: str, settings: L3Settings) -> None:
        self.store = store
        self.api = api
        self.node = node
        self.settings = settings

    def wanted(self) -> tuple[str, str] | None:
        """(gateway, key) when the model lacks this node's key, else None."""
        model = self.store.model
        node = model.node(self.node)
        if node is None or node.gateway is None:
            return None
        domain = topology(model, self.settings.vpn_port).domains.get(node.gateway)
        gateway = model.gateways.get(node.gateway)
        if domain is None or gateway is None or domain.gateway_node != self.node:
            return None
        key = wireguard.public_key(self.settings)
        published = {
            e.config.get("publicKey", "")
            for e in gateway.endpoints
            if e.node_name == self.node and e.type == "tunnel"
        }
        return None if published == {key} else (node.gateway, key)

    async def run(self) -> None:
        version = -1
        while True:
            model_version = self.store.version
            if model_version != version:
                version = model_version
                want = self.wanted()
                if want is not None:
                    try:
                        await publish_public_key(self.api, want[0], self.node, want[1])
                    except (PublishError, KubeError, OSError) as exc:
                        log.warning("cannot publish the WireGuard key", extra=kv(error=exc))
                        await asyncio.sleep(5)
                        version = -1  # try again
                        continue
            await self.store.wait_changed(version)
