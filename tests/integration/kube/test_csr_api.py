"""The emulator's CertificateSigningRequest rules, through the real kubernetes_asyncio client:
what requesters and the controller rely on kube-apiserver to enforce."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.serialization import Encoding
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio.client.rest import ApiException
from kubernetes_asyncio.config import new_client_from_config

from ravenproxy.pki import authority
from ravenproxy.pki.issuance import SIGNER_AGENT
from tests.integration.kube.apiserver import NODE_NAME_EXTRA, APIServer
from tests.integration.kube.conftest import csr_request, kubeconfig

USAGES = ["digital signature", "client auth"]


def client_as(server: APIServer, token: str | None) -> k8s_client.ApiClient:
    config = k8s_client.Configuration(host=server.url)
    if token is not None:
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
    return k8s_client.ApiClient(config)


@pytest.fixture
async def sa_api(apiserver: APIServer) -> AsyncIterator[k8s_client.CertificatesV1Api]:
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    async with client_as(apiserver, token) as api:
        yield k8s_client.CertificatesV1Api(api)


@pytest.fixture
async def admin(apiserver: APIServer) -> AsyncIterator[k8s_client.CertificatesV1Api]:
    token = apiserver.add_user("admin", groups=("system:masters", "system:authenticated"))
    async with client_as(apiserver, token) as api:
        yield k8s_client.CertificatesV1Api(api)


def csr_body(name: str = "", **spec: Any) -> dict[str, Any]:
    meta = {"name": name} if name else {"generateName": "edge-1-"}
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": meta,
        "spec": {
            "request": csr_request("edge-1"),
            "signerName": SIGNER_AGENT,
            "usages": USAGES,
            **spec,
        },
    }


def condition(kind: str, reason: str = "Test") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": f"{kind} by test"}


def reason_of(exc: pytest.ExceptionInfo[ApiException]) -> tuple[int, str]:
    return exc.value.status, json.loads(exc.value.body)["message"]


async def test_create_takes_the_identity_from_the_caller(
    apiserver: APIServer, sa_api: k8s_client.CertificatesV1Api
) -> None:
    body = csr_body(
        username="system:node:cloud-1",
        groups=["system:masters"],
        extra={NODE_NAME_EXTRA: ["cloud-1"]},
    )
    body["status"] = {"conditions": [condition("Approved")]}
    made = await sa_api.create_certificate_signing_request(body)
    assert made.metadata.name.startswith("edge-1-") and len(made.metadata.name) > len("edge-1-")
    assert made.spec.username == "system:serviceaccount:kube-system:ravenproxy-agent"
    assert made.spec.groups == [
        "system:serviceaccounts",
        "system:serviceaccounts:kube-system",
        "system:authenticated",
    ]
    assert made.spec.extra[NODE_NAME_EXTRA] == ["edge-1"]
    assert made.status.conditions is None and made.status.certificate is None
    listed = await sa_api.list_certificate_signing_request()
    assert [c.metadata.name for c in listed.items] == [made.metadata.name]


async def test_anonymous_and_unknown_tokens(apiserver: APIServer) -> None:
    async with client_as(apiserver, None) as api:
        made = await k8s_client.CertificatesV1Api(api).create_certificate_signing_request(
            csr_body("anon")
        )
        assert made.spec.username == "system:anonymous"
    async with client_as(apiserver, "nobody-holds-this") as api:
        with pytest.raises(ApiException) as exc:
            await k8s_client.CertificatesV1Api(api).list_certificate_signing_request()
    assert exc.value.status == 401


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"request": base64.b64encode(b"not a csr").decode()}, "spec.request"),
        ({"signerName": ""}, "spec.signerName"),
        ({"usages": ["client auth", "flying"]}, "spec.usages"),
        ({"expirationSeconds": 599}, "spec.expirationSeconds"),
    ],
)
async def test_create_refuses_invalid_requests(
    sa_api: k8s_client.CertificatesV1Api, spec: dict[str, Any], field: str
) -> None:
    body = csr_body("bad")
    body["spec"].update(spec)
    with pytest.raises(ApiException) as exc:
        await sa_api.create_certificate_signing_request(body)
    code, message = reason_of(exc)
    assert code == 422 and field in message


async def test_expiration_of_ten_minutes_is_accepted(
    sa_api: k8s_client.CertificatesV1Api,
) -> None:
    made = await sa_api.create_certificate_signing_request(csr_body("ten", expirationSeconds=600))
    assert made.spec.expiration_seconds == 600


async def test_approval_changes_only_conditions_and_never_both(
    apiserver: APIServer,
    sa_api: k8s_client.CertificatesV1Api,
    admin: k8s_client.CertificatesV1Api,
) -> None:
    made = await sa_api.create_certificate_signing_request(csr_body("one"))
    both = {
        "metadata": {"name": "one"},
        "status": {"conditions": [condition("Approved"), condition("Denied")]},
    }
    with pytest.raises(ApiException) as exc:
        await admin.replace_certificate_signing_request_approval("one", both)
    assert reason_of(exc)[0] == 422
    body = {
        "metadata": {"name": "one"},
        "spec": {**made.spec.to_dict(), "signerName": "example.com/other"},
        "status": {"conditions": [condition("Approved")], "certificate": "Zm9v"},
    }
    approved = await admin.replace_certificate_signing_request_approval("one", body)
    assert [c.type for c in approved.status.conditions] == ["Approved"]
    assert approved.status.conditions[0].last_update_time is not None
    assert approved.status.certificate is None
    assert approved.spec.signer_name == SIGNER_AGENT
    gone = {"metadata": {"name": "one"}, "status": {"conditions": []}}
    with pytest.raises(ApiException) as exc:
        await admin.replace_certificate_signing_request_approval("one", gone)
    code, message = reason_of(exc)
    assert code == 422 and "may not remove" in message
    stored = apiserver.get("certificatesigningrequests", "one")
    assert stored is not None and stored["status"]["conditions"][0]["type"] == "Approved"


async def test_certificate_only_once_and_only_when_approved(
    sa_api: k8s_client.CertificatesV1Api, admin: k8s_client.CertificatesV1Api
) -> None:
    await sa_api.create_certificate_signing_request(csr_body("one"))
    ca, ca_key = authority.generate_ca()
    cert, _key = authority.issue_client_cert(ca, ca_key, "edge-1")
    pem = base64.b64encode(cert.public_bytes(Encoding.PEM)).decode()
    with_cert = {"metadata": {"name": "one"}, "status": {"certificate": pem}}
    with pytest.raises(ApiException) as exc:
        await admin.replace_certificate_signing_request_status("one", with_cert)
    code, message = reason_of(exc)
    assert code == 422 and "Approved" in message
    await admin.replace_certificate_signing_request_approval(
        "one", {"metadata": {"name": "one"}, "status": {"conditions": [condition("Approved")]}}
    )
    # The status subresource cannot take the approval back.
    with_cert["status"]["conditions"] = []
    signed = await admin.replace_certificate_signing_request_status("one", with_cert)
    assert signed.status.certificate == pem
    assert [c.type for c in signed.status.conditions] == ["Approved"]
    other, _ = authority.issue_client_cert(ca, ca_key, "edge-1")
    again = {
        "metadata": {"name": "one"},
        "status": {"certificate": base64.b64encode(other.public_bytes(Encoding.PEM)).decode()},
    }
    with pytest.raises(ApiException) as exc:
        await admin.replace_certificate_signing_request_status("one", again)
    code, message = reason_of(exc)
    assert code == 422 and "certificate" in message


async def test_update_of_the_object_changes_only_metadata(
    sa_api: k8s_client.CertificatesV1Api, admin: k8s_client.CertificatesV1Api
) -> None:
    made = await sa_api.create_certificate_signing_request(csr_body("one"))
    body = {
        "metadata": {"name": "one", "labels": {"a": "b"}},
        "spec": {**made.spec.to_dict(), "signerName": "example.com/other", "usages": ["any"]},
        "status": {"conditions": [condition("Approved")]},
    }
    updated = await admin.replace_certificate_signing_request("one", body)
    assert updated.metadata.labels == {"a": "b"}
    assert updated.metadata.uid == made.metadata.uid
    assert updated.spec.signer_name == SIGNER_AGENT and updated.spec.usages == USAGES
    assert updated.status.conditions is None


async def test_a_kubeconfig_with_a_token_is_that_user(apiserver: APIServer, tmp_path: Path) -> None:
    token = apiserver.add_service_account("ravenproxy-server", "cloud-1")
    path = kubeconfig(tmp_path / "kubeconfig", apiserver, token)
    api = await new_client_from_config(config_file=str(path))
    async with api:
        made = await k8s_client.CertificatesV1Api(api).create_certificate_signing_request(
            csr_body("srv")
        )
    assert made.spec.username == "system:serviceaccount:kube-system:ravenproxy-server"
    assert made.spec.extra[NODE_NAME_EXTRA] == ["cloud-1"]
    assert apiserver.writes("certificatesigningrequests")[-1].user == made.spec.username
