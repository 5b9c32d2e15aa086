"""Certificates from Kubernetes: the agent's and the server's ``--cert-dir``, kept filled and
fresh through ``certificates.k8s.io/v1`` CertificateSigningRequests.

The thin I/O adapter around :mod:`ravenproxy.pki.issued` (what to accept, when to ask again)
and :mod:`ravenproxy.pki.csrprocess` (the key and CSR, made in a short-lived child).
What it does, in order:

1. **Start.** A certificate already in the directory whose key matches, for this node, and not
   yet past its rotation deadline is used as it is: a restart does not make a new CSR (a
   crash-looping pod must not flood the API with them). Otherwise it requests one.
2. **Request.** A fresh P-256 key, a CSR ``CN=<node>`` (server: SANs from
   :func:`~ravenproxy.model.server_names.server_names`), created and watched until it is
   issued, denied or failed, or ``request_timeout`` passes (:mod:`ravenproxy.kube.csr`).
   Anything but a certificate is retried with a new CSR after a backoff (capped): a denied
   request is never repeated at once.
3. **Write.** ``tls.key`` (0600) first, then ``tls.crt``, then ``ca.crt`` from the CA bundle
   ConfigMap, each atomically (temp file, fsync, rename). A reader that sees the new key with
   the old certificate sees an inconsistent set and keeps the one it has until the certificate
   follows (the reload watcher's rule); nothing here touches an SSL context.
4. **Rotate.** Sleep until the current certificate's jittered deadline (70-90 % of its
   lifetime), then request again. A server also requests at once when its node gained a name
   or address the certificate lacks (looked at every ``san_check_interval``, as client-go's
   certificate manager compares its template). While the API is away or the request is
   pending or denied, the current files stay in place and in use.
5. **Follow the CA bundle.** The bundle ConfigMap is watched all along; a CA rotation adds a CA
   to it, and ``ca.crt`` is rewritten whenever it changes (unless ``--ca-file`` was given,
   which then wins). A certificate the bundle no longer vouches for (its CA removed before
   this node renewed) is replaced at once: every peer would refuse it
   (:func:`~ravenproxy.pki.issued.trust_problem`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ravenproxy.backoff import backoff
from ravenproxy.errors import PKIError
from ravenproxy.kube import csr
from ravenproxy.kube.csr import RequestFailed
from ravenproxy.kube.reflector import Reflector, Resource, WatchSettings
from ravenproxy.kube.rest import KubeError, RestClient, connect
from ravenproxy.log import kv
from ravenproxy.model.store import ModelStore
from ravenproxy.pki.atomicfile import write_key_bytes, write_pem_bytes
from ravenproxy.pki.csrprocess import new_request
from ravenproxy.pki.issuance import (
    CA_BUNDLE,
    CA_BUNDLE_KEY,
    CA_NAMESPACE,
    CERT_DIR_CA,
    CERT_DIR_CERT,
    CERT_DIR_KEY,
    CERT_LIFETIME,
    Role,
)
from ravenproxy.pki.issued import check_issued, missing_sans, trust_problem
from ravenproxy.pki.issued import rotation_deadline as _deadline
from ravenproxy.pki.x509info import CertInfo, certs_from_pem, read_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestSettings:
    """What one requester asks for and how patiently."""

    role: Role
    node: str
    cert_dir: Path
    lifetime: float = CERT_LIFETIME
    """``expirationSeconds``; the signer may cap it (the certificate's own validity counts)."""
    follow_ca_bundle: bool = True
    """Write ``ca.crt`` from the bundle ConfigMap (False: ``--ca-file`` wins)."""
    request_timeout: float = 300.0
    """How long one CSR may stay pending before a new one is made."""
    retry_base: float = 1.0
    retry_cap: float = 300.0
    san_check_interval: float = 60.0
    """How often a server compares its certificate's SANs with its node's current names."""
    watch: WatchSettings = WatchSettings()

    @property
    def key_path(self) -> Path:
        return self.cert_dir / CERT_DIR_KEY

    @property
    def cert_path(self) -> Path:
        return self.cert_dir / CERT_DIR_CERT

    @property
    def ca_path(self) -> Path:
        return self.cert_dir / CERT_DIR_CA


SansFn = Callable[[], Awaitable[Sequence[str]]]


class CertificateRequester:
    """Keeps ``cert_dir`` holding a valid key, certificate and CA bundle for ``node``.

    :meth:`bootstrap` returns once the directory holds a usable set (an existing one, or one
    just issued); :meth:`run` then rotates and follows the CA bundle until cancelled. ``sans``
    (servers) is asked anew for every request: the node's addresses may have changed.
    """

    def __init__(
        self,
        api: RestClient,
        settings: RequestSettings,
        *,
        sans: SansFn | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.api = api
        self.settings = settings
        self._sans = sans
        self._rng = rng
        self.current: CertInfo | None = None
        self.deadline: dt.datetime | None = None
        self.requests = 0
        """CSRs created by this requester (tests and logs)."""
        self._bundle_changed = asyncio.Event()
        self._bundle = Reflector(
            f"configmap {CA_NAMESPACE}/{CA_BUNDLE}",
            Resource(
                api,
                f"/api/v1/namespaces/{CA_NAMESPACE}/configmaps",
                fieldSelector=f"metadata.name={CA_BUNDLE}",
            ),
            self._bundle_changed.set,
            settings.watch,
        )
        self._bundle_task: asyncio.Task[None] | None = None
        self._unattainable: set[str] = set()
        """Names a request asked for and the issued certificate still lacked."""
        self._untrusted = asyncio.Event()
        """The CA bundle no longer vouches for the current certificate: request one now."""

    # -- lifecycle ------------------------------------------------------------------------
    async def bootstrap(self) -> None:
        """Until the directory holds a usable set: the one there, or a newly issued one."""
        s = self.settings
        try:
            s.cert_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PKIError(f"--cert-dir {s.cert_dir}: cannot create it: {exc.strerror}") from None
        if s.follow_ca_bundle:
            self._bundle_task = asyncio.create_task(
                self._bundle.run(), name=f"cert-{s.role}-ca-bundle-watch"
            )
        existing = self._existing()
        # A restart with a usable set starts at once, API or not; the bundle is followed later.
        if existing is not None and (not s.follow_ca_bundle or s.ca_path.is_file()):
            self._use(existing, "kept")
            return
        if s.follow_ca_bundle:
            await self._wait_bundle()
        if existing is not None:
            self._use(existing, "kept")
            return
        await self._obtain("no valid certificate in the directory")

    async def run(self) -> None:
        """Rotate at each deadline and follow the CA bundle, until cancelled. Call after
        :meth:`bootstrap`."""
        try:
            async with asyncio.TaskGroup() as tg:
                if self.settings.follow_ca_bundle:
                    tg.create_task(self._follow_bundle(), name=f"cert-{self.settings.role}-ca")
                tg.create_task(self._rotate(), name=f"cert-{self.settings.role}-rotate")
        finally:
            await self.close()

    async def close(self) -> None:
        task, self._bundle_task = self._bundle_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # -- the directory --------------------------------------------------------------------
    def _existing(self) -> CertInfo | None:
        """The certificate in the directory, if it is ours and not yet due for rotation."""
        s = self.settings
        if not (s.key_path.is_file() and s.cert_path.is_file()):
            return None
        try:
            key_pem = read_file(s.key_path, "key")
            pem = read_file(s.cert_path, "certificate")
            (cert, *_chain) = check_issued(pem, key_pem, s.node, s.role)
        except (PKIError, OSError) as exc:
            log.info("certificate in the directory not usable", extra=kv(reason=exc))
            return None
        deadline = self._deadline_of(cert)
        if _now() >= deadline:
            log.info(
                "certificate rotation due",
                extra=kv(
                    serial=cert.serial_hex,
                    deadline=deadline.isoformat(),
                    not_after=cert.not_after.isoformat(),
                ),
            )
            return None
        return cert

    def _deadline_of(self, cert: CertInfo) -> dt.datetime:
        return _deadline(cert.not_before, cert.not_after, self._rng)

    def _use(self, cert: CertInfo, how: str) -> None:
        self.current = cert
        self.deadline = self._deadline_of(cert)
        log.info(
            "certificate in use" if how == "kept" else "certificate issued",
            extra=kv(
                role=self.settings.role,
                node=self.settings.node,
                serial=cert.serial_hex,
                not_after=cert.not_after.isoformat(),
                rotation_at=self.deadline.isoformat(),
            ),
        )

    def _write(self, key_pem: bytes, chain_pem: bytes) -> None:
        s = self.settings
        # Key first (the rule shared with the reload watcher): between the two renames the set
        # is new key + old certificate, which a reader sees as inconsistent and ignores; a crash
        # there leaves a set that fails the key check at start, and a new request follows.
        try:
            write_key_bytes(s.key_path, key_pem)
            write_pem_bytes(s.cert_path, chain_pem)
        except OSError as exc:  # not "API unreachable": the directory failed
            raise PKIError(f"{exc.filename or s.cert_dir}: cannot write: {exc.strerror}") from None

    # -- the CA bundle --------------------------------------------------------------------
    def _bundle_pem(self) -> bytes | None:
        for obj in self._bundle.objects.values():
            pem = (obj.get("data") or {}).get(CA_BUNDLE_KEY)
            if isinstance(pem, str) and "BEGIN CERTIFICATE" in pem:
                return pem.encode()
        return None

    async def _wait_bundle(self) -> None:
        waited = False
        while True:
            pem = self._bundle_pem()
            if pem is not None:
                self._write_ca(pem)
                return
            if not waited and self._bundle.synced.is_set():
                log.warning(
                    "waiting for the CA bundle",
                    extra=kv(configmap=f"{CA_NAMESPACE}/{CA_BUNDLE}", key=CA_BUNDLE_KEY),
                )
                waited = True
            self._bundle_changed.clear()
            await self._bundle_changed.wait()

    def _write_ca(self, pem: bytes) -> None:
        path = self.settings.ca_path
        try:
            if path.read_bytes() == pem:
                return
        except OSError:
            pass
        try:
            certs = certs_from_pem(pem)
        except ValueError as exc:
            log.warning("CA bundle is not PEM, ignored", extra=kv(reason=exc))
            return
        if not certs:
            log.warning("CA bundle is not PEM, ignored", extra=kv(reason="no certificate"))
            return
        try:
            write_pem_bytes(path, pem)
        except OSError as exc:
            raise PKIError(f"{path}: cannot write the CA bundle: {exc.strerror}") from None
        log.info("CA bundle written", extra=kv(path=str(path), cas=len(certs)))

    async def _follow_bundle(self) -> None:
        while True:
            # Read before waiting: a change between bootstrap() and run() is not lost.
            self._bundle_changed.clear()
            pem = self._bundle_pem()
            if pem is not None:
                try:
                    self._write_ca(pem)
                except PKIError as exc:  # the old one stays; the next change tries again
                    log.warning("CA bundle not written", extra=kv(reason=exc))
                self._check_trust(pem)
            await self._bundle_changed.wait()

    def _trust_problem(self, ca_pem: bytes) -> str:
        """Why a peer trusting ``ca_pem`` would refuse the certificate in the directory."""
        s = self.settings
        try:
            pem = read_file(s.cert_path, "certificate")
            return trust_problem(pem, read_file(s.key_path, "key"), ca_pem, s.role)
        except (PKIError, OSError) as exc:
            return str(exc)

    def _check_trust(self, ca_pem: bytes) -> None:
        s = self.settings
        if self.current is None or self._untrusted.is_set():
            return
        problem = self._trust_problem(ca_pem)
        if problem:
            log.warning(
                "certificate not trusted by the CA bundle, requesting a new one",
                extra=kv(role=s.role, serial=self.current.serial_hex, reason=problem),
            )
            self._untrusted.set()

    # -- requesting -----------------------------------------------------------------------
    async def _rotate(self) -> None:
        while True:
            assert self.deadline is not None and self.current is not None
            missing = await self._missing_sans()
            if missing:
                log.info(
                    "certificate lacks names the node now has",
                    extra=kv(
                        role=self.settings.role,
                        serial=self.current.serial_hex,
                        missing=",".join(missing),
                    ),
                )
                await self._obtain("names added")
                # What the signer would not put in is not asked for again before rotation.
                self._unattainable |= set(await self._missing_sans())
                continue
            if self._untrusted.is_set():
                # Looked at again: one issued since the flag (a rotation under way) may be
                # trusted. A new one refused too waits for the next bundle.
                self._untrusted.clear()
                bundle = self._bundle_pem()
                if bundle is not None and self._trust_problem(bundle):
                    await self._obtain("not trusted by the CA bundle")
                continue
            wait = (self.deadline - _now()).total_seconds()
            if wait > 0:
                # The deadline is wall-clock time; the loop's clock is monotonic and may drift
                # from it (a suspended VM): look again at least hourly. A server looks at its
                # names more often: an address its node gains is one an agent may dial.
                nap = min(wait, 3600.0)
                if self._sans is not None:
                    nap = min(nap, self.settings.san_check_interval)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(nap):
                        await self._untrusted.wait()
                continue
            log.info(
                "certificate rotation due",
                extra=kv(
                    role=self.settings.role,
                    serial=self.current.serial_hex,
                    not_after=self.current.not_after.isoformat(),
                ),
            )
            await self._obtain("rotation")
            self._unattainable = set()

    async def _missing_sans(self) -> list[str]:
        """The names this server should have (:meth:`_sans`) that the current certificate
        lacks, less those a request already could not get; [] when the names cannot be known
        now (the API away: the next look tries again)."""
        if self._sans is None or self.current is None:
            return []
        try:
            wanted = await self._sans()
            missing = missing_sans(self.current, wanted)
        except (OSError, KubeError, PKIError) as exc:
            log.debug("cannot list the server's names now", extra=kv(reason=_describe(exc)))
            return []
        return [name for name in missing if name not in self._unattainable]

    async def _obtain(self, why: str) -> None:
        """Request until a certificate is issued and written; back off between tries."""
        s = self.settings
        delays = backoff(s.retry_base, s.retry_cap, self._rng)
        while True:
            try:
                await self._request_once(why)
                return
            except RequestFailed as exc:
                # At least the base delay: a denied request is never repeated at once.
                delay = max(s.retry_base, next(delays))
                message = {
                    "denied": "certificate request denied",
                    "failed": "certificate request failed",
                    "timeout": "certificate request not answered",
                    "refused": "certificate request refused",
                }.get(exc.outcome, "certificate request failed")
                log.warning(
                    message, extra=kv(csr=exc.csr, reason=exc.reason, retry_in=f"{delay:.2f}s")
                )
            except (OSError, KubeError, PKIError) as exc:
                # The API away or failing, or the directory not writable: the files in place
                # (if any) stay in use, and the next attempt makes a new key and CSR.
                delay = max(s.retry_base, next(delays))
                log.warning(
                    "cannot request a certificate, retrying",
                    extra=kv(reason=_describe(exc), retry_in=f"{delay:.2f}s"),
                )
            await asyncio.sleep(delay)

    async def _request_once(self, why: str) -> None:
        s = self.settings
        sans = list(await self._sans()) if self._sans is not None else []
        try:
            # In a child process: cryptography never becomes resident here (issue 15).
            request = await new_request(s.node, sans)
        except PKIError as exc:
            raise RequestFailed("-", "no CSR made", str(exc)) from None
        name = await csr.create(self.api, s.role, s.node, request.csr_pem, s.lifetime)
        self.requests += 1
        log.info(
            "certificate requested",
            extra=kv(csr=name, role=s.role, node=s.node, why=why, sans=len(sans)),
        )
        pem = await csr.wait_issued(self.api, name, s.watch, s.request_timeout)
        try:
            chain = check_issued(pem, request.key_pem, s.node, s.role)
        except PKIError as exc:
            raise RequestFailed(name, "failed", str(exc)) from None
        self._write(request.key_pem, pem)
        self._use(chain[0], "issued")


@contextlib.asynccontextmanager
async def kept_certificates(
    settings: RequestSettings,
    kubeconfig: str | None,
    *,
    store: ModelStore | None = None,
    extra_sans: Sequence[str] = (),
) -> AsyncIterator[CertificateRequester]:
    """For ``--cert-dir``: an API client and a requester whose :meth:`~CertificateRequester.
    bootstrap` has returned (the directory holds a usable set when the block starts). The
    caller runs :meth:`~CertificateRequester.run` as a named task of its own for rotation; the
    client is closed when the block ends. A server's SANs come from ``store`` (its model)."""
    api = connect(kubeconfig)
    try:
        sans: SansFn | None = None
        if settings.role == "server":
            model = store or ModelStore()

            async def sans() -> Sequence[str]:
                return await csr.server_sans(api, model, settings.node, extra_sans)

        requester = CertificateRequester(api, settings, sans=sans)
        log.info(
            "certificate needed before starting",
            extra=kv(role=settings.role, node=settings.node, cert_dir=str(settings.cert_dir)),
        )
        try:
            await requester.bootstrap()
            yield requester
        finally:
            await requester.close()
    finally:
        await api.close()


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "API timed out"
    if isinstance(exc, OSError):
        return f"API unreachable: {exc.strerror or exc}"
    return str(exc) or repr(exc)


__all__ = [
    "CertificateRequester",
    "RequestFailed",
    "RequestSettings",
    "kept_certificates",
]
