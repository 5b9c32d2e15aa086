"""The controller approving, denying and signing CSRs in the API emulator: requesters are real
kubernetes_asyncio clients holding emulated service-account tokens, the controller is
``run_controller_with`` (as in test_controller.py), and the API fills in who asked."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes_asyncio import client as k8s_client

from ravenproxy.controller.runtime import ControllerSettings, run_controller_with
from ravenproxy.controller.services import INTERNAL_SERVICE
from ravenproxy.controller.settings import IssuerSettings
from ravenproxy.pki import authority
from ravenproxy.pki.issuance import (
    CA_BUNDLE,
    CA_BUNDLE_KEY,
    CA_NAMESPACE,
    CA_SECRET,
    SIGNER_AGENT,
    SIGNER_SERVER,
)
from tests.helpers import eventually, free_port, spawn_python, stop
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import csr_request, kubeconfig
from tests.integration.kube.test_controller import FAST, gateway_obj, node_obj

CSRS = "certificatesigningrequests"
AGENT_USAGES = ["digital signature", "client auth"]
SERVER_USAGES = ["digital signature", "server auth"]
LIFETIME = dt.timedelta(seconds=60)


async def cluster(api: APIServer) -> None:
    await api.put("gateways", gateway_obj("gw-cloud", ["cloud-1"], "LoadBalancer"))
    await api.put("gateways", gateway_obj("gw-edge", ["edge-1", "edge-2"]))
    await api.put("nodes", node_obj("cloud-1", "10.1.0.1", "gw-cloud"))
    for name, ip in (("edge-1", "10.2.0.1"), ("edge-2", "10.2.0.2")):
        node = node_obj(name, ip, "gw-edge")
        node["metadata"]["labels"]["openyurt.io/is-edge-worker"] = "true"
        await api.put("nodes", node)


def settings(identity: str = "replica-a", **kw: Any) -> ControllerSettings:
    return ControllerSettings(
        interval=0.3,
        lease_duration=kw.pop("lease_duration", 3),
        renew_deadline=kw.pop("renew_deadline", 2.5),
        retry_period=1,
        identity=identity,
        watch=FAST,
        agent_leases=False,
        certificates=IssuerSettings(max_lifetime=LIFETIME, interval=1.0),
        **kw,
    )


@contextlib.asynccontextmanager
async def controller(
    apiserver: APIServer, identity: str = "replica-a", **kw: Any
) -> AsyncIterator[None]:
    config = k8s_client.Configuration(host=apiserver.url)
    async with k8s_client.ApiClient(config) as api:
        api.user_agent = identity
        task = asyncio.create_task(run_controller_with(api, settings(identity, **kw)))
        try:
            yield
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def requester(
    apiserver: APIServer, token: str
) -> AsyncIterator[k8s_client.CertificatesV1Api]:
    config = k8s_client.Configuration(host=apiserver.url)
    config.api_key = {"BearerToken": token}
    config.api_key_prefix = {"BearerToken": "Bearer"}
    async with k8s_client.ApiClient(config) as api:
        yield k8s_client.CertificatesV1Api(api)


async def ask(
    apiserver: APIServer,
    token: str,
    name: str,
    cn: str,
    *,
    signer: str = SIGNER_AGENT,
    usages: list[str] | None = None,
    dns: tuple[str, ...] = (),
    expiration: int | None = 3600,
) -> None:
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "request": csr_request(cn, dns=dns),
            "signerName": signer,
            "usages": usages or (AGENT_USAGES if signer == SIGNER_AGENT else SERVER_USAGES),
        },
    }
    if expiration is not None:
        body["spec"]["expirationSeconds"] = expiration
    async with requester(apiserver, token) as certs:
        await certs.create_certificate_signing_request(body)


def csr(apiserver: APIServer, name: str) -> dict[str, Any]:
    obj = apiserver.get(CSRS, name)
    assert obj is not None
    return obj


def condition_types(obj: dict[str, Any]) -> list[str]:
    return [c["type"] for c in (obj.get("status") or {}).get("conditions") or []]


def certificate(obj: dict[str, Any]) -> x509.Certificate | None:
    data = (obj.get("status") or {}).get("certificate")
    if not data:
        return None
    return x509.load_pem_x509_certificates(base64.b64decode(data))[0]


def ca_of(apiserver: APIServer) -> x509.Certificate:
    secret = apiserver.get("secrets", CA_SECRET, CA_NAMESPACE)
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    return x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))


def events_about(apiserver: APIServer, name: str) -> list[dict[str, Any]]:
    return [e for e in apiserver.items("events") if e["involvedObject"]["name"] == name]


async def signed(apiserver: APIServer, name: str) -> x509.Certificate:
    await eventually(lambda: certificate(csr(apiserver, name)) is not None, within=10)
    cert = certificate(csr(apiserver, name))
    assert cert is not None
    return cert


async def test_a_csr_of_a_token_bound_to_its_node_is_approved_and_signed(
    apiserver: APIServer,
) -> None:
    await cluster(apiserver)
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    async with controller(apiserver):
        await ask(apiserver, token, "edge-1-agent", "edge-1")
        cert = await signed(apiserver, "edge-1-agent")
    obj = csr(apiserver, "edge-1-agent")
    assert condition_types(obj) == ["Approved"]
    (approved,) = obj["status"]["conditions"]
    assert approved["reason"] and "edge-1" in approved["message"]
    ca = ca_of(apiserver)
    assert authority.is_issued_by(cert, ca)
    assert authority.cert_node_name(cert) == "edge-1"
    # expirationSeconds asked an hour; --max-cert-lifetime caps it at 60 s.
    now = dt.datetime.now(dt.UTC)
    assert now < cert.not_valid_after_utc <= now + LIFETIME
    bundle = apiserver.get("configmaps", CA_BUNDLE, CA_NAMESPACE)
    assert bundle is not None
    assert x509.load_pem_x509_certificates(bundle["data"][CA_BUNDLE_KEY].encode()) == [ca]
    (event,) = events_about(apiserver, "edge-1-agent")
    assert (event["type"], event["reason"]) == ("Normal", "CSRApproved")
    assert event["involvedObject"]["kind"] == "CertificateSigningRequest"


async def test_a_csr_bound_to_another_node_is_denied_and_never_signed(
    apiserver: APIServer,
) -> None:
    await cluster(apiserver)
    token = apiserver.add_service_account("ravenproxy-agent", "edge-2")
    async with controller(apiserver):
        await ask(apiserver, token, "steal-edge-1", "edge-1")
        await eventually(lambda: condition_types(csr(apiserver, "steal-edge-1")) == ["Denied"])
        # A good one asked afterwards is signed: every pass that could sign the bad one is over.
        good = apiserver.add_service_account("ravenproxy-agent", "edge-1")
        await ask(apiserver, good, "edge-1-agent", "edge-1")
        await signed(apiserver, "edge-1-agent")
        await asyncio.sleep(1.5)
    obj = csr(apiserver, "steal-edge-1")
    assert condition_types(obj) == ["Denied"]
    assert certificate(obj) is None
    reason = obj["status"]["conditions"][0]["message"]
    assert reason == (
        "requester system:serviceaccount:kube-system:ravenproxy-agent is bound to node edge-2, "
        "not edge-1"
    )
    (event,) = events_about(apiserver, "steal-edge-1")
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "CSRDenied", reason)


async def test_a_csr_of_another_signer_is_left_exactly_as_it_was(apiserver: APIServer) -> None:
    await cluster(apiserver)
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    await ask(
        apiserver,
        token,
        "someone-elses",
        "edge-1",
        signer="kubernetes.io/kube-apiserver-client",
    )
    before = csr(apiserver, "someone-elses")
    async with controller(apiserver):
        await ask(apiserver, token, "edge-1-agent", "edge-1")
        await signed(apiserver, "edge-1-agent")
        await asyncio.sleep(1.5)
    assert csr(apiserver, "someone-elses") == before
    assert not [w for w in apiserver.writes(CSRS) if "someone-elses" in w.path]
    assert events_about(apiserver, "someone-elses") == []


async def test_server_csrs_only_for_cloud_gateway_nodes_and_their_names(
    apiserver: APIServer,
) -> None:
    await cluster(apiserver)
    cloud = apiserver.add_service_account("ravenproxy-server", "cloud-1")
    edge = apiserver.add_service_account("ravenproxy-server", "edge-1")
    async with controller(apiserver):
        await eventually(
            lambda: apiserver.get("services", INTERNAL_SERVICE, "kube-system") is not None
        )
        svc = apiserver.get("services", INTERNAL_SERVICE, "kube-system")
        assert svc is not None
        cluster_ip = svc["spec"]["clusterIP"]
        await ask(apiserver, edge, "edge-server", "edge-1", signer=SIGNER_SERVER, dns=("edge-1",))
        await ask(
            apiserver,
            cloud,
            "cloud-server-bad",
            "cloud-1",
            signer=SIGNER_SERVER,
            dns=("cloud-1", "kubernetes.default.svc"),
        )
        await ask(
            apiserver,
            cloud,
            "cloud-server",
            "cloud-1",
            signer=SIGNER_SERVER,
            dns=("cloud-1", f"{INTERNAL_SERVICE}.kube-system.svc"),
        )
        cert = await signed(apiserver, "cloud-server")
        await eventually(
            lambda: (
                condition_types(csr(apiserver, "edge-server")) == ["Denied"]
                and condition_types(csr(apiserver, "cloud-server-bad")) == ["Denied"]
            )
        )
    assert authority.is_issued_by(cert, ca_of(apiserver))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "cloud-1",
        f"{INTERNAL_SERVICE}.kube-system.svc",
    ]
    assert cluster_ip  # the Service the SANs are checked against exists
    edge_reason = csr(apiserver, "edge-server")["status"]["conditions"][0]["message"]
    assert edge_reason == "node edge-1 is not a cloud gateway node: no server certificate"
    bad_reason = csr(apiserver, "cloud-server-bad")["status"]["conditions"][0]["message"]
    assert bad_reason == "SAN kubernetes.default.svc is not a name of the server on cloud-1"
    for name in ("edge-server", "cloud-server-bad"):
        assert certificate(csr(apiserver, name)) is None


async def test_the_ca_secret_is_created_once_and_reused_after_a_restart(
    apiserver: APIServer,
) -> None:
    await cluster(apiserver)
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    async with controller(apiserver):
        await ask(apiserver, token, "first", "edge-1")
        first = await signed(apiserver, "first")
    secret = apiserver.get("secrets", CA_SECRET, CA_NAMESPACE)
    bundle = apiserver.get("configmaps", CA_BUNDLE, CA_NAMESPACE)
    assert secret is not None and bundle is not None
    async with controller(apiserver, "replica-b"):
        await ask(apiserver, token, "second", "edge-1")
        second = await signed(apiserver, "second")
    assert apiserver.get("secrets", CA_SECRET, CA_NAMESPACE) == secret
    creates = [w for w in apiserver.writes("secrets") if w.method == "POST"]
    assert len(creates) == 1
    ca = ca_of(apiserver)
    assert authority.is_issued_by(first, ca) and authority.is_issued_by(second, ca)
    # The restarted leader found its CA in the bundle: not rewritten.
    assert apiserver.get("configmaps", CA_BUNDLE, CA_NAMESPACE) == bundle


async def test_a_replica_that_does_not_lead_touches_nothing(apiserver: APIServer) -> None:
    await cluster(apiserver)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    await apiserver.put(
        "leases",
        {
            "metadata": {"name": "ravenproxy-controller", "namespace": "kube-system"},
            "spec": {
                "holderIdentity": "the-other-replica",
                "leaseDurationSeconds": 60,
                "acquireTime": now,
                "renewTime": now,
            },
        },
    )
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    await ask(apiserver, token, "waiting", "edge-1")
    async with controller(apiserver, "follower", lease_duration=60, renew_deadline=40):
        await eventually(lambda: apiserver.watches(CSRS))  # it lists and watches...
        await asyncio.sleep(2.0)  # ...for several rounds
    assert [w for w in apiserver.writes() if w.user_agent == "follower"] == []
    assert condition_types(csr(apiserver, "waiting")) == []
    assert apiserver.get("secrets", CA_SECRET, CA_NAMESPACE) is None


async def test_the_controller_command_signs_with_its_flags(
    apiserver: APIServer, tmp_path: Path
) -> None:
    """``ravenproxy controller`` as a process: --max-cert-lifetime caps, --server-san allows."""
    await cluster(apiserver)
    token = apiserver.add_service_account("ravenproxy-controller", "cloud-1")
    config = kubeconfig(tmp_path / "kubeconfig", apiserver, token)
    log = tmp_path / "controller.log"
    proc = spawn_python(
        [
            "-m",
            "ravenproxy",
            "controller",
            "--kubeconfig",
            str(config),
            "--max-cert-lifetime",
            "90s",
            "--server-san",
            "tunnel.example.com",
            # Not the default ports: a process of another test or of the machine may hold them.
            "--metrics-addr",
            f"127.0.0.1:{free_port()}",
            "--health-addr",
            f"127.0.0.1:{free_port()}",
        ],
        log,
    )
    try:
        server = apiserver.add_service_account("ravenproxy-server", "cloud-1")
        await ask(
            apiserver,
            server,
            "cloud-server",
            "cloud-1",
            signer=SIGNER_SERVER,
            dns=("cloud-1", "tunnel.example.com"),
        )
        await eventually(
            lambda: certificate(csr(apiserver, "cloud-server")) is not None,
            within=20,
            what=lambda: log.read_text(),
        )
    finally:
        await asyncio.to_thread(stop, proc)
    cert = certificate(csr(apiserver, "cloud-server"))
    assert cert is not None and authority.is_issued_by(cert, ca_of(apiserver))
    now = dt.datetime.now(dt.UTC)
    assert cert.not_valid_after_utc <= now + dt.timedelta(seconds=90)
    text = log.read_text()
    assert "CSR approved" in text and "CSR signed" in text
    assert f"{cert.serial_number:x}" in text
    # Every write the controller made was as its own service account.
    assert {r.user for r in apiserver.writes() if r.user_agent.startswith("OpenAPI")} <= {
        "system:serviceaccount:kube-system:ravenproxy-controller",
        "system:serviceaccount:kube-system:ravenproxy-server",
    }
