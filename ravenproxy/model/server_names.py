"""Who may hold a proxy server certificate, and the names it carries.

One statement of the rule, asked by both sides of Kubernetes issuance: the server when it
builds its certificate signing request (its SANs), and the controller when it decides whether
to approve one (a server certificate only for a cloud gateway node, and only for names that
node may be reached by). Pure: a :class:`~ravenproxy.model.snapshot.Model` in, names out.
"""

from __future__ import annotations

from collections.abc import Iterable

from ravenproxy.model.objects import Node
from ravenproxy.model.snapshot import Model

NAMESPACE = "kube-system"
INTERNAL_SERVICE = "x-raven-proxy-internal-svc"
# Nodes labelled so are edge workers (OpenYurt's label); a gateway node without it is in the
# cloud, where the server DaemonSet runs (k8s/server.yaml selects the same nodes).
EDGE_WORKER_LABEL = "openyurt.io/is-edge-worker"


def is_cloud_gateway_node(node: Node) -> bool:
    """A node of some gateway that is not an edge worker: where a proxy server runs."""
    return node.gateway is not None and node.labels.get(EDGE_WORKER_LABEL) != "true"


def internal_service_dns(cluster_domain: str = "cluster.local") -> tuple[str, ...]:
    """The DNS names of the internal Service, shortest first."""
    base = f"{INTERNAL_SERVICE}.{NAMESPACE}"
    return (INTERNAL_SERVICE, base, f"{base}.svc", f"{base}.svc.{cluster_domain}")


def server_names(
    model: Model,
    node_name: str,
    *,
    service_ip: str | None = None,
    cluster_domain: str = "cluster.local",
    extra: Iterable[str] = (),
) -> tuple[str, ...]:
    """The SANs of the server on ``node_name``, in a stable order without repeats: the node's
    name and addresses, its public-IP annotation, the public IPs of its gateway's endpoints,
    the internal Service's ClusterIP (``service_ip``) and DNS names, then ``extra``.

    A node the model does not know gets only its name, the Service names and ``extra``."""
    names: list[str] = [node_name]
    node = model.node(node_name)
    if node is not None:
        names.extend(a.address for a in node.addresses)
        if node.public_ip_annotation:
            names.append(node.public_ip_annotation)
        gateway = model.gateways.get(node.gateway) if node.gateway else None
        if gateway is not None:
            for endpoint in (*gateway.endpoints, *gateway.active_endpoints):
                if endpoint.public_ip:
                    names.append(endpoint.public_ip)
    if service_ip:
        names.append(service_ip)
    names.extend(internal_service_dns(cluster_domain))
    names.extend(extra)
    return tuple(dict.fromkeys(n for n in names if n))
