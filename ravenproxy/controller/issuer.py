"""The controller's certificate issuer: approves, denies and signs the CertificateSigningRequests
of our signers, on the leader only. A thin applier over :mod:`approval` (the rule) and
:mod:`signing` (the certificate).

CSRs are kept by a list-then-watch :class:`~ravenproxy.kube.reflector.Reflector`. On each change
(and at least every ``interval`` seconds) while leading, once the model is complete, every CSR
is looked at once per resourceVersion:

- pending and of our signer: the approval subresource gets an ``Approved`` or ``Denied``
  condition (reason and one-line message), and an Event (``CSRApproved`` / ``CSRDenied``) says so;
- approved, of our signer, without a certificate: it is signed with the CA of
  :mod:`castore` and ``status.certificate`` written; a request that cannot be signed gets a
  ``Failed`` condition instead;
- anything else, other signers' CSRs above all, is left exactly as it is.

Every write goes through :class:`~ravenproxy.controller.writer.KubeWriter`, which refuses it
when this replica does not lead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from collections.abc import Mapping
from contextlib import suppress
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio.client.exceptions import ApiException

from ravenproxy.controller import castore
from ravenproxy.controller.approval import (
    FINAL_CONDITIONS,
    USAGES,
    Approve,
    Deny,
    conditions,
    decide,
)
from ravenproxy.controller.settings import IssuerSettings
from ravenproxy.controller.signing import certificate_field, sign
from ravenproxy.controller.writer import KubeWriter, NotLeader, internal_cluster_ip
from ravenproxy.errors import PKIError
from ravenproxy.kube.client import KubeError, resource_version
from ravenproxy.kube.reflector import Reflector, WatchSettings
from ravenproxy.log import kv
from ravenproxy.metrics import ControllerMetrics
from ravenproxy.model.store import ModelStore
from ravenproxy.pki.issuance import SIGNER_SERVER

log = logging.getLogger(__name__)

REASON_APPROVED: Final = "RavenProxyNodeBound"
REASON_DENIED: Final = "RavenProxyNotAllowed"
REASON_FAILED: Final = "RavenProxySigningFailed"
EVENT_APPROVED: Final = "CSRApproved"
EVENT_DENIED: Final = "CSRDenied"


def _stamp(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, reason: str, message: str, now: dt.datetime) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": _stamp(now),
    }


def with_condition(obj: Mapping[str, Any], cond: Mapping[str, Any]) -> dict[str, Any]:
    """The body of an approval/status PUT: the object read, one condition added."""
    status = dict(obj.get("status") or {})
    status["conditions"] = [*(status.get("conditions") or []), dict(cond)]
    return {**obj, "status": status}


def csr_event(
    obj: Mapping[str, Any], kind: str, reason: str, message: str, now: dt.datetime, namespace: str
) -> dict[str, Any]:
    """A core/v1 Event about the (cluster-scoped) CSR ``obj``."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    stamp = _stamp(now)
    digest = hashlib.sha256(f"{name}/{reason}/{now.isoformat()}".encode()).hexdigest()[:10]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name[:240]}.{digest}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "certificates.k8s.io/v1",
            "kind": "CertificateSigningRequest",
            "name": name,
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": "ravenproxy-controller"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def needs_certificate(obj: Mapping[str, Any]) -> bool:
    """Approved, of our signer, not Denied/Failed, and no certificate yet."""
    spec = obj.get("spec") or {}
    done = conditions(obj)
    return (
        spec.get("signerName") in USAGES
        and "Approved" in done
        and not done & (FINAL_CONDITIONS - {"Approved"})
        and not (obj.get("status") or {}).get("certificate")
    )


