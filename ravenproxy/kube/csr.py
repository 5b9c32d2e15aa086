"""One ``certificates.k8s.io/v1`` CertificateSigningRequest through the API: created with
``generateName`` ``ravenproxy-<role>-<node>-``, our signer name, the role's usages and
``expirationSeconds``; then watched (by ``fieldSelector=metadata.name``) until
``status.certificate`` appears, a ``Denied`` or ``Failed`` condition is set, or the timeout
passes; and the names a server's request asks for (:func:`server_sans`).
:mod:`ravenproxy.kube.certificates` decides when to ask and what to accept."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Sequence
from typing import Any

from ravenproxy.errors import RavenProxyError
from ravenproxy.kube.reflector import Reflector, Resource, WatchSettings
from ravenproxy.kube.rest import KubeError, RestClient, status_message
from ravenproxy.log import kv
from ravenproxy.model.server_names import INTERNAL_SERVICE, NAMESPACE, server_names
from ravenproxy.model.store import ModelStore
from ravenproxy.pki.issuance import SIGNER_OF_ROLE, USAGES, Role

log = logging.getLogger(__name__)

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


class RequestFailed(RavenProxyError):
    """One certificate request did not end in a usable certificate; ``reason`` says why."""

    def __init__(self, csr: str, outcome: str, reason: str) -> None:
        super().__init__(f"{csr}: {outcome}: {reason}")
        self.csr = csr
        self.outcome = outcome
        self.reason = reason


async def create(
    api: RestClient,
    role: Role,
    node: str,
    csr_pem: bytes,
    lifetime: float,
) -> str:
    """Create the request; its name (``generateName``). RequestFailed ``refused`` when the API
    does not take it."""
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": f"ravenproxy-{role}-{node}-"[:200]},
        "spec": {
            "request": base64.b64encode(csr_pem).decode(),
            "signerName": SIGNER_OF_ROLE[role],
            "usages": list(USAGES[role]),
            "expirationSeconds": int(lifetime),
        },
    }
    status, obj = await api.request("POST", CSRS, body=body)
    if status >= 300:
        raise RequestFailed("-", "refused", f"HTTP {status}: {status_message(obj, status)}")
    return str((obj.get("metadata") or {}).get("name", ""))


async def wait_issued(api: RestClient, name: str, watch: WatchSettings, timeout: float) -> bytes:
    """``status.certificate`` of CSR ``name``, watched; RequestFailed on a Denied or Failed
    condition, or when it is still pending after ``timeout`` seconds."""
    changed = asyncio.Event()
    reflector = Reflector(
        f"certificatesigningrequest {name}",
        Resource(api, CSRS, fieldSelector=f"metadata.name={name}"),
        changed.set,
        watch,
    )
    task = asyncio.create_task(reflector.run(), name=f"cert-csr-watch:{name}")
    try:
        async with asyncio.timeout(timeout):
            while True:
                changed.clear()
                obj = reflector.objects.get(name)
                if obj is not None:
                    result = outcome(obj)
                    if isinstance(result, bytes):
                        return result
                    if result is not None:
                        raise RequestFailed(name, *result)
                await changed.wait()
    except TimeoutError:
        raise RequestFailed(name, "timeout", f"pending for {timeout:g}s") from None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def outcome(csr: dict[str, Any]) -> bytes | tuple[str, str] | None:
    """The certificate, ``(outcome, reason)`` for Denied/Failed, or None while pending."""
    status = csr.get("status") or {}
    for cond in status.get("conditions") or []:
        kind = cond.get("type")
        if kind in ("Denied", "Failed") and cond.get("status", "True") == "True":
            reason = cond.get("message") or cond.get("reason") or kind
            return kind.lower(), str(reason)
    cert = status.get("certificate")
    if cert:
        try:
            return base64.b64decode(cert, validate=True)
        except ValueError:
            return "failed", "status.certificate is not base64"
    return None


async def server_sans(
    api: RestClient, store: ModelStore, node: str, extra: Sequence[str] = ()
) -> list[str]:
    """The SANs of this server's next certificate: :func:`server_names` from the current model,
    with the internal Service's ClusterIP when the Service exists (logged when it does not)."""
    status, svc = await api.request(
        "GET", f"/api/v1/namespaces/{NAMESPACE}/services/{INTERNAL_SERVICE}"
    )
    service_ip: str | None = None
    if status == 200:
        ip = (svc.get("spec") or {}).get("clusterIP")
        service_ip = ip if isinstance(ip, str) and ip and ip != "None" else None
    elif status == 404:
        log.info(
            "internal Service not found: its ClusterIP is not in the server certificate",
            extra=kv(service=f"{NAMESPACE}/{INTERNAL_SERVICE}"),
        )
    else:
        why = status_message(svc, status)
        raise KubeError(status, f"service {NAMESPACE}/{INTERNAL_SERVICE}: {why}")
    return list(server_names(store.model, node, service_ip=service_ip, extra=extra))
