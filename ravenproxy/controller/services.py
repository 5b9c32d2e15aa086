"""The internal and public Services (with their Endpoints) as desired objects, and the plan that
turns the existing ones into them. Pure: Kubernetes dicts in, Kubernetes dicts and ops out.

Ownership is by label: the planner creates, updates and deletes only objects that carry
``app.kubernetes.io/managed-by: ravenproxy``. A foreign object that happens to hold a name we want
is reported as a conflict and left alone. Public Services are named from (gateway, node), so the
desired set after a failover or a Replicas change names exactly the Services that should exist and
the plan deletes the rest: no orphans, no duplicates (both open bugs in Raven).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ravenproxy.kube.labels import LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY
from ravenproxy.model.objects import ENDPOINT_PROXY, EXPOSE_LOAD_BALANCER, Gateway
from ravenproxy.model.server_names import INTERNAL_SERVICE as INTERNAL_SERVICE
from ravenproxy.model.server_names import NAMESPACE as NAMESPACE
from ravenproxy.model.snapshot import Model

PUBLIC_SERVICE_PREFIX = "x-raven-proxy-svc-"

HTTP_TARGET_PORT = 10264
HTTPS_TARGET_PORT = 10263
TUNNEL_PORT = 10262
# A Service needs at least one port; an exposed gateway that names none gets the kubelet's.
DEFAULT_HTTP_PORTS = (10255,)
DEFAULT_HTTPS_PORTS = (10250,)

COMPONENT_INTERNAL = "internal-proxy"
COMPONENT_PUBLIC = "public-proxy"
# Gateway and node names may be longer than a label value allows, so they go in annotations.
ANNOTATION_GATEWAY = "ravenproxy/gateway"
ANNOTATION_NODE = "ravenproxy/node"

_NAME_MAX = 63
_KIND_ORDER = {"Service": 0, "Endpoints": 1}
_ACTION_ORDER = {"create": 0, "update": 1, "delete": 2}

Action = Literal["create", "update", "delete"]


def _labels(component: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: component}


def _exposed(model: Model) -> list[Gateway]:
    return [model.gateways[name] for name in sorted(model.gateways) if model.gateways[name].exposed]


def _internal_ports(gateways: Iterable[Gateway]) -> list[tuple[str, int, int]]:
    """(name, port, targetPort) per distinct front port, sorted by port.

    A port listed both as HTTP and HTTPS becomes HTTPS: one Service cannot carry the same TCP
    port twice, and kubelet-style ports (10250) are the ones that speak TLS.
    """
    http: set[int] = set()
    https: set[int] = set()
    for gw in gateways:
        http.update(gw.proxy_config.http_ports or DEFAULT_HTTP_PORTS)
        https.update(gw.proxy_config.https_ports or DEFAULT_HTTPS_PORTS)
    ports = [(f"https-{p}", p, HTTPS_TARGET_PORT) for p in https]
    ports += [(f"http-{p}", p, HTTP_TARGET_PORT) for p in http - https]
    return sorted(ports, key=lambda t: t[1])


def internal_service(model: Model) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``kube-system/x-raven-proxy-internal-svc`` and its Endpoints, or None (absent) when no
    gateway is exposed. Reads the proxy active endpoints from ``gateway.active_endpoints``, so
    pass the model with the election applied (see :mod:`ravenproxy.controller.desired`)."""
    gateways = _exposed(model)
    if not gateways:
        return None
    ports = _internal_ports(gateways)
    addresses: dict[str, str] = {}
    for gw in gateways:
        for ep in gw.active_of(ENDPOINT_PROXY):
            node = model.node(ep.node_name)
            if node is not None and node.internal_ip:
                addresses.setdefault(node.internal_ip, node.name)
    meta: dict[str, Any] = {
        "name": INTERNAL_SERVICE,
        "namespace": NAMESPACE,
        "labels": _labels(COMPONENT_INTERNAL),
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "ports": [
                {"name": name, "port": port, "protocol": "TCP", "targetPort": target}
                for name, port, target in ports
            ],
        },
    }
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": _copy_meta(meta),
        "subsets": _subsets(addresses, [(name, target) for name, _port, target in ports]),
    }
    return service, endpoints


def _copy_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(meta)
    for key in ("labels", "annotations"):
        if key in out:
            out[key] = dict(out[key])
    return out


def _subsets(addresses: Mapping[str, str], ports: Sequence[tuple[str, int]]) -> list[Any]:
    if not addresses:
        return []
    return [
        {
            "addresses": [{"ip": ip, "nodeName": addresses[ip]} for ip in sorted(addresses)],
            "ports": [{"name": name, "port": port, "protocol": "TCP"} for name, port in ports],
        }
    ]


_INVALID = re.compile(r"[^a-z0-9-]")


def public_service_name(gateway: str, node: str) -> str:
    """``x-raven-proxy-svc-<gw>-<node>``, made a valid DNS-1035 label of at most 63 characters.

    Whenever the plain name would be altered (too long, or characters such as '.' replaced), a
    hash of the exact (gateway, node) pair is appended, so two different pairs never share a
    name ("a.b" and "a-b" both sanitise to "a-b").
    """
    plain = f"{PUBLIC_SERVICE_PREFIX}{gateway}-{node}"
    clean = _INVALID.sub("-", plain.lower())
    if clean == plain and len(clean) <= _NAME_MAX and not clean.endswith("-"):
        return clean
    digest = hashlib.sha256(f"{gateway}\0{node}".encode()).hexdigest()[:8]
    head = clean[: _NAME_MAX - len(digest) - 1].rstrip("-")
    return f"{head}-{digest}"


