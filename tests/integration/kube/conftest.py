"""The Kubernetes API emulator, one per test, a kubeconfig that points at it (as a user of its
``users``, or anonymous), and certificate signing requests to send it."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ravenproxy.kube.kubeconfig import ClusterAccess
from ravenproxy.kube.rest import RestClient
from tests.integration.kube.apiserver import APIServer


@pytest.fixture
async def apiserver() -> AsyncIterator[APIServer]:
    srv = APIServer()
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


def kubeconfig(path: Path, apiserver: APIServer, token: str | None = None) -> Path:
    """A kubeconfig file for the emulator: with ``token`` (from ``apiserver.add_user`` /
    ``add_service_account`` / ``add_node_user``) the calls are that user's, else anonymous."""
    user = {"token": token} if token is not None else {}
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emu", "cluster": {"server": apiserver.url}}],
                "users": [{"name": "emu", "user": user}],
                "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "emu"}}],
                "current-context": "emu",
            }
        )
    )
    return path


def rest_client(
    apiserver: APIServer, token: str | None = None, agent: str = "test", **kwargs: float
) -> RestClient:
    """Our REST client on the emulator, as ``token``'s user (anonymous if None); ``agent`` is
    its User-Agent, which the emulator's request log shows."""
    return RestClient(ClusterAccess(apiserver.url, token=token), user_agent=agent, **kwargs)


def csr_request(
    common_name: str,
    *,
    dns: Sequence[str] = (),
    key: ec.EllipticCurvePrivateKey | None = None,
    organization: str | None = None,
) -> str:
    """``spec.request`` of a CSR: base64 of the PEM of a CSR for ``CN=common_name`` (with DNS
    SANs ``dns``), signed by ``key`` (a new P-256 key if None)."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    if dns:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns]), critical=False
        )
    pem = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    return base64.b64encode(pem).decode()
