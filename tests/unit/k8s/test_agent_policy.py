"""The agent's Gateway policy (k8s/agent-gateway-policy.yaml): the agent may change only its own
node's tunnel endpoint ``config.publicKey``, and its key publisher's update is exactly that.

The policy's CEL is evaluated by ``celpy`` as kube-apiserver evaluates a
ValidatingAdmissionPolicy: the match conditions first (a request that matches none is not this
policy's business), then the variables in order (``variables.<name>``), then every validation;
an evaluation error refuses (``failurePolicy: Fail``). ``object``/``oldObject`` are the Gateway
after and before, ``request`` the AdmissionRequest with the caller's ``userInfo``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from ravenproxy.l3.publish import GROUP, PLURAL, with_public_key
from tests.unit.k8s.test_crd import api_server_accepts

ROOT = Path(__file__).resolve().parents[3]
POLICY_PATH = ROOT / "k8s" / "agent-gateway-policy.yaml"
NODE_KEY = "authentication.kubernetes.io/node-name"


def load() -> tuple[dict[str, Any], dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(POLICY_PATH.read_text()) if d]
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    return policy, binding


POLICY, BINDING = load()
SPEC = POLICY["spec"]
ENV = celpy.Environment()


def program(expression: str) -> Any:
    return ENV.program(ENV.compile(expression))


MATCH = [(m["name"], program(m["expression"])) for m in SPEC["matchConditions"]]
VARIABLES = [(v["name"], program(v["expression"])) for v in SPEC["variables"]]
VALIDATIONS = [
    (
        program(v["expression"]),
        program(v["messageExpression"]) if "messageExpression" in v else None,
        v.get("message", ""),
    )
    for v in SPEC["validations"]
]


@dataclass
class Decision:
    matched: bool
    refusals: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.refusals


def user(
    name: str = "system:serviceaccount:kube-system:ravenproxy-agent", node: str | None = "edge-1"
) -> dict[str, Any]:
    """userInfo as kube-apiserver fills it for a pod-bound service-account token."""
    info: dict[str, Any] = {
        "username": name,
        "uid": "9f0c2b6e-0000-4000-8000-000000000001",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system"],
    }
    if node is not None:
        info["extra"] = {
            "authentication.kubernetes.io/credential-id": ["JTI=7ee52be0"],
            NODE_KEY: [node],
            "authentication.kubernetes.io/node-uid": ["497e9d9a"],
            "authentication.kubernetes.io/pod-name": [f"ravenproxy-agent-{node}"],
            "authentication.kubernetes.io/pod-uid": ["e87dbbd6"],
        }
    return info


def decide(old: dict[str, Any], new: dict[str, Any], who: dict[str, Any]) -> Decision:
    request = {
        "operation": "UPDATE",
        "name": new["metadata"]["name"],
        "resource": {"group": GROUP, "version": "v1beta1", "resource": PLURAL},
        "userInfo": who,
    }
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel(request),
    }
    for _name, prog in MATCH:
        if not bool(prog.evaluate(activation)):
            return Decision(matched=False)
    variables = celpy.celtypes.MapType()
    activation["variables"] = variables
    for name, prog in VARIABLES:
        try:
            variables[celpy.celtypes.StringType(name)] = prog.evaluate(activation)
        except celpy.CELEvalError as exc:  # evaluated lazily by kube-apiserver: same outcome
            variables[celpy.celtypes.StringType(name)] = exc
    decision = Decision(matched=True)
    for check, message_expression, message in VALIDATIONS:
        try:
            ok = check.evaluate(activation)
        except celpy.CELEvalError as exc:
            decision.refusals.append(f"evaluation error (failurePolicy Fail): {exc}")
            continue
        assert isinstance(ok, celpy.celtypes.BoolType), ok
        if not ok:
            text = message_expression.evaluate(activation) if message_expression else message
            decision.refusals.append(str(text))
    return decision


def gateway(name: str, endpoints: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "raven.openyurt.io/v1beta1",
        "kind": "Gateway",
        "metadata": {
            "name": name,
            "resourceVersion": "4711",
            "generation": 3,
            "labels": {"app.kubernetes.io/part-of": "edge"},
            "annotations": {"example.com/owner": "ops"},
        },
        "spec": {
            "proxyConfig": {"Replicas": 1},
            "tunnelConfig": {"Replicas": 1},
            **spec,
            "endpoints": endpoints,
        },
        "status": {
            "nodes": [
                {"nodeName": "edge-1", "privateIP": "10.2.0.1", "subnets": ["10.244.1.0/24"]}
            ],
            "activeEndpoints": [{"nodeName": "edge-1", "type": "tunnel", "underNAT": True}],
        },
    }


EDGE = gateway(
    "gw-edge",
    [
        {"nodeName": "edge-1", "type": "proxy", "underNAT": True},
        {"nodeName": "edge-1", "type": "tunnel", "underNAT": True, "natType": "Symmetric"},
        {"nodeName": "edge-2", "type": "proxy", "underNAT": True},
        {
            "nodeName": "edge-2",
            "type": "tunnel",
            "underNAT": True,
            "config": {"publicKey": "EDGE2KEY=", "vpn-driver": "wireguard"},
        },
    ],
)
# edge-1 already published once, with another key and a driver setting beside it.
EDGE_KEYED = copy.deepcopy(EDGE)
EDGE_KEYED["spec"]["endpoints"][1]["config"] = {"publicKey": "OLDKEY=", "vpn-driver": "wireguard"}
OTHER = gateway(
    "gw-other",
    [{"nodeName": "edge-5", "type": "tunnel", "port": 4500, "config": {"publicKey": "K5="}}],
    exposeType="PublicIP",
)


def changed(doc: dict[str, Any], *edits: tuple[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with each ``path`` (dots; list indexes as numbers; a value of
    ``DELETE`` removes the key) set."""
    out = copy.deepcopy(doc)
    for path, value in edits:
        *parents, last = path.split(".")
        target: Any = out
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        key: Any = int(last) if last.isdigit() else last
        if value is DELETE:
            del target[key]
        else:
            target[key] = value
    return out


