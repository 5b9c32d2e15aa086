"""The Kubernetes source: list-then-watch through kubernetes_asyncio into the shared model.

Each resource is kept by a :class:`Reflector` (kopf's and client-go's pattern): list, remember
the list's resourceVersion, watch from it, apply ADDED/MODIFIED/DELETED to a local cache; a watch
that ends normally is resumed from the last resourceVersion seen (bookmarks included); "410 Gone"
(the version was compacted away) means relist; every ``resync`` seconds a relist runs anyway as a
level-triggered safety net. Other failures retry with capped exponential backoff.

Responses are read raw (``_preload_content=False``): the model parsers take Kubernetes JSON, and
skipping the client's model classes keeps one code path for the YAML inventory and the API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from ravenproxy.controller import calico, dnsmap
from ravenproxy.controller.dns import DEFAULT_TTL, DNSServer, TCPLimits
from ravenproxy.errors import InventoryError, RavenProxyError
from ravenproxy.log import kv
from ravenproxy.model.parse import parse_gateway, parse_node, parse_pod
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)

GATEWAY_GROUP = "raven.openyurt.io"
GATEWAY_VERSION = "v1beta1"
GATEWAY_PLURAL = "gateways"

ListFn = Callable[..., Awaitable[Any]]
_T = TypeVar("_T")


class KubeError(RavenProxyError):
    """The Kubernetes API answered with an error we cannot recover from by relisting."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class _Gone(Exception):
    """The watched resourceVersion is no longer available: relist."""


class _Absent(Exception):
    """An optional resource type does not exist in this cluster (its CRD is not installed)."""


@dataclass(frozen=True)
class WatchSettings:
    # Server-side timeoutSeconds of one watch request; the watch is then resumed, which also
    # catches half-open connections that would otherwise hang forever.
    watch_timeout: int = 290
    # Full relist period even when watches work: level-triggered reconciliation.
    resync: float = 600.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    connect_timeout: float = 10.0


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    name = str(meta.get("name", ""))
    return f"{ns}/{name}" if ns else name


def _status_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body[:200]
    if isinstance(data, dict):
        return str(data.get("message") or data.get("reason") or body[:200])
    return body[:200]


class Reflector:
    """A local cache of one resource kept by list-then-watch.

    ``on_change`` is called (synchronously) after every list and every applied event; it only
    marks work, the consumer reads :attr:`objects` when it runs.
    """

    def __init__(
        self,
        what: str,
        list_fn: ListFn,
        on_change: Callable[[], None],
        settings: WatchSettings | None = None,
        optional: bool = False,
        **list_kwargs: Any,
    ) -> None:
        self.what = what
        # optional: a 404 on the first list means "not installed here" (e.g. Calico's CRDs on
        # a Flannel cluster): the reflector reports synced-and-absent and stops.
        self.optional = optional
        self.absent = False
        self._list_fn = list_fn
        self._list_kwargs = list_kwargs
        self._on_change = on_change
        self.settings = settings or WatchSettings()
        self.objects: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0

    async def _request(self, **kwargs: Any) -> aiohttp.ClientResponse:
        resp: aiohttp.ClientResponse = await self._list_fn(
            **self._list_kwargs, **kwargs, _preload_content=False
        )
        if resp.status < 300:
            return resp
        body = await resp.text()
        resp.release()
        if resp.status == 410:
            raise _Gone(_status_message(body))
        if resp.status == 404 and self.optional and not self.lists:
            raise _Absent(_status_message(body))
        raise KubeError(resp.status, f"{self.what}: {_status_message(body)}")

    async def list(self) -> None:
        s = self.settings
        resp = await self._request(_request_timeout=(s.connect_timeout, s.watch_timeout))
        try:
            data = await resp.json()
        finally:
            resp.release()
        items = data.get("items") or []
        self.objects = {_key(o): o for o in items if isinstance(o, dict)}
        self.resource_version = str((data.get("metadata") or {}).get("resourceVersion", ""))
        self.lists += 1
        log.debug(
            "kube: listed",
            extra=kv(what=self.what, objects=len(self.objects), rv=self.resource_version),
        )
        self.synced.set()
        self._on_change()

    async def watch(self, timeout: int) -> None:
        """One watch request from :attr:`resource_version`, until the server ends it."""
        s = self.settings
        resp = await self._request(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout,
            # sock_read: a watch with nothing to say for this long is a dead connection.
            _request_timeout=(s.connect_timeout, timeout + 30),
        )
        try:
            async for line in resp.content:
                if line.strip():
                    self._apply(json.loads(line))
        finally:
            resp.release()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise _Gone(str(obj.get("message", "")))
            raise KubeError(code, f"{self.what}: {obj.get('message', '')}")
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if kind in ("ADDED", "MODIFIED"):
            self.objects[_key(obj)] = dict(obj)
        elif kind == "DELETED":
            self.objects.pop(_key(obj), None)
        elif kind != "BOOKMARK":
            # Not a watch event at all (a proxy answering with something else): back off
            # rather than spin on a stream that will never carry events.
            raise KubeError(0, f"{self.what}: unexpected watch event type {kind!r}")
        if rv:
            self.resource_version = rv
        if kind != "BOOKMARK":
            self._on_change()

    async def run(self) -> None:
        """List, then watch forever (until cancelled)."""
        s = self.settings
        delay = s.backoff_initial
        need_list = True
        listed_at = 0.0
        while True:
            try:
                if need_list or time.monotonic() - listed_at >= s.resync:
                    try:
                        await self.list()
                    except _Absent:
                        log.info("kube: resource not installed", extra=kv(what=self.what))
                        self.absent = True
                        self.synced.set()
                        self._on_change()
                        return
                    need_list = False
                    listed_at = time.monotonic()
                remaining = s.resync - (time.monotonic() - listed_at)
                await self.watch(max(1, min(s.watch_timeout, int(remaining))))
                delay = s.backoff_initial
            except _Gone as exc:
                log.info("kube: watch expired, relisting", extra=kv(what=self.what, reason=exc))
                need_list = True
            except (aiohttp.ClientError, TimeoutError, KubeError, ValueError) as exc:
                # ValueError: a line that is not JSON. Resume from the last good version; if
                # that is gone too, the next attempt gets 410 and relists.
                log.warning(
                    "kube: watch failed, retrying",
                    extra=kv(what=self.what, error=exc, retry_in=round(delay, 2)),
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, s.backoff_max)


