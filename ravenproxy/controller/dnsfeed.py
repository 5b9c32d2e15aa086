"""``ravenproxy dns``: what the embedded DNS server answers from, and for how long.

Two feeds, one server (:class:`~ravenproxy.controller.dns.DNSServer`):

- :func:`run_dns` (``--inventory``): the DNS map of a model, which ``model_source`` keeps current
  from the inventory file, as for every other command;
- :func:`run_dns_kube` (``--kubeconfig``, or in-cluster): the map the controller publishes, read
  from its ConfigMap. There is no model in this process: answering from the published map rather
  than recomputing it keeps one source of truth (the ClusterIP rule lives in the controller) and
  also works next to Raven's own controller.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from kubernetes_asyncio import client as k8s_client

from ravenproxy.controller import dnsmap
from ravenproxy.controller.dns import DNSServer
from ravenproxy.controller.dnsanswer import DEFAULT_TTL
from ravenproxy.controller.settings import TCPLimits
from ravenproxy.kube.client import new_api_client
from ravenproxy.kube.reflector import Reflector, WatchSettings
from ravenproxy.kube.sources import model_source
from ravenproxy.lifecycle import parts
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore


async def serve_model_dns(
    store: ModelStore,
    listen: tuple[str, int],
    suffix: str | None = None,
    ttl: int = DEFAULT_TTL,
    cluster_ip: str | None = None,
    started: Callable[[DNSServer], None] | None = None,
    limits: TCPLimits | None = None,
) -> None:
    """Serve the DNS map of whatever model ``store`` holds until cancelled, following updates.

    Source-agnostic: :func:`~ravenproxy.kube.sources.model_source` feeds ``store``.
    ``started`` is called with the bound server (tests read its port from it).
    """

    def records(model: Model) -> dict[str, list[str]]:
        return dnsmap.dns_map(model, cluster_ip)

    server = DNSServer(records(store.model), suffix=suffix, ttl=ttl, limits=limits)
    store.subscribe(lambda model: server.update(records(model)))
    await server.start(*listen)
    try:
        if started is not None:
            started(server)
        await asyncio.Event().wait()
    finally:
        await server.close()


async def run_dns(
    inventory: Path,
    listen: tuple[str, int],
    suffix: str | None = None,
    ttl: int = DEFAULT_TTL,
    cluster_ip: str | None = None,
    interval: float = 1.0,
    started: Callable[[DNSServer], None] | None = None,
    limits: TCPLimits | None = None,
) -> None:
    """``ravenproxy dns --inventory FILE``: serve until cancelled, reloading the map when the
    inventory file changes (a broken edit keeps the last good map). Raises InventoryError when
    the file cannot be loaded at start, DNSServerError when the address cannot be bound."""
    store = ModelStore()
    async with model_source(store, inventory=inventory, interval=interval) as feed:
        # One task failing with our own error (e.g. the port is taken) is that error, raised alone.
        async with parts() as tg:
            tg.create_task(feed.wait(), name="dns-model-feed")
            tg.create_task(
                serve_model_dns(store, listen, suffix, ttl, cluster_ip, started, limits),
                name="dns-server",
            )


async def serve_configmap_dns(
    api: k8s_client.ApiClient,
    listen: tuple[str, int],
    suffix: str | None = None,
    ttl: int = DEFAULT_TTL,
    settings: WatchSettings | None = None,
    started: Callable[[DNSServer], None] | None = None,
    limits: TCPLimits | None = None,
) -> None:
    """Serve the map the controller publishes (ConfigMap ``kube-system/edge-tunnel-nodes``)
    until cancelled. Answering from the published ConfigMap rather than recomputing it keeps
    one source of truth (the ClusterIP rule lives in the controller) and also works next to
    Raven's own controller. While the ConfigMap is missing every name is NXDOMAIN."""
    server = DNSServer({}, suffix=suffix, ttl=ttl, limits=limits)
    reflector: Reflector

    def reload() -> None:
        cm = reflector.objects.get(f"{dnsmap.NAMESPACE}/{dnsmap.CONFIGMAP_NAME}")
        text = str(((cm or {}).get("data") or {}).get(dnsmap.KEY, ""))
        server.update(dnsmap.parse_hosts(text))

    reflector = Reflector(
        "dns-configmap",
        k8s_client.CoreV1Api(api).list_namespaced_config_map,
        reload,
        settings,
        namespace=dnsmap.NAMESPACE,
        field_selector=f"metadata.name={dnsmap.CONFIGMAP_NAME}",
    )
    await server.start(*listen)
    try:
        if started is not None:
            started(server)
        await reflector.run()
    finally:
        await server.close()


async def run_dns_kube(
    kubeconfig: Path | None,
    listen: tuple[str, int],
    suffix: str | None = None,
    ttl: int = DEFAULT_TTL,
    limits: TCPLimits | None = None,
) -> None:
    """``ravenproxy dns --kubeconfig F``: serve until cancelled (in-cluster config when
    ``kubeconfig`` is None)."""
    api = await new_api_client(kubeconfig)
    async with api:
        await serve_configmap_dns(api, listen, suffix, ttl, limits=limits)