DELETE = object()


# --- the agent's own key: allowed -------------------------------------------------------------


def test_publishing_a_first_key_is_allowed() -> None:
    new = with_public_key(EDGE, "edge-1", "NEWKEY=")
    assert new is not None
    assert new["spec"]["endpoints"][1]["config"] == {"publicKey": "NEWKEY="}
    decision = decide(EDGE, new, user())
    assert decision.matched and decision.allowed, decision.refusals


def test_replacing_its_key_keeps_the_other_config_and_is_allowed() -> None:
    new = with_public_key(EDGE_KEYED, "edge-1", "NEWKEY=")
    assert new is not None
    assert new["spec"]["endpoints"][1]["config"] == {
        "publicKey": "NEWKEY=",
        "vpn-driver": "wireguard",
    }
    assert decide(EDGE_KEYED, new, user()).allowed


def test_the_publisher_fits_the_policy_for_every_node_and_gateway_shape() -> None:
    """What publish.py sends (``with_public_key``, verbatim as the replace's body) passes for
    each node on the gateway it is in, and the second agent's publish on top of the first."""
    gateways = [
        EDGE,
        EDGE_KEYED,
        OTHER,
        gateway("gw-bare", [{"nodeName": "edge-1", "type": "tunnel"}]),
    ]
    for old in gateways:
        for endpoint in old["spec"]["endpoints"]:
            node = endpoint["nodeName"]
            new = with_public_key(old, node, f"KEY-{node}=")
            if new is None:  # no tunnel endpoint for that node: the publisher writes nothing
                continue
            assert api_server_accepts(new)
            decision = decide(old, new, user(node=node))
            assert decision.allowed, (old["metadata"]["name"], node, decision.refusals)
            again = with_public_key(new, "edge-2", "KEY-edge-2-bis=")
            if again is not None:
                assert decide(new, again, user(node="edge-2")).allowed


def test_an_unchanged_update_is_allowed() -> None:
    assert decide(EDGE, copy.deepcopy(EDGE), user()).allowed


def test_server_set_metadata_may_differ() -> None:
    # resourceVersion, generation and managedFields are the API server's to change.
    old = changed(EDGE, ("metadata.managedFields", [{"manager": "agent"}]))
    new = changed(
        with_public_key(EDGE, "edge-1", "NEWKEY=") or {},
        ("metadata.resourceVersion", "4712"),
        ("metadata.generation", 4),
        ("metadata.managedFields", [{"manager": "agent"}, {"manager": "ravenproxy"}]),
    )
    assert decide(old, new, user()).allowed


