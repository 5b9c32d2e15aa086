"""The agent-liveness Leases: names, labels and time format, one definition for both ends.

The server publishes one ``coordination.k8s.io/v1`` Lease per connected agent
(:mod:`ravenproxy.server.liveness`), ``kube-system/ravenproxy-agent-<node>``; the controller
watches them by label (:mod:`ravenproxy.controller.agents`). Both sides read these names from
here, so neither imports the other.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ravenproxy.kube.labels import LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY

NAMESPACE = "kube-system"
LEASE_PREFIX = "ravenproxy-agent-"
COMPONENT = "agent-liveness"
LABELS: Mapping[str, str] = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_COMPONENT: COMPONENT}
LABEL_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_COMPONENT}={COMPONENT}"
# The node's name, whole: a Lease name may have had to shorten it.
ANNOTATION_NODE = "ravenproxy/node"

RENEW_INTERVAL = 10.0
LEASE_DURATION = 30
_NAME_MAX = 253


def lease_name(node: str) -> str:
    """``ravenproxy-agent-<node>``; a name too long for the API keeps a readable prefix and a
    digest of the whole node name."""
    name = LEASE_PREFIX + node
    if len(name) <= _NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    head = (LEASE_PREFIX + node)[: _NAME_MAX - len(digest) - 1].rstrip(".-")
    return f"{head}-{digest}"


def lease_node(lease: Mapping[str, Any]) -> str:
    """The node an agent Lease is about: its annotation, else its name without the prefix."""
    meta = lease.get("metadata") or {}
    node = (meta.get("annotations") or {}).get(ANNOTATION_NODE)
    if node:
        return str(node)
    return str(meta.get("name", "")).removeprefix(LEASE_PREFIX)


def micro_time(t: float) -> str:
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def default_identity() -> str:
    """Who holds a Lease: POD_NAME from the downward API; outside a pod, the host name and the
    pid, which tell two processes on one host apart."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