def build_model(
    nodes: Mapping[str, Mapping[str, Any]],
    gateways: Mapping[str, Mapping[str, Any]],
    pods: Mapping[str, Mapping[str, Any]] | None = None,
) -> Model:
    """Raw API objects → a model. An object that does not parse is left out (and logged), so
    one bad Gateway cannot stop the controller from serving the others."""
    return Model.build(
        _parse_all(nodes, parse_node),
        _parse_all(gateways, parse_gateway),
        _parse_all(pods or {}, parse_pod),
    )


def _parse_all(
    raw: Mapping[str, Mapping[str, Any]], parse: Callable[[Mapping[str, Any]], _T]
) -> list[_T]:
    out: list[_T] = []
    for key, obj in raw.items():
        try:
            out.append(parse(obj))
        except InventoryError as exc:
            log.warning("kube: skipping an object", extra=kv(key=key, error=exc))
    return out


class KubeSource:
    """Feeds a :class:`ModelStore` from the API: Nodes and Gateways (and Pods if asked).

    The store is first updated once every reflector has listed, so nobody plans from a model
    that has the Gateways but not yet the Nodes.
    """

    def __init__(
        self,
        api: k8s_client.ApiClient,
        store: ModelStore,
        settings: WatchSettings | None = None,
        pods: bool = False,
        calico_blocks: bool = True,
    ) -> None:
        self.store = store
        self._dirty = asyncio.Event()
        core = k8s_client.CoreV1Api(api)
        custom = k8s_client.CustomObjectsApi(api)
        mark = self._dirty.set
        self.nodes = Reflector("nodes", core.list_node, mark, settings)
        self.gateways = Reflector(
            "gateways",
            custom.list_cluster_custom_object,
            mark,
            settings,
            group=GATEWAY_GROUP,
            version=GATEWAY_VERSION,
            plural=GATEWAY_PLURAL,
        )
        self.pods = (
            Reflector("pods", core.list_pod_for_all_namespaces, mark, settings) if pods else None
        )
        # Block affinities are not part of the model (they only change status subnets), so their
        # changes do not publish a model; the reconciler reads them on its next round.
        self.blocks = (
            Reflector(
                "blockaffinities",
                custom.list_cluster_custom_object,
                lambda: None,
                settings,
                optional=True,
                group=calico.GROUP,
                version=calico.VERSION,
                plural=calico.PLURAL,
            )
            if calico_blocks
            else None
        )
        self.synced = asyncio.Event()

    @property
    def reflectors(self) -> list[Reflector]:
        return [r for r in (self.nodes, self.gateways, self.pods) if r is not None]

    def block_affinities(self) -> dict[str, list[str]] | None:
        """Confirmed Calico blocks per node, or None when this is not a Calico cluster (then
        status subnets are the nodes' podCIDRs)."""
        if self.blocks is None or self.blocks.absent or not self.blocks.synced.is_set():
            return None
        return calico.confirmed_block_affinities(self.blocks.objects.values())

    async def list_once(self) -> Model:
        """List everything once, publish and return the model (no watches: a dry run)."""
        for r in self.reflectors:
            await r.list()
        if self.blocks is not None:
            try:
                await self.blocks.list()
            except _Absent:
                self.blocks.absent = True
                self.blocks.synced.set()
        model = build_model(
            self.nodes.objects,
            self.gateways.objects,
            self.pods.objects if self.pods is not None else None,
        )
        self.store.update(model)
        self.synced.set()
        return model

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for r in self.reflectors:
                tg.create_task(r.run(), name=f"kube-reflector-{r.what}")
            if self.blocks is not None:
                tg.create_task(self.blocks.run(), name="kube-reflector-blockaffinities")
            tg.create_task(self._publish(), name="kube-model-publisher")

    async def _publish(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if not all(r.synced.is_set() for r in self.reflectors):
                continue
            self.store.update(
                build_model(
                    self.nodes.objects,
                    self.gateways.objects,
                    self.pods.objects if self.pods is not None else None,
                )
            )
            self.synced.set()


async def new_api_client(kubeconfig: Path | None) -> k8s_client.ApiClient:
    """An API client from a kubeconfig file, or from the in-cluster service account."""
    if kubeconfig is not None:
        try:
            return await k8s_config.new_client_from_config(config_file=str(kubeconfig))
        except (OSError, k8s_config.ConfigException) as exc:
            raise KubeError(0, f"{kubeconfig}: cannot load kubeconfig: {exc}") from None
    cfg = k8s_client.Configuration()
    try:
        k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except k8s_config.ConfigException as exc:
        raise KubeError(0, f"not in a cluster and no --kubeconfig given: {exc}") from None
    return k8s_client.ApiClient(cfg)


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