# --- anything else: refused -------------------------------------------------------------------

REFUSED: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    # (old, new, who)
    "another-nodes-key": (
        EDGE,
        changed(EDGE, ("spec.endpoints.3.config.publicKey", "MINE=")),
        user(),
    ),
    "another-nodes-key-removed": (
        EDGE,
        changed(EDGE, ("spec.endpoints.3.config", DELETE)),
        user(),
    ),
    "its-key-on-another-node-with-its-own-token": (
        EDGE,
        with_public_key(EDGE, "edge-2", "EVIL=") or {},
        user(node="edge-1"),
    ),
    "another-gateways-node": (
        OTHER,
        with_public_key(OTHER, "edge-5", "EVIL=") or {},
        user(node="edge-1"),
    ),
    "its-proxy-endpoint-config": (
        EDGE,
        changed(EDGE, ("spec.endpoints.0.config", {"publicKey": "NEWKEY="})),
        user(),
    ),
    "other-config-of-its-tunnel-endpoint": (
        EDGE_KEYED,
        changed(EDGE_KEYED, ("spec.endpoints.1.config.vpn-driver", "libreswan")),
        user(),
    ),
    "config-key-added-beside-its-key": (
        EDGE,
        changed(EDGE, ("spec.endpoints.1.config", {"publicKey": "K=", "extra": "x"})),
        user(),
    ),
    "config-key-removed-beside-its-key": (
        EDGE_KEYED,
        changed(EDGE_KEYED, ("spec.endpoints.1.config", {"publicKey": "K="})),
        user(),
    ),
    "its-public-ip": (
        EDGE,
        changed(EDGE, ("spec.endpoints.1.publicIP", "203.0.113.9")),
        user(),
    ),
    "its-nat-flag": (
        OTHER,
        changed(OTHER, ("spec.endpoints.0.underNAT", False)),
        user(node="edge-5"),
    ),
    "its-nat-type-removed": (EDGE, changed(EDGE, ("spec.endpoints.1.natType", DELETE)), user()),
    "its-port-added": (EDGE, changed(EDGE, ("spec.endpoints.1.port", 4501)), user()),
    "its-endpoint-turned-proxy": (
        EDGE,
        changed(EDGE, ("spec.endpoints.1.type", "proxy")),
        user(),
    ),
    "an-endpoint-added-for-itself": (
        EDGE,
        changed(
            EDGE,
            (
                "spec.endpoints",
                [
                    *EDGE["spec"]["endpoints"],
                    {"nodeName": "edge-1", "type": "tunnel", "underNAT": True},
                ],
            ),
        ),
        user(),
    ),
    "its-endpoint-removed": (
        EDGE,
        changed(
            EDGE, ("spec.endpoints", [e for i, e in enumerate(EDGE["spec"]["endpoints"]) if i != 1])
        ),
        user(),
    ),
    "another-endpoint-removed": (
        EDGE,
        changed(EDGE, ("spec.endpoints", EDGE["spec"]["endpoints"][:3])),
        user(),
    ),
    "its-endpoint-moved-first": (
        EDGE,
        changed(
            EDGE,
            ("spec.endpoints", [EDGE["spec"]["endpoints"][i] for i in (1, 0, 2, 3)]),
        ),
        user(),
    ),
    "others-reordered": (
        EDGE,
        changed(
            EDGE,
            ("spec.endpoints", [EDGE["spec"]["endpoints"][i] for i in (2, 1, 0, 3)]),
        ),
        user(),
    ),
    "expose-type": (
        OTHER,
        changed(OTHER, ("spec.exposeType", "LoadBalancer")),
        user(node="edge-5"),
    ),
    "proxy-replicas": (EDGE, changed(EDGE, ("spec.proxyConfig.Replicas", 2)), user()),
    "tunnel-config-removed": (EDGE, changed(EDGE, ("spec.tunnelConfig", DELETE)), user()),
    "node-selector-added": (
        EDGE,
        changed(EDGE, ("spec.nodeSelector", {"matchLabels": {"x": "y"}})),
        user(),
    ),
    "label-changed": (
        EDGE,
        changed(EDGE, ("metadata.labels", {"app.kubernetes.io/part-of": "x"})),
        user(),
    ),
    "label-added": (
        EDGE,
        changed(EDGE, ("metadata.labels", {"a": "b", **EDGE["metadata"]["labels"]})),
        user(),
    ),
    "annotations-removed": (EDGE, changed(EDGE, ("metadata.annotations", DELETE)), user()),
    "finalizer-added": (EDGE, changed(EDGE, ("metadata.finalizers", ["example.com/keep"])), user()),
    "owner-added": (
        EDGE,
        changed(EDGE, ("metadata.ownerReferences", [{"kind": "Node", "name": "edge-1"}])),
        user(),
    ),
    "status-changed": (
        EDGE,
        changed(EDGE, ("status.activeEndpoints", [])),
        user(),
    ),
    # Its own key, with other changes riding along: the whole update is refused.
    "its-key-and-another-key": (
        EDGE,
        changed(
            with_public_key(EDGE, "edge-1", "NEWKEY=") or {},
            ("spec.endpoints.3.config.publicKey", "EVIL="),
        ),
        user(),
    ),
    "its-key-and-expose-type": (
        OTHER,
        changed(
            with_public_key(OTHER, "edge-5", "NEWKEY=") or {},
            ("spec.exposeType", "LoadBalancer"),
        ),
        user(node="edge-5"),
    ),
    # Whose node it is must come from the token, never from guesswork.
    "no-node-in-the-token": (EDGE, with_public_key(EDGE, "edge-1", "K=") or {}, user(node=None)),
    "two-tunnel-endpoints-for-the-node": (
        changed(EDGE, ("spec.endpoints.0.type", "tunnel")),
        changed(
            EDGE,
            ("spec.endpoints.0.type", "tunnel"),
            ("spec.endpoints.1.config", {"publicKey": "K="}),
        ),
        user(),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_anything_but_its_own_key_is_refused(case: str) -> None:
    old, new, who = REFUSED[case]
    assert new and new != old, "the example must change something"
    # The CRD's own rules take each of them: the refusal is the policy's.
    assert api_server_accepts(old) and api_server_accepts(new), case
    decision = decide(old, new, who)
    assert decision.matched
    assert not decision.allowed, case
    assert all(r and "evaluation error" not in r for r in decision.refusals), decision.refusals


def test_a_refusal_names_the_node_and_what_is_allowed() -> None:
    old, new, who = REFUSED["another-nodes-key"]
    (message,) = decide(old, new, who).refusals
    assert "edge-1" in message and "its own tunnel endpoint" in message
    old, new, who = REFUSED["no-node-in-the-token"]
    assert any(NODE_KEY in r for r in decide(old, new, who).refusals)


# --- who is matched ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "system:serviceaccount:kube-system:ravenproxy-controller",
        "system:serviceaccount:kube-system:ravenproxy-server",
        "system:serviceaccount:other-ns:ravenproxy-agent",
        "kubernetes-admin",
        "system:node:edge-1",
    ],
)
def test_other_users_are_not_matched(name: str) -> None:
    old, new, _ = REFUSED["expose-type"]
    assert decide(old, new, user(name=name, node=None)).matched is False


# --- the objects ------------------------------------------------------------------------------


def test_the_policy_denies_on_error_and_is_bound_to_deny() -> None:
    assert POLICY["apiVersion"] == BINDING["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert SPEC["failurePolicy"] == "Fail"
    assert BINDING["spec"]["policyName"] == POLICY["metadata"]["name"]
    assert BINDING["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in BINDING["spec"]  # every Gateway (cluster-scoped)
    assert "paramKind" not in SPEC and "paramRef" not in BINDING["spec"]
    (rule,) = SPEC["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [GROUP] and rule["resources"] == [PLURAL]
    assert rule["apiVersions"] == ["*"]


def test_the_match_condition_names_the_agents_service_account() -> None:
    from tests.unit.k8s.test_manifests import workload

    pod = workload("ravenproxy-agent")
    account = pod["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = pod["metadata"]["namespace"]
    name = f"system:serviceaccount:{namespace}:{account}"
    old, new, _ = REFUSED["expose-type"]
    assert decide(old, new, user(name=name)).matched
    # And its token is the pod-bound one that carries the node (the default projected token).
    assert pod["spec"]["template"]["spec"].get("automountServiceAccountToken", True) is True
