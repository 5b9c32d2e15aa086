"""Unknown Gateway fields: refused with their path in the inventory (strict), ignored from the
API (the CRD's schema prunes them before the controller reads them)."""

from __future__ import annotations

from typing import Any

import pytest

from ravenproxy.errors import InventoryError
from ravenproxy.model.inventory import parse_inventory
from ravenproxy.model.parse import parse_gateway


def gateway(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "raven.openyurt.io/v1beta1",
        "kind": "Gateway",
        "metadata": {"name": "gw-1"},
        "spec": {"proxyConfig": {"Replicas": 2}, **spec},
    }


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (gateway(proxyConfig={"replicas": 2}),
         "spec.proxyConfig.replicas: unknown field (did you mean Replicas?)"),
        (gateway(tunnelConfig={"replica": 2}),
         "spec.tunnelConfig.replica: unknown field (did you mean Replicas?)"),
        (gateway(proxyConfig={"proxyHttpPort": "80"}),
         "spec.proxyConfig.proxyHttpPort: unknown field (did you mean proxyHTTPPort?)"),
        (gateway(endpoints=[{"nodeName": "n", "type": "proxy", "publicIp": "1.2.3.4"}]),
         "spec.endpoints[0].publicIp: unknown field (did you mean publicIP?)"),
        (gateway(nodeselector={}), "spec.nodeselector: unknown field (did you mean nodeSelector?)"),
        (gateway(colour="blue"), "spec.colour: unknown field"),
        ({**gateway(), "Spec": {}}, "Spec: unknown field (did you mean spec?)"),
    ],
)  # fmt: skip
def test_strict_names_the_path_and_the_field_meant(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_gateway(doc, strict=True)
    assert str(caught.value) == f"Gateway gw-1: {message}"


def test_from_the_api_unknown_fields_are_ignored() -> None:
    gw = parse_gateway(gateway(proxyConfig={"Replicas": 2, "replicas": 3}, colour="blue"))
    assert gw.proxy_config.replicas == 2


def test_the_inventory_is_strict_and_says_where() -> None:
    text = (
        "apiVersion: raven.openyurt.io/v1beta1\nkind: Gateway\nmetadata: {name: gw-1}\n"
        "spec: {proxyConfig: {replicas: 2}}\n"
    )
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    assert str(caught.value) == (
        "inv.yaml: document 0: Gateway gw-1: spec.proxyConfig.replicas: unknown field "
        "(did you mean Replicas?)"
    )


def test_a_status_written_by_a_newer_controller_is_not_checked() -> None:
    doc = {**gateway(), "status": {"activeEndpoints": [], "somethingNew": 1}}
    assert parse_gateway(doc, strict=True).name == "gw-1"
