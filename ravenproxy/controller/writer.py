"""The controller's writes to the API: one call per planned write, raw JSON both ways.

Every write checks that this replica still leads (:class:`NotLeader` otherwise): two replicas
never both write, even for the moment between losing the Lease and noticing it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client as k8s_client

from ravenproxy.controller import dnsmap
from ravenproxy.controller.services import (
    INTERNAL_SERVICE,
    NAMESPACE,
    Op,
)
from ravenproxy.errors import RavenProxyError
from ravenproxy.kube.client import MERGE_PATCH, KubeError, raw_call
from ravenproxy.kube.labels import LABEL_MANAGED_BY, MANAGED_BY
from ravenproxy.kube.model import GATEWAY_GROUP, GATEWAY_PLURAL, GATEWAY_VERSION
from ravenproxy.log import kv
from ravenproxy.metrics import ControllerMetrics

log = logging.getLogger(__name__)


class NotLeader(RavenProxyError):
    """A write was attempted by a replica that does not hold the Lease."""


class KubeWriter:
    """One API call per write, raw JSON both ways; refuses every write while not leading."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        leading: Callable[[], bool],
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self._core = k8s_client.CoreV1Api(api)
        self._custom = k8s_client.CustomObjectsApi(api)
        self._certs = k8s_client.CertificatesV1Api(api)
        self._leading = leading
        self._metrics = metrics

    async def _call(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, write: bool = True, **kwargs: Any
    ) -> tuple[int, dict[str, Any]]:
        if write and not self._leading():
            raise NotLeader("not the leader: refusing to write")
        if not write or self._metrics is None:
            return await raw_call(fn, *args, **kwargs)
        kind, verb = write_labels(fn.__name__)
        status: int | None = None
        try:
            status, body = await raw_call(fn, *args, **kwargs)
        finally:
            self._metrics.write(kind, verb, status)
        return status, body

    @staticmethod
    def _check(status: int, body: Mapping[str, Any], what: str) -> None:
        if status >= 300:
            raise KubeError(status, f"{what}: {body.get('message', body.get('reason', ''))}")

    async def list_owned(self) -> list[dict[str, Any]]:
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        out: list[dict[str, Any]] = []
        for fn, kind in (
            (self._core.list_namespaced_service, "Service"),
            (self._core.list_namespaced_endpoints, "Endpoints"),
        ):
            status, body = await self._call(fn, NAMESPACE, label_selector=selector, write=False)
            self._check(status, body, f"list {kind}")
            for item in body.get("items") or []:
                # List items carry no kind; the planner keys objects by it.
                out.append({"kind": kind, **item})
        return out

    async def apply(self, op: Op) -> tuple[int, dict[str, Any]]:
        """Perform one op; returns the API's (status, object). 409 on create and 404 on
        delete are returned, not raised: the caller decides what they mean."""
        calls: dict[str, tuple[Callable[..., Awaitable[Any]], ...]] = {
            "Service": (
                self._core.create_namespaced_service,
                self._core.patch_namespaced_service,
                self._core.delete_namespaced_service,
            ),
            "Endpoints": (
                self._core.create_namespaced_endpoints,
                self._core.patch_namespaced_endpoints,
                self._core.delete_namespaced_endpoints,
            ),
        }
        create, patch, delete = calls[op.kind]
        what = f"{op.action} {op.kind} {op.namespace}/{op.name}"
        if op.action == "create":
            status, body = await self._call(create, op.namespace, dict(op.body or {}))
            if status != 409:
                self._check(status, body, what)
        elif op.action == "update":
            patch_body = {
                k: v for k, v in (op.body or {}).items() if k not in ("apiVersion", "kind")
            }
            meta = dict(patch_body.get("metadata") or {})
            # A merge patch carrying the resourceVersion fails with 409 if someone wrote in
            # between, instead of silently overwriting what we did not see.
            meta["resourceVersion"] = op.resource_version
            patch_body["metadata"] = meta
            status, body = await self._call(
                patch, op.name, op.namespace, patch_body, _content_type=MERGE_PATCH
            )
            self._check(status, body, what)
        else:
            status, body = await self._call(delete, op.name, op.namespace)
            if status != 404:
                self._check(status, body, what)
        return status, body

    async def patch_status(self, name: str, status_body: Mapping[str, Any]) -> dict[str, Any]:
        status, body = await self._call(
            self._custom.patch_cluster_custom_object_status,
            GATEWAY_GROUP,
            GATEWAY_VERSION,
            GATEWAY_PLURAL,
            name,
            {"status": dict(status_body)},
            _content_type=MERGE_PATCH,
        )
        self._check(status, body, f"patch Gateway {name} status")
        return body

    async def create_event(self, event: Mapping[str, Any]) -> None:
        ns = event["metadata"]["namespace"]
        status, body = await self._call(self._core.create_namespaced_event, ns, dict(event))
        if status >= 300:
            # An event that cannot be recorded must not stop reconciliation.
            log.warning("controller: event not recorded", extra=kv(status=status, body=body))

    async def read_configmap(self) -> dict[str, Any] | None:
        status, body = await self._call(
            self._core.read_namespaced_config_map,
            dnsmap.CONFIGMAP_NAME,
            dnsmap.NAMESPACE,
            write=False,
        )
        if status == 404:
            return None
        self._check(status, body, "read ConfigMap")
        return body

    async def write_configmap(self, exists: bool, desired: Mapping[str, Any]) -> None:
        if exists:
            # Patch only our key: other keys someone keeps in the ConfigMap survive.
            status, body = await self._call(
                self._core.patch_namespaced_config_map,
                dnsmap.CONFIGMAP_NAME,
                dnsmap.NAMESPACE,
                {"data": dict(desired["data"])},
                _content_type=MERGE_PATCH,
            )
        else:
            status, body = await self._call(
                self._core.create_namespaced_config_map, dnsmap.NAMESPACE, dict(desired)
            )
        self._check(status, body, "write ConfigMap")

    # --- certificate issuance (controller/issuer.py, controller/castore.py) ------------------

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = await self._call(
            self._core.read_namespaced_secret, name, namespace, write=False
        )
        if status == 404:
            return None
        self._check(status, body, f"read Secret {namespace}/{name}")
        return body

    async def create_secret(self, namespace: str, secret: Mapping[str, Any]) -> bool:
        """Create a Secret; False when it exists already (a 409: someone was faster)."""
        status, body = await self._call(
            self._core.create_namespaced_secret, namespace, dict(secret)
        )
        if status == 409:
            return False
        self._check(status, body, f"create Secret {namespace}/{secret['metadata']['name']}")
        return True

    async def read_named_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        status, body = await self._call(
            self._core.read_namespaced_config_map, name, namespace, write=False
        )
        if status == 404:
            return None
        self._check(status, body, f"read ConfigMap {namespace}/{name}")
        return body

    async def put_configmap_data(
        self, namespace: str, name: str, data: Mapping[str, str], resource_version: str | None
    ) -> None:
        """Create the ConfigMap with ``data`` (``resource_version`` None), or merge-patch
        ``data`` into the version read (409 if it changed since)."""
        if resource_version is None:
            body = {"metadata": {"name": name, "namespace": namespace}, "data": dict(data)}
            status, out = await self._call(self._core.create_namespaced_config_map, namespace, body)
        else:
            patch = {"metadata": {"resourceVersion": resource_version}, "data": dict(data)}
            status, out = await self._call(
                self._core.patch_namespaced_config_map,
                name,
                namespace,
                patch,
                _content_type=MERGE_PATCH,
            )
        self._check(status, out, f"write ConfigMap {namespace}/{name}")

    async def update_csr_approval(
        self, name: str, body: Mapping[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """PUT the CSR's approval subresource; a 409 (changed meanwhile) is returned."""
        status, out = await self._call(
            self._certs.replace_certificate_signing_request_approval, name, dict(body)
        )
        if status != 409:
            self._check(status, out, f"update CSR {name} approval")
        return status, out

    async def update_csr_status(
        self, name: str, body: Mapping[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        """PUT the CSR's status subresource; a 409 (changed meanwhile) is returned."""
        status, out = await self._call(
            self._certs.replace_certificate_signing_request_status, name, dict(body)
        )
        if status != 409:
            self._check(status, out, f"update CSR {name} status")
        return status, out


def write_labels(method: str) -> tuple[str, str]:
    """(kind, verb) of a kubernetes_asyncio method name, for the write metrics:
    ``patch_namespaced_config_map`` → (``config_map``, ``patch``),
    ``patch_cluster_custom_object_status`` → (``gateway_status``, ``patch``),
    ``replace_certificate_signing_request_approval`` → (``certificate_signing_request_approval``,
    ``update``)."""
    verb, _, rest = method.partition("_")
    rest = rest.removeprefix("namespaced_").removeprefix("cluster_")
    rest = rest.replace("custom_object", "gateway")  # the only custom objects we write
    return rest, {"replace": "update"}.get(verb, verb)


def internal_cluster_ip(objs: list[dict[str, Any]]) -> str | None:
    """The ClusterIP of our internal Service among ``objs`` (what :meth:`KubeWriter.list_owned`
    returns), once the API has assigned one."""
    for obj in objs:
        if obj.get("kind") == "Service" and obj["metadata"].get("name") == INTERNAL_SERVICE:
            ip = (obj.get("spec") or {}).get("clusterIP")
            if ip and ip != "None":
                return str(ip)
    return None