class Issuer:
    """Approves, denies and signs our CSRs while ``leading`` (see the module)."""

    def __init__(
        self,
        api: k8s_client.ApiClient,
        writer: KubeWriter,
        store: ModelStore,
        settings: IssuerSettings | None = None,
        watch: WatchSettings | None = None,
        metrics: ControllerMetrics | None = None,
    ) -> None:
        self.writer = writer
        self.metrics = metrics
        self.store = store
        self.settings = settings or IssuerSettings()
        self._changed = asyncio.Event()
        certs = k8s_client.CertificatesV1Api(api)
        self.csrs = Reflector(
            "certificatesigningrequests",
            certs.list_certificate_signing_request,
            self._changed.set,
            watch,
        )
        self._ca: castore.CA | None = None
        # name -> resourceVersion acted on: each version is handled once, even while the
        # watch has not yet brought our own write back.
        self._acted: dict[str, str] = {}

    async def run(self, leading: asyncio.Event, model_synced: asyncio.Event) -> None:
        """Watch CSRs; act on them while ``leading``, once the model is complete."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.csrs.run(), name="controller-csr-reflector")
            tg.create_task(self._loop(leading, model_synced), name="controller-csr-issuer")

    async def _loop(self, leading: asyncio.Event, model_synced: asyncio.Event) -> None:
        while True:
            if not leading.is_set():
                self._ca = None  # a new term reads the Secret again
                self._acted.clear()
                await leading.wait()
            await model_synced.wait()
            await self.csrs.synced.wait()
            self._changed.clear()
            try:
                await self.once()
            except NotLeader:
                log.info("controller: leadership lost while issuing, stopping writes")
            except (KubeError, PKIError, ApiException, aiohttp.ClientError, TimeoutError) as exc:
                log.warning(
                    "controller: certificate issuance failed, will retry", extra=kv(error=exc)
                )
            with suppress(TimeoutError):
                async with asyncio.timeout(self.settings.interval):
                    await self._changed.wait()

    async def once(self) -> None:
        """One pass over the CSRs known now."""
        if self._ca is None:
            self._ca = await castore.ensure_ca(self.writer)
            await castore.ensure_bundle(self.writer, self._ca[0])
        service_ip: str | None = None
        looked_up = False
        for key, obj in sorted(self.csrs.objects.items()):
            rv = resource_version(obj)
            if self._acted.get(key) == rv:
                continue
            spec = obj.get("spec") or {}
            if spec.get("signerName") not in USAGES:
                continue  # not ours: never touched
            if spec.get("signerName") == SIGNER_SERVER and not looked_up:
                service_ip = internal_cluster_ip(await self.writer.list_owned())
                looked_up = True
            self._acted[key] = rv
            await self._handle(obj, service_ip)
        for gone in set(self._acted) - set(self.csrs.objects):
            del self._acted[gone]

    async def _handle(self, obj: Mapping[str, Any], service_ip: str | None) -> None:
        s = self.settings
        decision = decide(
            obj,
            self.store.model,
            service_ip=service_ip,
            extra_sans=s.server_sans,
            cluster_domain=s.cluster_domain,
        )
        name = str(obj["metadata"]["name"])
        signer = str((obj.get("spec") or {}).get("signerName"))
        requester = str((obj.get("spec") or {}).get("username", ""))
        now = dt.datetime.now(dt.UTC)
        if isinstance(decision, Approve):
            message = f"{requester} is bound to node {decision.node}"
            body = with_condition(obj, condition("Approved", REASON_APPROVED, message, now))
            status, stored = await self.writer.update_csr_approval(name, body)
            if status == 409:
                return  # changed meanwhile: the watch brings the new version
            self._count("approved", signer)
            log.info(
                "controller: CSR approved",
                extra=kv(csr=name, node=decision.node, signer=signer, requester=requester),
            )
            await self.writer.create_event(
                csr_event(stored, "Normal", EVENT_APPROVED, message, now, s.event_namespace)
            )
            obj = stored
        elif isinstance(decision, Deny):
            body = with_condition(obj, condition("Denied", REASON_DENIED, decision.reason, now))
            status, stored = await self.writer.update_csr_approval(name, body)
            if status == 409:
                return
            self._count("denied", signer)
            log.warning(
                "controller: CSR denied",
                extra=kv(
                    csr=name,
                    node=decision.node,
                    signer=signer,
                    requester=requester,
                    reason=decision.reason,
                ),
            )
            await self.writer.create_event(
                csr_event(stored, "Warning", EVENT_DENIED, decision.reason, now, s.event_namespace)
            )
            return
        if needs_certificate(obj):
            await self._sign(obj, now)

    def _count(self, decision: str, signer: str) -> None:
        if self.metrics is not None:
            self.metrics.csr_decisions.labels(decision=decision, signer=signer).inc()

    async def _sign(self, obj: Mapping[str, Any], now: dt.datetime) -> None:
        assert self._ca is not None
        name = str(obj["metadata"]["name"])
        signer = str(obj["spec"]["signerName"])
        try:
            cert = sign(obj, *self._ca, max_lifetime=self.settings.max_lifetime, now=now)
        except PKIError as exc:
            body = with_condition(obj, condition("Failed", REASON_FAILED, str(exc), now))
            status, _ = await self.writer.update_csr_status(name, body)
            if status != 409:
                self._count("sign_failed", signer)
                log.warning(
                    "controller: CSR not signed",
                    extra=kv(csr=name, signer=signer, error=exc),
                )
            return
        status_body = dict(obj.get("status") or {})
        status_body["certificate"] = certificate_field(cert)
        status, _ = await self.writer.update_csr_status(name, {**obj, "status": status_body})
        if status == 409:
            return
        self._count("signed", signer)
        log.info(
            "controller: CSR signed",
            extra=kv(
                csr=name,
                node=cert.subject.rfc4514_string().removeprefix("CN="),
                signer=signer,
                serial=f"{cert.serial_number:x}",
                not_after=cert.not_valid_after_utc.isoformat(),
            ),
        )
