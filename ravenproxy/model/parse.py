"""Kubernetes-shaped dicts (YAML inventory documents or API objects) → model objects.

Errors name the object and the field, e.g.
``Node edge-1: status.daemonEndpoints.kubeletEndpoint.Port: expected an integer 1-65535, got 'x'``.

A Gateway parsed ``strict`` (the inventory) refuses a field its schema does not have, naming it
and the field it most likely meant: ``Gateway gw-1: spec.proxyConfig.replicas: unknown field
(did you mean Replicas?)`` (Raven's field is ``Replicas``; ``replicas`` would silently mean the
default, 1). From the Kubernetes API a Gateway is not strict: the CRD's structural schema prunes
unknown fields before anyone reads them, and the controller must not refuse an object the API
server accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ravenproxy.errors import InventoryError
from ravenproxy.model.objects import (
    DEFAULT_KUBELET_PORT,
    ENDPOINT_PROXY,
    ENDPOINT_TUNNEL,
    EXPOSE_TYPES,
    Endpoint,
    Gateway,
    Node,
    NodeAddress,
    NodeInfo,
    Pod,
    ProxyConfig,
    TunnelConfig,
    frozen_map,
    parse_port_list,
)
from ravenproxy.model.quote import brief, one_line

GATEWAY_API_VERSIONS = ("raven.openyurt.io/v1beta1", "raven.openyurt.io/v1alpha1")


# The Gateway's schema (Raven's v1beta1, k8s/crd/), for strict parsing.
_GATEWAY_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
_SPEC_FIELDS = ("endpoints", "exposeType", "nodeSelector", "proxyConfig", "tunnelConfig")
_PROXY_FIELDS = ("Replicas", "proxyHTTPPort", "proxyHTTPSPort")
_TUNNEL_FIELDS = ("Replicas",)
_SELECTOR_FIELDS = ("matchExpressions", "matchLabels")
_ENDPOINT_FIELDS = (
    "config",
    "natType",
    "nodeName",
    "port",
    "publicIP",
    "publicPort",
    "type",
    "underNAT",
)


def _suggest(key: str, known: tuple[str, ...]) -> str:
    """`` (did you mean X?)`` for the known field ``key`` most likely meant, else ""."""
    for name in known:
        if name.lower() == key.lower():
            return f" (did you mean {name}?)"
    import difflib  # a misspelt key only: not loaded by every agent reading its model

    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


class _Ctx:
    def __init__(self, what: str, strict: bool = False) -> None:
        self.what = what
        self.strict = strict

    def known(self, obj: Mapping[str, Any], path: str, fields: tuple[str, ...]) -> None:
        """When strict, a key of ``obj`` that is not in ``fields`` is an error naming it."""
        if not self.strict:
            return
        for key in obj:
            if key not in fields:
                where = f"{path}.{key}" if path else str(key)
                raise self.fail(where, "unknown field" + _suggest(str(key), fields))

    def fail(self, path: str, message: str) -> InventoryError:
        # One bounded line: names and keys come from the file and may be arbitrarily long.
        return InventoryError(one_line(f"{self.what}: {path}: {message}"))

    def mapping(self, obj: Any, path: str) -> Mapping[str, Any]:
        if obj is None:
            return {}
        if not isinstance(obj, Mapping):
            raise self.fail(path, f"expected a mapping, got {type(obj).__name__}")
        return obj

    def seq(self, obj: Any, path: str) -> list[Any]:
        if obj is None:
            return []
        if not isinstance(obj, list):
            raise self.fail(path, f"expected a list, got {type(obj).__name__}")
        return obj

    def string(self, obj: Any, path: str, default: str = "") -> str:
        if obj is None:
            return default
        if isinstance(obj, bool) or not isinstance(obj, str | int):
            raise self.fail(path, f"expected a string, got {brief(obj)}")
        return str(obj)

    def integer(self, obj: Any, path: str, default: int, lo: int = 0, hi: int = 65535) -> int:
        if obj is None:
            return default
        if isinstance(obj, bool):
            raise self.fail(path, f"expected an integer {lo}-{hi}, got {brief(obj)}")
        try:
            value = int(obj)
        except (TypeError, ValueError):
            raise self.fail(path, f"expected an integer {lo}-{hi}, got {brief(obj)}") from None
        if not lo <= value <= hi:
            raise self.fail(path, f"expected an integer {lo}-{hi}, got {brief(obj)}")
        return value

    def boolean(self, obj: Any, path: str) -> bool:
        if obj is None:
            return False
        if isinstance(obj, bool):
            return obj
        if isinstance(obj, str) and obj.lower() in ("true", "false"):
            return obj.lower() == "true"
        raise self.fail(path, f"expected true or false, got {brief(obj)}")

    def str_map(self, obj: Any, path: str) -> Mapping[str, str]:
        data = self.mapping(obj, path)
        return frozen_map({str(k): self.string(v, f"{path}.{k}") for k, v in data.items()})


def _name(doc: Mapping[str, Any], kind: str) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise InventoryError(f"{kind}: metadata.name is missing")
    return name


def parse_node(doc: Mapping[str, Any]) -> Node:
    name = _name(doc, "Node")
    c = _Ctx(f"Node {name}")
    meta = c.mapping(doc.get("metadata"), "metadata")
    spec = c.mapping(doc.get("spec"), "spec")
    status = c.mapping(doc.get("status"), "status")
    addresses = []
    for i, item in enumerate(c.seq(status.get("addresses"), "status.addresses")):
        a = c.mapping(item, f"status.addresses[{i}]")
        addresses.append(
            NodeAddress(
                type=c.string(a.get("type"), f"status.addresses[{i}].type"),
                address=c.string(a.get("address"), f"status.addresses[{i}].address"),
            )
        )
    daemon = c.mapping(status.get("daemonEndpoints"), "status.daemonEndpoints")
    kubelet = c.mapping(daemon.get("kubeletEndpoint"), "status.daemonEndpoints.kubeletEndpoint")
    port = c.integer(
        kubelet.get("Port"),
        "status.daemonEndpoints.kubeletEndpoint.Port",
        DEFAULT_KUBELET_PORT,
        lo=0,
    )
    cidrs = [c.string(x, "spec.podCIDRs[]") for x in c.seq(spec.get("podCIDRs"), "spec.podCIDRs")]
    single = c.string(spec.get("podCIDR"), "spec.podCIDR")
    if single and single not in cidrs:
        cidrs.insert(0, single)
    ready = False
    for i, item in enumerate(c.seq(status.get("conditions"), "status.conditions")):
        cond = c.mapping(item, f"status.conditions[{i}]")
        if cond.get("type") == "Ready":
            ready = str(cond.get("status")) == "True"
    return Node(
        name=name,
        labels=c.str_map(meta.get("labels"), "metadata.labels"),
        annotations=c.str_map(meta.get("annotations"), "metadata.annotations"),
        addresses=tuple(addresses),
        kubelet_port=port or DEFAULT_KUBELET_PORT,
        pod_cidrs=tuple(cidrs),
        ready=ready,
        resource_version=c.string(meta.get("resourceVersion"), "metadata.resourceVersion"),
    )


def _endpoint(c: _Ctx, obj: Any, path: str) -> Endpoint:
    e = c.mapping(obj, path)
    if path.startswith("spec."):
        c.known(e, path, _ENDPOINT_FIELDS)
    node_name = c.string(e.get("nodeName"), f"{path}.nodeName")
    if not node_name:
        raise c.fail(f"{path}.nodeName", "is required")
    type_ = c.string(e.get("type"), f"{path}.type")
    if type_ not in (ENDPOINT_PROXY, ENDPOINT_TUNNEL):
        raise c.fail(f"{path}.type", f"must be 'proxy' or 'tunnel', got {brief(type_)}")
    return Endpoint(
        node_name=node_name,
        type=type_,
        port=c.integer(e.get("port"), f"{path}.port", 0),
        under_nat=c.boolean(e.get("underNAT"), f"{path}.underNAT"),
        nat_type=c.string(e.get("natType"), f"{path}.natType"),
        public_ip=c.string(e.get("publicIP"), f"{path}.publicIP"),
        public_port=c.integer(e.get("publicPort"), f"{path}.publicPort", 0),
        config=c.str_map(e.get("config"), f"{path}.config"),
    )


def parse_gateway(doc: Mapping[str, Any], *, strict: bool = False) -> Gateway:
    """A Gateway; ``strict`` (the inventory): a field the schema lacks is an error."""
    name = _name(doc, "Gateway")
    c = _Ctx(f"Gateway {name}", strict)
    c.known(doc, "", _GATEWAY_FIELDS)
    api = doc.get("apiVersion")
    if api is not None and api not in GATEWAY_API_VERSIONS:
        raise c.fail(
            "apiVersion", f"expected one of {', '.join(GATEWAY_API_VERSIONS)}, got {brief(api)}"
        )
    meta = c.mapping(doc.get("metadata"), "metadata")
    spec = c.mapping(doc.get("spec"), "spec")
    status = c.mapping(doc.get("status"), "status")
    pc = c.mapping(spec.get("proxyConfig"), "spec.proxyConfig")
    tc = c.mapping(spec.get("tunnelConfig"), "spec.tunnelConfig")
    c.known(spec, "spec", _SPEC_FIELDS)
    c.known(pc, "spec.proxyConfig", _PROXY_FIELDS)
    c.known(tc, "spec.tunnelConfig", _TUNNEL_FIELDS)
    proxy = ProxyConfig(
        replicas=c.integer(pc.get("Replicas"), "spec.proxyConfig.Replicas", 1, hi=1000),
        proxy_http_port=c.string(pc.get("proxyHTTPPort"), "spec.proxyConfig.proxyHTTPPort"),
        proxy_https_port=c.string(pc.get("proxyHTTPSPort"), "spec.proxyConfig.proxyHTTPSPort"),
    )
    for field_name, text in (
        ("proxyHTTPPort", proxy.proxy_http_port),
        ("proxyHTTPSPort", proxy.proxy_https_port),
    ):
        try:
            parse_port_list(text)
        except ValueError as exc:
            raise c.fail(f"spec.proxyConfig.{field_name}", str(exc)) from None
    expose = c.string(spec.get("exposeType"), "spec.exposeType")
    if expose not in EXPOSE_TYPES:
        raise c.fail("spec.exposeType", f"must be one of {EXPOSE_TYPES!r}, got {brief(expose)}")
    selector = c.mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    c.known(selector, "spec.nodeSelector", _SELECTOR_FIELDS)
    match_labels = c.str_map(selector.get("matchLabels"), "spec.nodeSelector.matchLabels")
    status_nodes = []
    for i, item in enumerate(c.seq(status.get("nodes"), "status.nodes")):
        n = c.mapping(item, f"status.nodes[{i}]")
        status_nodes.append(
            NodeInfo(
                node_name=c.string(n.get("nodeName"), f"status.nodes[{i}].nodeName"),
                private_ip=c.string(n.get("privateIP"), f"status.nodes[{i}].privateIP"),
                subnets=tuple(
                    c.string(s, f"status.nodes[{i}].subnets[]")
                    for s in c.seq(n.get("subnets"), f"status.nodes[{i}].subnets")
                ),
            )
        )
    return Gateway(
        name=name,
        node_selector=match_labels,
        proxy_config=proxy,
        tunnel_config=TunnelConfig(
            replicas=c.integer(tc.get("Replicas"), "spec.tunnelConfig.Replicas", 1, hi=1000)
        ),
        endpoints=tuple(
            _endpoint(c, e, f"spec.endpoints[{i}]")
            for i, e in enumerate(c.seq(spec.get("endpoints"), "spec.endpoints"))
        ),
        expose_type=expose,
        status_nodes=tuple(status_nodes),
        active_endpoints=tuple(
            _endpoint(c, e, f"status.activeEndpoints[{i}]")
            for i, e in enumerate(c.seq(status.get("activeEndpoints"), "status.activeEndpoints"))
        ),
        resource_version=c.string(meta.get("resourceVersion"), "metadata.resourceVersion"),
    )


def parse_pod(doc: Mapping[str, Any]) -> Pod:
    name = _name(doc, "Pod")
    c = _Ctx(f"Pod {name}")
    meta = c.mapping(doc.get("metadata"), "metadata")
    spec = c.mapping(doc.get("spec"), "spec")
    status = c.mapping(doc.get("status"), "status")
    return Pod(
        namespace=c.string(meta.get("namespace"), "metadata.namespace", "default") or "default",
        name=name,
        node_name=c.string(spec.get("nodeName"), "spec.nodeName"),
        pod_ip=c.string(status.get("podIP"), "status.podIP"),
        resource_version=c.string(meta.get("resourceVersion"), "metadata.resourceVersion"),
    )