def public_services(model: Model) -> list[dict[str, Any]]:
    """One LoadBalancer Service (TCP, externalTrafficPolicy Local) plus Endpoints per proxy
    active endpoint of every ``exposeType: LoadBalancer`` gateway."""
    out: list[dict[str, Any]] = []
    for name in sorted(model.gateways):
        gw = model.gateways[name]
        if gw.expose_type != EXPOSE_LOAD_BALANCER:
            continue
        for ep in gw.active_of(ENDPOINT_PROXY):
            node = model.node(ep.node_name)
            if node is None or not node.internal_ip:
                continue
            port = ep.port or TUNNEL_PORT
            meta: dict[str, Any] = {
                "name": public_service_name(gw.name, ep.node_name),
                "namespace": NAMESPACE,
                "labels": _labels(COMPONENT_PUBLIC),
                "annotations": {ANNOTATION_GATEWAY: gw.name, ANNOTATION_NODE: ep.node_name},
            }
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": meta,
                    "spec": {
                        "type": "LoadBalancer",
                        "externalTrafficPolicy": "Local",
                        "ports": [
                            {"name": "tunnel", "port": port, "protocol": "TCP", "targetPort": port}
                        ],
                    },
                }
            )
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Endpoints",
                    "metadata": _copy_meta(meta),
                    "subsets": _subsets({node.internal_ip: node.name}, [("tunnel", port)]),
                }
            )
    return out


def desired_services(model: Model) -> list[dict[str, Any]]:
    """Every Service and Endpoints object the controller owns, for a model with the election
    applied."""
    out: list[dict[str, Any]] = []
    internal = internal_service(model)
    if internal is not None:
        out.extend(internal)
    out.extend(public_services(model))
    return out


def load_balancer_ingress(existing: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], str]:
    """(gateway, node) → the first ingress IP the cloud gave our LoadBalancer Service."""
    out: dict[tuple[str, str], str] = {}
    for obj in existing:
        if obj.get("kind", "Service") != "Service" or not is_owned(obj):
            continue
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        gw, node = ann.get(ANNOTATION_GATEWAY), ann.get(ANNOTATION_NODE)
        if not gw or not node:
            continue
        ingress = ((obj.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
        for item in ingress:
            ip = (item or {}).get("ip")
            if ip:
                out[(gw, node)] = ip
                break
    return out


# --- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One write. ``body`` is the full desired object (create, update); ``resource_version`` is
    the existing object's, for an optimistic-concurrency update."""

    action: Action
    kind: str
    namespace: str
    name: str
    body: Mapping[str, Any] | None = None
    resource_version: str = ""


@dataclass(frozen=True)
class ServicePlan:
    ops: tuple[Op, ...]
    # (kind, namespace, name) we want but a foreign object holds; we never overwrite it.
    conflicts: tuple[tuple[str, str, str], ...] = ()


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))


def is_owned(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(LABEL_MANAGED_BY) == MANAGED_BY)


def contains(actual: Any, wanted: Any) -> bool:
    """Does ``actual`` already say everything ``wanted`` says?

    The API server adds fields we never set (clusterIP, nodePort, defaults, status), so a plain
    equality would rewrite every object on every reconcile. Mappings match when each wanted key
    matches; lists match element-wise with equal length; an absent list equals an empty one.
    """
    if isinstance(wanted, Mapping):
        if not isinstance(actual, Mapping):
            return False
        return all(contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        if actual is None:
            return not wanted
        if not isinstance(actual, list) or len(actual) != len(wanted):
            return False
        return all(contains(a, w) for a, w in zip(actual, wanted, strict=True))
    return bool(actual == wanted)


def plan_services(
    existing: Sequence[Mapping[str, Any]], desired: Sequence[Mapping[str, Any]]
) -> ServicePlan:
    """The ops that make the owned objects among ``existing`` equal ``desired``.

    Creates come before deletes, so across a failover the new public Service exists before the
    old one goes; within an action, Services precede their Endpoints.
    """
    have = {_key(o): o for o in existing}
    want: dict[tuple[str, str, str], Mapping[str, Any]] = {}
    for obj in desired:
        key = _key(obj)
        if key in want:
            raise ValueError(f"desired objects name {key} twice")
        want[key] = obj
    ops: list[Op] = []
    conflicts: list[tuple[str, str, str]] = []
    for key, obj in want.items():
        kind, ns, name = key
        cur = have.get(key)
        if cur is None:
            ops.append(Op("create", kind, ns, name, obj))
        elif not is_owned(cur):
            conflicts.append(key)
        elif not contains(cur, obj):
            rv = str((cur.get("metadata") or {}).get("resourceVersion", ""))
            ops.append(Op("update", kind, ns, name, obj, rv))
    for key, cur in have.items():
        if key not in want and is_owned(cur):
            ops.append(Op("delete", *key))
    ops.sort(
        key=lambda o: (_ACTION_ORDER[o.action], _KIND_ORDER.get(o.kind, 9), o.namespace, o.name)
    )
    return ServicePlan(tuple(ops), tuple(sorted(conflicts)))
