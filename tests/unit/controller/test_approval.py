"""The issuance rule (controller/approval.py): approve only a CSR of our signers whose requester
is bound to the node in its CN; every other case is a one-line denial or left alone."""

from __future__ import annotations

import base64
from dataclasses import replace
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from ravenproxy.controller.approval import Approve, Deny, Ignore, decide
from ravenproxy.model.objects import GATEWAY_LABEL, frozen_map
from ravenproxy.model.server_names import EDGE_WORKER_LABEL, INTERNAL_SERVICE
from ravenproxy.pki.issuance import SIGNER_AGENT, SIGNER_SERVER
from tests.unit.controller.builders import ep, gateway, model, node
from tests.unit.controller.csrs import csr, request, sa_of

SERVER_USAGES = ("digital signature", "server auth")
EDGE = replace(
    node("edge-1", "gw-edge", ip="10.2.0.1"),
    labels=frozen_map({GATEWAY_LABEL: "gw-edge", EDGE_WORKER_LABEL: "true"}),
)
MODEL = model(
    node("cloud-1", "gw-cloud", ip="10.1.0.1", public_ip="203.0.113.5"),
    node("plain-1", None, ip="10.3.0.1"),
    EDGE,
    gateway("gw-cloud", (ep("cloud-1", public_ip="198.51.100.7"),)),
    gateway("gw-edge", (ep("edge-1"),)),
)


def server_csr(*, dns: tuple[str, ...] = ("cloud-1",), ips: tuple[str, ...] = ()) -> Any:
    return csr(
        request("cloud-1", dns=dns, ips=ips),
        signer=SIGNER_SERVER,
        usages=SERVER_USAGES,
        requester=sa_of("cloud-1", "ravenproxy-server"),
    )


def denied(obj: dict[str, Any], **kw: Any) -> str:
    decision = decide(obj, MODEL, **kw)
    assert isinstance(decision, Deny), decision
    assert "\n" not in decision.reason
    return decision.reason


# --- approve -----------------------------------------------------------------------------------


def test_an_agent_csr_of_a_token_bound_to_its_node_is_approved() -> None:
    assert decide(csr(request("edge-1")), MODEL) == Approve("edge-1", SIGNER_AGENT)


def test_the_node_identity_itself_may_ask() -> None:
    obj = csr(request("edge-1"), requester={"username": "system:node:edge-1"})
    assert decide(obj, MODEL) == Approve("edge-1", SIGNER_AGENT)


def test_an_agent_csr_may_name_its_node_as_san_and_tolerates_key_encipherment() -> None:
    obj = csr(
        request("edge-1", dns=["edge-1"]),
        usages=("digital signature", "key encipherment", "client auth"),
    )
    assert decide(obj, MODEL) == Approve("edge-1", SIGNER_AGENT)


def test_an_rsa_2048_key_is_accepted() -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert isinstance(decide(csr(request("edge-1", key=key)), MODEL), Approve)


def test_a_server_csr_for_the_names_of_its_cloud_gateway_node_is_approved() -> None:
    obj = server_csr(
        dns=("cloud-1", INTERNAL_SERVICE, "tunnel.example.com"),
        ips=("10.1.0.1", "203.0.113.5", "198.51.100.7", "10.96.0.10"),
    )
    decision = decide(obj, MODEL, service_ip="10.96.0.10", extra_sans=("tunnel.example.com",))
    assert decision == Approve("cloud-1", SIGNER_SERVER)


# --- ignore ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signer", ["kubernetes.io/kube-apiserver-client", "kubernetes.io/kubelet-serving", ""]
)
def test_other_signers_are_ignored_whatever_they_ask(signer: str) -> None:
    obj = csr(request("cloud-1"), signer=signer, requester={"username": "mallory"})
    assert isinstance(decide(obj, MODEL), Ignore)


@pytest.mark.parametrize("done", ["Approved", "Denied", "Failed"])
def test_a_decided_csr_is_ignored(done: str) -> None:
    assert isinstance(decide(csr(request("edge-1"), conditions=[done]), MODEL), Ignore)


# --- deny: who asks ------------------------------------------------------------------------------


def test_a_token_bound_to_another_node_is_denied() -> None:
    obj = csr(request("edge-1"), requester=sa_of("edge-2"))
    assert denied(obj) == (
        "requester system:serviceaccount:kube-system:ravenproxy-agent is bound to node edge-2, "
        "not edge-1"
    )


def test_another_nodes_identity_is_denied() -> None:
    obj = csr(request("edge-1"), requester={"username": "system:node:cloud-1"})
    assert denied(obj) == "requester system:node:cloud-1 is bound to node cloud-1, not edge-1"


@pytest.mark.parametrize(
    "requester",
    [
        {"username": "admin", "groups": ["system:masters"]},
        {"username": "system:serviceaccount:kube-system:ravenproxy-agent"},
        # A user (not a service account) cannot be bound by an extra it may have set itself.
        {"username": "alice", "extra": {"authentication.kubernetes.io/node-name": ["edge-1"]}},
        {
            "username": "system:serviceaccount:kube-system:x",
            "extra": {"authentication.kubernetes.io/node-name": ["edge-1", "edge-2"]},
        },
    ],
)
def test_a_requester_bound_to_no_node_is_denied(requester: dict[str, Any]) -> None:
    assert "is bound to no node" in denied(csr(request("edge-1"), requester=requester))


