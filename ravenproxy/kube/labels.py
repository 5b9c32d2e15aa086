"""The labels every Kubernetes object ravenproxy writes carries: the controller's Services and
Endpoints and the servers' agent Leases. Only objects with ``managed-by: ravenproxy`` are ever
changed or deleted."""

from __future__ import annotations

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "ravenproxy"
LABEL_COMPONENT = "app.kubernetes.io/component"
