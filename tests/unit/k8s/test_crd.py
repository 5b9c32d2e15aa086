"""The Gateway CRD: Raven's shape, a structural schema, and Raven's webhook rules.

Structural validation runs the CRD's openAPIV3Schema through ``jsonschema`` (Kubernetes'
``x-kubernetes-*`` keywords are ignored there, as unknown keywords); the CEL rules are evaluated
by ``celpy`` (cel-python). Every example is also checked by the controller's Python validator
(``ravenproxy/controller/validation.py``), which must agree with schema + CEL on each one.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml

from ravenproxy.controller.validation import CEL_RULES, validate_spec
from ravenproxy.model.parse import parse_gateway

ROOT = Path(__file__).resolve().parents[3]
CRD_PATH = ROOT / "k8s" / "crd" / "gateways.raven.openyurt.io.yaml"


def load_crd() -> dict[str, Any]:
    (crd,) = [d for d in yaml.safe_load_all(CRD_PATH.read_text()) if d]
    assert isinstance(crd, dict)
    return crd


CRD = load_crd()
(VERSION,) = CRD["spec"]["versions"]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = SCHEMA["properties"]["spec"]
VALIDATOR = jsonschema.Draft7Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
CEL_ENV = celpy.Environment()
CEL_PROGRAMS = [
    (entry["rule"], CEL_ENV.program(CEL_ENV.compile(entry["rule"])))
    for entry in SPEC_SCHEMA["x-kubernetes-validations"]
]


def gateway(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "raven.openyurt.io/v1beta1",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": spec,
    }


# Realistic Gateways as Raven's documentation and tests write them.
VALID: dict[str, dict[str, Any]] = {
    # The cloud gateway: public IP, one node carrying both the proxy server and the VPN.
    "cloud-public-ip": gateway(
        "gw-cloud",
        {
            "exposeType": "PublicIP",
            "proxyConfig": {
                "Replicas": 1,
                "proxyHTTPPort": "10255,9100",
                "proxyHTTPSPort": "10250,9445",
            },
            "tunnelConfig": {"Replicas": 1},
            "endpoints": [
                {"nodeName": "cloud-1", "type": "proxy", "port": 10262, "publicIP": "47.1.2.3"},
                {
                    "nodeName": "cloud-1",
                    "type": "tunnel",
                    "port": 4500,
                    "publicIP": "47.1.2.3",
                    "config": {"vpn-driver": "libreswan"},
                },
            ],
        },
    ),
    # An edge gateway behind NAT: never exposed, its agent dials out.
    "edge-under-nat": gateway(
        "gw-hangzhou",
        {
            "proxyConfig": {"Replicas": 1},
            "tunnelConfig": {"Replicas": 1},
            "endpoints": [
                {"nodeName": "edge-1", "type": "proxy", "underNAT": True},
                {"nodeName": "edge-1", "type": "tunnel", "underNAT": True, "natType": "Symmetric"},
                {"nodeName": "edge-2", "type": "proxy", "underNAT": True},
            ],
        },
    ),
    # A LoadBalancer gateway with two active proxy endpoints.
    "load-balancer": gateway(
        "gw-cloud-lb",
        {
            "exposeType": "LoadBalancer",
            "proxyConfig": {"Replicas": 2, "proxyHTTPPort": "10255"},
            "tunnelConfig": {"Replicas": 1},
            "endpoints": [
                {"nodeName": "cloud-1", "type": "proxy", "port": 10262},
                {"nodeName": "cloud-2", "type": "proxy", "port": 10262, "underNAT": False},
                {"nodeName": "cloud-1", "type": "tunnel", "port": 4500, "publicPort": 4500},
            ],
        },
    ),
    # Raven's webhook test fixture (mockGateway), IPv6 variant of the public address too.
    "raven-mock": gateway(
        "gw-mock",
        {
            "exposeType": "LoadBalancer",
            "proxyConfig": {"Replicas": 1},
            "tunnelConfig": {"Replicas": 1},
            "endpoints": [
                {"nodeName": "node1", "type": "proxy", "publicIP": "192.168.1.1"},
                {"nodeName": "node1", "type": "tunnel", "publicIP": "2001:db8::1"},
            ],
        },
    ),
    # Tunnel endpoints only, with the default proxy Replicas: Raven checks proxy endpoints only
    # when Replicas > 1.
    "tunnel-only": gateway(
        "gw-tunnel",
        {
            "proxyConfig": {"Replicas": 1},
            "tunnelConfig": {"Replicas": 1},
            "endpoints": [{"nodeName": "edge-9", "type": "tunnel", "underNAT": True}],
        },
    ),
    # A bare gateway that only groups nodes (by selector), before any endpoint is declared.
    "selector-only": gateway(
        "gw-group",
        {
            "nodeSelector": {
                "matchLabels": {"raven.openyurt.io/gateway": "gw-group"},
                "matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["hz-a"]}
                ],
            }
        },
    ),
    "empty-spec": gateway("gw-empty", {}),
}


def broken(base: str, **change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(VALID[base])
    spec = doc["spec"]
    for path, value in change.items():
        *parents, last = path.split("__")
        target: Any = spec
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
    return doc


# name → (Gateway, the violation that must be named). Each breaks exactly one rule.
INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "bad-expose-type": (broken("cloud-public-ip", exposeType="NodePort"), "spec.exposeType"),
    "exposed-under-nat": (
        broken("edge-under-nat", exposeType="PublicIP"),
        "the 'underNAT' field for an exposed gateway must be false",
    ),
    "load-balancer-under-nat": (
        broken(
            "raven-mock",
            endpoints__0__underNAT=True,
            endpoints__1__underNAT=True,
        ),
        "the 'underNAT' field for an exposed gateway must be false",
    ),
    "mixed-under-nat": (
        broken("edge-under-nat", endpoints__2__underNAT=False),
        "the 'underNAT' field in endpoints must be the same",
    ),
    "proxy-replicas-over-endpoints": (
        broken("load-balancer", proxyConfig={"Replicas": 3}),
        "'proxyConfig.Replicas' must not exceed the number of proxy endpoints",
    ),
    "proxy-replicas-no-proxy-endpoint": (
        broken("tunnel-only", proxyConfig={"Replicas": 2}),
        "'proxyConfig.Replicas' must not exceed the number of proxy endpoints",
    ),
    "tunnel-replicas-two": (
        broken("load-balancer", tunnelConfig={"Replicas": 2}),
        "'tunnelConfig.Replicas' can not be greater than 1",
    ),
    "bad-endpoint-type": (broken("edge-under-nat", endpoints__1__type="vpn"), ".type"),
    "empty-node-name": (broken("cloud-public-ip", endpoints__0__nodeName=""), ".nodeName"),
    "bad-public-ip": (broken("raven-mock", endpoints__0__publicIP="invalid-ip"), ".publicIP"),
    "negative-replicas": (broken("edge-under-nat", tunnelConfig={"Replicas": -1}), "Replicas"),
    "port-out-of-range": (broken("cloud-public-ip", endpoints__0__port=70000), ".port"),
    "replicas-missing": (
        broken("edge-under-nat", proxyConfig={"proxyHTTPPort": "10255"}),
        "Replicas",
    ),
}

# Type errors: the schema refuses them; the model parser (not the rule checker) would too.
SCHEMA_ONLY_INVALID: dict[str, dict[str, Any]] = {
    "under-nat-string": broken("edge-under-nat", endpoints__0__underNAT="yes"),
    "replicas-string": broken("edge-under-nat", proxyConfig={"Replicas": "2"}),
    "endpoints-not-list": broken("edge-under-nat", endpoints={"nodeName": "edge-1"}),
    "type-missing": broken("edge-under-nat", endpoints__0={"nodeName": "edge-1"}),
}


def schema_errors(doc: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(doc)
    ]


def cel_results(spec: dict[str, Any]) -> dict[str, bool]:
    out = {}
    activation = {"self": celpy.json_to_cel(spec)}
    for rule, program in CEL_PROGRAMS:
        result = program.evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), (rule, result)
        out[rule] = bool(result)
    return out


def api_server_accepts(doc: dict[str, Any]) -> bool:
    """What kube-apiserver decides with this CRD: schema first, then the CEL rules."""
    return not schema_errors(doc) and all(cel_results(doc["spec"]).values())


def inventory_gateways() -> list[dict[str, Any]]:
    docs = yaml.safe_load_all((ROOT / "docs" / "inventory-example.yaml").read_text())
    return [d for d in docs if d and d.get("kind") == "Gateway"]


# --- the CRD object ---------------------------------------------------------------------------


def test_names_scope_and_version_are_ravens() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1"
    assert CRD["metadata"]["name"] == "gateways.raven.openyurt.io"
    spec = CRD["spec"]
    assert spec["group"] == "raven.openyurt.io"
    assert spec["scope"] == "Cluster"
    assert spec["names"]["kind"] == "Gateway"
    assert spec["names"]["plural"] == "gateways"
    assert spec["names"]["shortNames"] == ["gw"]
    assert VERSION["name"] == "v1beta1" and VERSION["served"] and VERSION["storage"]
    assert VERSION["subresources"] == {"status": {}}


def test_spec_and_status_fields_follow_ravens_json() -> None:
    spec = SPEC_SCHEMA["properties"]
    assert set(spec) == {"nodeSelector", "proxyConfig", "tunnelConfig", "endpoints", "exposeType"}
    # Raven's JSON tag is capitalised: `json:"Replicas"`.
    assert set(spec["proxyConfig"]["properties"]) == {"Replicas", "proxyHTTPPort", "proxyHTTPSPort"}
    assert set(spec["tunnelConfig"]["properties"]) == {"Replicas"}
    endpoint = {
        "nodeName",
        "type",
        "port",
        "underNAT",
        "natType",
        "publicIP",
        "publicPort",
        "config",
    }
    assert set(spec["endpoints"]["items"]["properties"]) == endpoint
    assert spec["exposeType"]["enum"] == ["", "PublicIP", "LoadBalancer"]
    assert spec["endpoints"]["items"]["properties"]["type"]["enum"] == ["proxy", "tunnel"]
    status = SCHEMA["properties"]["status"]["properties"]
    assert set(status) == {"nodes", "activeEndpoints"}
    assert set(status["nodes"]["items"]["properties"]) == {"nodeName", "privateIP", "subnets"}
    assert set(status["activeEndpoints"]["items"]["properties"]) == endpoint


_JUNCTOR_FORBIDDEN = {"type", "description", "default", "additionalProperties", "nullable"}


def _structural_problems(node: Any, path: str, in_junctor: bool = False) -> list[str]:
    """Kubernetes' structural-schema rules that a hand-written schema can break."""
    problems: list[str] = []
    if not isinstance(node, dict):
        return [f"{path}: not a mapping"]
    if in_junctor:
        problems += [f"{path}: {k} inside a junctor" for k in _JUNCTOR_FORBIDDEN & set(node)]
    elif "type" not in node and not node.get("x-kubernetes-int-or-string"):
        problems.append(f"{path}: no type")
    if node.get("type") == "array" and "items" not in node:
        problems.append(f"{path}: array without items")
    if "x-kubernetes-validations" in node and node.get("type") != "object":
        problems.append(f"{path}: CEL rules on a non-object")
    for key, child in (node.get("properties") or {}).items():
        problems += _structural_problems(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        problems += _structural_problems(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        problems += _structural_problems(node["additionalProperties"], f"{path}{{}}")
    for junctor in ("anyOf", "allOf", "oneOf"):
        for i, child in enumerate(node.get(junctor) or []):
            problems += _structural_problems(child, f"{path}.{junctor}[{i}]", in_junctor=True)
    return problems


def test_the_schema_is_structural() -> None:
    assert _structural_problems(SCHEMA, "") == []
    # CEL cost is bounded only if the lists the rules walk are bounded.
    assert SPEC_SCHEMA["properties"]["endpoints"]["maxItems"] <= 1000


def test_the_cel_rules_are_the_controllers_rules_verbatim() -> None:
    assert SPEC_SCHEMA["x-kubernetes-validations"] == [r.crd_entry() for r in CEL_RULES]


# --- examples ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALID))
def test_ravens_examples_are_accepted(name: str) -> None:
    doc = VALID[name]
    assert schema_errors(doc) == []
    assert all(cel_results(doc["spec"]).values()), cel_results(doc["spec"])
    assert validate_spec(doc["spec"]) == []
    parse_gateway(doc)  # and the model reads it


def test_the_inventory_example_gateways_are_accepted() -> None:
    gateways = inventory_gateways()
    assert gateways
    for doc in gateways:
        assert api_server_accepts(doc), doc["metadata"]["name"]
        assert validate_spec(doc["spec"]) == []


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_gateways_are_refused_naming_the_rule(name: str) -> None:
    doc, names = INVALID[name]
    assert not api_server_accepts(doc)
    violations = validate_spec(doc["spec"])
    assert violations, name
    assert any(names in f"{v.field} {v.message}" for v in violations), violations
    cel_failed = [r for r, ok in cel_results(doc["spec"]).items() if not ok]
    schema_failed = schema_errors(doc)
    # Each example breaks one rule, in one place: the schema or one CEL rule.
    assert len(cel_failed) + bool(schema_failed) == 1, (cel_failed, schema_failed)


@pytest.mark.parametrize("name", sorted(SCHEMA_ONLY_INVALID))
def test_type_errors_are_refused_by_the_schema(name: str) -> None:
    assert schema_errors(SCHEMA_ONLY_INVALID[name])


ALL_EXAMPLES = [
    *VALID.values(),
    *(doc for doc, _ in INVALID.values()),
    *inventory_gateways(),
]


@pytest.mark.parametrize("index", range(len(ALL_EXAMPLES)))
def test_cel_text_and_python_rules_agree(index: int) -> None:
    doc = ALL_EXAMPLES[index]
    spec = doc["spec"]
    by_text = {r.rule: r for r in CEL_RULES}
    for rule, ok in cel_results(spec).items():
        assert by_text[rule].check(spec) == ok, (by_text[rule].name, doc["metadata"]["name"])
    # And overall: the API server with this CRD and the controller's validator decide alike.
    assert api_server_accepts(doc) == (validate_spec(spec) == []), doc["metadata"]["name"]