def test_a_node_that_does_not_exist_is_denied() -> None:
    obj = csr(request("edge-9"), requester=sa_of("edge-9"))
    assert denied(obj) == "node edge-9 does not exist"


# --- deny: what is asked -------------------------------------------------------------------------


def test_a_request_that_is_not_a_csr_is_denied() -> None:
    obj = csr(base64.b64encode(b"hello").decode())
    assert "not a PEM certificate request" in denied(obj)


def test_a_request_whose_signature_does_not_verify_is_denied() -> None:
    pem = base64.b64decode(request("edge-1")).decode()
    lines = pem.splitlines()
    body = base64.b64decode("".join(lines[1:-1]))
    tampered = body[:-8] + bytes(b ^ 0x55 for b in body[-8:])  # inside the signature
    text = base64.b64encode(tampered).decode()
    new_pem = "\n".join([lines[0], *[text[i : i + 64] for i in range(0, len(text), 64)], lines[-1]])
    reason = denied(csr(base64.b64encode(new_pem.encode()).decode()))
    assert "signature" in reason or "not a PEM certificate request" in reason


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        (lambda: request("edge-1", organization="system:masters"), "subject must be exactly"),
        (lambda: request(None), "subject must be exactly"),
        (lambda: request("Edge_1"), "invalid node name"),
    ],
)
def test_a_subject_other_than_cn_node_is_denied(req: Any, expected: str) -> None:
    assert expected in denied(csr(req(), requester=sa_of("Edge_1")))


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (lambda: ec.generate_private_key(ec.SECP384R1()), "only P-256"),
        (lambda: rsa.generate_private_key(public_exponent=65537, key_size=1024), "1024 bits"),
    ],
)
def test_weak_or_unexpected_keys_are_denied(key: Any, expected: str) -> None:
    assert expected in denied(csr(request("edge-1", key=key())))


@pytest.mark.parametrize(
    "usages",
    [
        ("digital signature",),
        ("digital signature", "client auth", "server auth"),
        ("client auth",),
        ("digital signature", "client auth", "cert sign"),
    ],
)
def test_agent_usages_other_than_the_signers_are_denied(usages: tuple[str, ...]) -> None:
    assert "are not those of" in denied(csr(request("edge-1"), usages=usages))


def test_server_usages_with_client_auth_are_denied() -> None:
    obj = server_csr()
    obj["spec"]["usages"] = ["digital signature", "server auth", "client auth"]
    assert "are not those of" in denied(obj)


@pytest.mark.parametrize(
    "req",
    [
        lambda: request("edge-1", dns=["edge-2"]),
        lambda: request("edge-1", ips=["10.2.0.1"]),
        lambda: request("edge-1", dns=["edge-1", "evil.example.com"]),
    ],
)
def test_an_agent_csr_with_other_sans_is_denied(req: Any) -> None:
    assert "an agent certificate carries no SAN but its node name" in denied(csr(req()))


def test_a_uri_san_is_denied() -> None:
    assert "only DNS and IP" in denied(csr(request("edge-1", uri="spiffe://x/y")))


# --- deny: server certificates ---------------------------------------------------------------


def test_a_server_csr_of_an_edge_node_is_denied() -> None:
    obj = csr(
        request("edge-1", dns=["edge-1"]),
        signer=SIGNER_SERVER,
        usages=SERVER_USAGES,
        requester=sa_of("edge-1", "ravenproxy-server"),
    )
    assert denied(obj) == "node edge-1 is not a cloud gateway node: no server certificate"


def test_a_server_csr_of_a_node_of_no_gateway_is_denied() -> None:
    obj = csr(
        request("plain-1", dns=["plain-1"]),
        signer=SIGNER_SERVER,
        usages=SERVER_USAGES,
        requester=sa_of("plain-1", "ravenproxy-server"),
    )
    assert "not a cloud gateway node" in denied(obj)


@pytest.mark.parametrize(
    ("dns", "ips", "expected"),
    [
        (("cloud-1", "kubernetes.default"), (), "SAN kubernetes.default is not a name"),
        (("cloud-1",), ("10.2.0.1",), "SAN 10.2.0.1 is not an address"),
        (("cloud-1",), ("10.96.0.10",), "SAN 10.96.0.10 is not an address"),
        (("tunnel.example.com",), (), "SAN tunnel.example.com is not a name"),
        ((), (), "needs at least one SAN"),
    ],
)
def test_a_server_csr_with_a_san_outside_its_names_is_denied(
    dns: tuple[str, ...], ips: tuple[str, ...], expected: str
) -> None:
    # No service_ip and no --server-san given: the ClusterIP and extra names are not allowed.
    assert expected in denied(server_csr(dns=dns, ips=ips))
