"""The labels of the controller's metrics: which write, which failure, which result."""

from __future__ import annotations

import aiohttp
import pytest

from ravenproxy.controller.reconciler import error_kind
from ravenproxy.controller.writer import write_labels
from ravenproxy.kube.client import KubeError
from ravenproxy.metrics import ControllerMetrics


@pytest.mark.parametrize(
    ("method", "labels"),
    [
        ("create_namespaced_service", ("service", "create")),
        ("patch_namespaced_endpoints", ("endpoints", "patch")),
        ("delete_namespaced_service", ("service", "delete")),
        ("patch_cluster_custom_object_status", ("gateway_status", "patch")),
        ("create_namespaced_config_map", ("config_map", "create")),
        ("replace_certificate_signing_request_status",
         ("certificate_signing_request_status", "update")),
    ],
)  # fmt: skip
def test_write_labels(method: str, labels: tuple[str, str]) -> None:
    assert write_labels(method) == labels


def test_error_kinds() -> None:
    assert error_kind(TimeoutError()) == "timeout"
    assert error_kind(aiohttp.ClientConnectionError()) == "http"
    assert error_kind(KubeError(500, "boom")) == "api"


def test_write_results() -> None:
    m = ControllerMetrics()
    for status in (201, 409, 404, 403, 500, None):
        m.write("service", "create", status)
    got = {
        s.labels["result"]: s.value
        for metric in m.writes.collect()
        for s in metric.samples
        if s.name.endswith("_total")
    }
    assert got == {"ok": 1, "conflict": 1, "not_found": 1, "refused": 1, "error": 2}
