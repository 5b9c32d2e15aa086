"""The Kubernetes model source: Nodes, Gateways (and Pods) kept by reflectors, into a store.

The model parsers take the API's raw JSON, so the YAML inventory and the API share one parser.
Calico's BlockAffinities are watched beside them for the controller (they change the Gateways'
status subnets, not the model).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ravenproxy.errors import InventoryError
from ravenproxy.kube import calico
from ravenproxy.kube.reflector import Absent, ListFn, ListWatch, Reflector, Resource, WatchSettings
from ravenproxy.kube.rest import RestClient
from ravenproxy.log import kv
from ravenproxy.model.parse import parse_gateway, parse_node, parse_pod
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s_client

log = logging.getLogger(__name__)

GATEWAY_GROUP = "raven.openyurt.io"
GATEWAY_VERSION = "v1beta1"
GATEWAY_PLURAL = "gateways"

_T = TypeVar("_T")

NODES = "/api/v1/nodes"
PODS = "/api/v1/pods"
GATEWAYS = f"/apis/{GATEWAY_GROUP}/{GATEWAY_VERSION}/{GATEWAY_PLURAL}"
BLOCK_AFFINITIES = f"/apis/{calico.GROUP}/{calico.VERSION}/{calico.PLURAL}"


def collections(api: RestClient | k8s_client.ApiClient) -> dict[str, ListWatch | ListFn]:
    """How to list and watch each resource the model is made of, on either client: the REST
    client (the agent, the server), or kubernetes_asyncio's (the controller, for now)."""
    if isinstance(api, RestClient):
        return {
            "nodes": Resource(api, NODES),
            "gateways": Resource(api, GATEWAYS),
            "pods": Resource(api, PODS),
            "blockaffinities": Resource(api, BLOCK_AFFINITIES),
        }
    from kubernetes_asyncio import client as k8s_client

    core = k8s_client.CoreV1Api(api)
    custom = k8s_client.CustomObjectsApi(api).list_cluster_custom_object
    return {
        "nodes": core.list_node,
        "gateways": functools.partial(
            custom, group=GATEWAY_GROUP, version=GATEWAY_VERSION, plural=GATEWAY_PLURAL
        ),
        "pods": core.list_pod_for_all_namespaces,
        "blockaffinities": functools.partial(
            custom, group=calico.GROUP, version=calico.VERSION, plural=calico.PLURAL
        ),
    }


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


def _ignore() -> None:
    pass


class KubeSource:
    """Feeds a :class:`ModelStore` from the API: Nodes and Gateways (and Pods if asked).

    The store is first updated once every reflector has listed, so nobody plans from a model
    that has the Gateways but not yet the Nodes.
    """

    def __init__(
        self,
        api: RestClient | k8s_client.ApiClient,
        store: ModelStore,
        settings: WatchSettings | None = None,
        pods: bool = False,
        calico_blocks: bool = True,
    ) -> None:
        self.store = store
        self._dirty = asyncio.Event()
        of = collections(api)
        mark = self._dirty.set
        self.nodes = Reflector("nodes", of["nodes"], mark, settings)
        self.gateways = Reflector("gateways", of["gateways"], mark, settings)
        self.pods = Reflector("pods", of["pods"], mark, settings) if pods else None
        # Block affinities are not part of the model (they only change status subnets), so their
        # changes do not publish a model; the reconciler reads them on its next round.
        self.blocks = (
            Reflector("blockaffinities", of["blockaffinities"], _ignore, settings, optional=True)
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
            except Absent:
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
