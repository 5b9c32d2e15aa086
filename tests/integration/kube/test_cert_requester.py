"""The ``--cert-dir`` requester (ravenproxy.kube.certificates) against the API emulator, through
our REST client, with a service-account token bound to the node.

The controller's approver and signer are issue 11 item 4; here a signer coroutine of the test
stands in for it: it approves (or denies) every new CSR through the ``approval`` subresource and
writes a certificate signed by a CA from pki/authority through ``status``, as the controller
does, with the validity the test chooses.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import logging
import random
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes_asyncio import client as k8s_client

from ravenproxy.errors import PKIError
from ravenproxy.kube.certificates import CertificateRequester, RequestSettings
from ravenproxy.kube.rest import connect
from ravenproxy.pki.authority import generate_ca, is_issued_by, key_matches
from ravenproxy.pki.issuance import CA_BUNDLE, CA_BUNDLE_KEY, CA_NAMESPACE, SIGNER_AGENT
from ravenproxy.pki.pemfiles import cert_pem, load_cert, load_key
from tests.csrsign import sign_csr
from tests.helpers import eventually, free_port
from tests.integration.cluster import Cluster
from tests.integration.kube.apiserver import APIServer
from tests.integration.kube.conftest import kubeconfig
from tests.integration.kube.test_controller import gateway_obj, node_obj
from tests.integration.targets import echo, tcp_server

pytestmark = pytest.mark.timeout(120)

CA = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


@dataclass
class Signer:
    """Approves and signs every new CSR (after denying the first ``deny`` ones), as the
    controller would; records when it first saw each (wall clock)."""

    apiserver: APIServer
    ca: CA
    lifetime: dt.timedelta = dt.timedelta(hours=1)
    backdate: dt.timedelta = dt.timedelta(0)
    deny: int = 0
    drop: tuple[str, ...] = ()
    """SANs the signer leaves out of server certificates."""
    seen: dict[str, float] = field(default_factory=dict)
    denied: list[str] = field(default_factory=list)

    async def run(self) -> None:
        token = self.apiserver.add_user("signer", groups=("system:masters",))
        config = k8s_client.Configuration(host=self.apiserver.url)
        config.api_key = {"BearerToken": token}
        config.api_key_prefix = {"BearerToken": "Bearer"}
        async with k8s_client.ApiClient(config) as api:
            certs = k8s_client.CertificatesV1Api(api)
            while True:
                for csr in self.apiserver.items("certificatesigningrequests"):
                    name = csr["metadata"]["name"]
                    if name not in self.seen:
                        self.seen[name] = time.time()
                        await self._answer(certs, name, csr)
                await asyncio.sleep(0.05)

    async def _answer(self, certs: k8s_client.CertificatesV1Api, name: str, csr: Any) -> None:
        if len(self.denied) < self.deny:
            self.denied.append(name)
            await certs.replace_certificate_signing_request_approval(
                name, _conditions(name, "Denied", "requester is bound to node edge-9")
            )
            return
        await certs.replace_certificate_signing_request_approval(
            name, _conditions(name, "Approved", "bound to the node it names")
        )
        role = "agent" if csr["spec"]["signerName"] == SIGNER_AGENT else "server"
        pem = sign_csr(
            *self.ca,
            base64.b64decode(csr["spec"]["request"]),
            role,
            self.lifetime,
            backdate=self.backdate,
            drop=self.drop,
        )
        await certs.replace_certificate_signing_request_status(
            name,
            {"metadata": {"name": name}, "status": {"certificate": base64.b64encode(pem).decode()}},
        )


def _conditions(name: str, kind: str, message: str) -> dict[str, Any]:
    condition = {"type": kind, "status": "True", "reason": "Test", "message": message}
    return {"metadata": {"name": name}, "status": {"conditions": [condition]}}


@contextlib.asynccontextmanager
async def running(signer: Signer) -> AsyncIterator[Signer]:
    task = asyncio.create_task(signer.run(), name="test-signer")
    try:
        yield signer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@contextlib.asynccontextmanager
async def requester(
    config: Path,
    cert_dir: Path,
    *,
    run: bool = False,
    rng: Callable[[], float] = random.random,
    **overrides: Any,
) -> AsyncIterator[CertificateRequester]:
    """A bootstrapped requester for edge-1 (and its rotation task with ``run``); ``rng``
    places its rotation deadlines."""
    settings = RequestSettings(
        role="agent",
        node="edge-1",
        cert_dir=cert_dir,
        **{"retry_base": 0.3, "retry_cap": 1.0, "request_timeout": 20.0, **overrides},
    )
    api = connect(config)
    req = CertificateRequester(api, settings, rng=rng)
    task: asyncio.Task[None] | None = None
    try:
        await req.bootstrap()
        if run:
            task = asyncio.create_task(req.run(), name="test-cert-rotate")
        yield req
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await req.close()
        await api.close()


async def publish_bundle(apiserver: APIServer, *cas: x509.Certificate) -> None:
    pem = b"".join(cert_pem(c) for c in cas).decode()
    await apiserver.put(
        "configmaps",
        {"metadata": {"name": CA_BUNDLE, "namespace": CA_NAMESPACE}, "data": {CA_BUNDLE_KEY: pem}},
    )


@pytest.fixture
def ca() -> CA:
    return generate_ca("test-cluster-ca")


@pytest.fixture
async def config(apiserver: APIServer, ca: CA, tmp_path: Path) -> Path:
    """The agent's kubeconfig: a bound service-account token of a pod on edge-1."""
    await publish_bundle(apiserver, ca[0])
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    return kubeconfig(tmp_path / "kubeconfig", apiserver, token)


def csrs(apiserver: APIServer) -> list[dict[str, Any]]:
    return apiserver.items("certificatesigningrequests")


def serial_on_disk(cert_dir: Path) -> int:
    return load_cert(cert_dir / "tls.crt").serial_number


async def test_bootstrap_writes_key_first_0600_and_a_certificate_from_the_bundle_ca(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    cert_dir = tmp_path / "certs"
    async with running(Signer(apiserver, ca)), requester(config, cert_dir) as req:
        key_path, cert_path, ca_path = (cert_dir / n for n in ("tls.key", "tls.crt", "ca.crt"))
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
        cert, key = load_cert(cert_path), load_key(key_path)
        assert key_matches(cert, key)
        assert cert.subject.rfc4514_string() == "CN=edge-1"
        (bundle_ca,) = x509.load_pem_x509_certificates(ca_path.read_bytes())
        assert is_issued_by(cert, bundle_ca)
        assert req.requests == 1
        # The key was written before the certificate (the reload watcher's consistency rule).
        assert key_path.stat().st_mtime_ns <= cert_path.stat().st_mtime_ns
    (csr,) = csrs(apiserver)
    assert csr["metadata"]["name"].startswith("ravenproxy-agent-edge-1-")
    spec = csr["spec"]
    assert spec["signerName"] == SIGNER_AGENT
    assert spec["usages"] == ["digital signature", "client auth"]
    assert spec["expirationSeconds"] == 86400
    assert spec["username"] == "system:serviceaccount:kube-system:ravenproxy-agent"
    requested = x509.load_pem_x509_csr(base64.b64decode(spec["request"]))
    assert requested.subject.rfc4514_string() == "CN=edge-1"
    messages = [r.getMessage() for r in caplog.records]
    assert "certificate requested" in messages and "certificate issued" in messages
    issued = next(r for r in caplog.records if r.getMessage() == "certificate issued")
    assert issued.fields["serial"] == format(cert.serial_number, "x")  # type: ignore[attr-defined]


async def test_denied_request_is_logged_and_retried_after_a_backoff(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    signer = Signer(apiserver, ca, deny=2)
    async with running(signer), requester(config, tmp_path / "certs", retry_base=0.5) as req:
        assert req.requests == 3
    denials = [r for r in caplog.records if r.getMessage() == "certificate request denied"]
    assert len(denials) == 2
    assert all("bound to node edge-9" in r.fields["reason"] for r in denials)  # type: ignore[attr-defined]
    first, second, third = sorted(signer.seen.values())
    # Never at once: at least the base delay between a denial and the next request.
    assert second - first >= 0.5 and third - second >= 0.5
    assert signer.denied == [n for n, _t in sorted(signer.seen.items(), key=lambda i: i[1])][:2]


async def test_a_request_nobody_answers_is_replaced_by_a_new_one(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    signer = Signer(apiserver, ca)

    async def signer_comes_late() -> None:
        await eventually(lambda: len(csrs(apiserver)) >= 1, 10, what="a first CSR")
        signer.seen.update({c["metadata"]["name"]: time.time() for c in csrs(apiserver)})
        async with running(signer):
            await asyncio.Event().wait()

    late = asyncio.create_task(signer_comes_late(), name="test-late-signer")
    try:
        async with requester(config, tmp_path / "certs", request_timeout=1.0) as req:
            assert req.requests == 2
    finally:
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)
    (unanswered,) = [
        r for r in caplog.records if r.getMessage() == "certificate request not answered"
    ]
    assert "pending for 1s" in unanswered.fields["reason"]  # type: ignore[attr-defined]
    first, second = sorted(csrs(apiserver), key=lambda c: int(c["metadata"]["resourceVersion"]))
    assert not first["status"].get("certificate") and second["status"]["certificate"]


async def test_restart_with_a_valid_certificate_makes_no_new_request(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path
) -> None:
    cert_dir = tmp_path / "certs"
    async with running(Signer(apiserver, ca)):
        async with requester(config, cert_dir):
            pass
        serial = serial_on_disk(cert_dir)
        async with requester(config, cert_dir) as again:
            assert again.requests == 0
            assert again.current is not None and again.current.serial == serial
        assert len(csrs(apiserver)) == 1
        assert serial_on_disk(cert_dir) == serial


async def test_restart_past_the_rotation_deadline_requests_at_once(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path
) -> None:
    cert_dir = tmp_path / "certs"
    # 95 % of the hour gone: past any deadline (70-90 %), though not expired.
    old = Signer(apiserver, ca, backdate=dt.timedelta(minutes=57))
    async with running(old), requester(config, cert_dir):
        pass
    serial = serial_on_disk(cert_dir)
    async with running(Signer(apiserver, ca, seen=dict(old.seen))):
        async with requester(config, cert_dir) as again:
            assert again.requests == 1
    assert serial_on_disk(cert_dir) != serial


def sans_of(cert_dir: Path) -> set[str]:
    cert = load_cert(cert_dir / "tls.crt")
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    return {str(n.value) for n in ext.value}


async def test_a_server_whose_node_gains_an_address_requests_a_certificate_at_once(
    apiserver: APIServer, ca: CA, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An address the node gains is one agents may dial: the server asks for a certificate
    that has it before its rotation point (an hour away here). A name it lost, or one the
    signer will not give, makes no new request (no CSR loop)."""
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    await publish_bundle(apiserver, ca[0])
    token = apiserver.add_service_account("ravenproxy-server", "cloud-1")
    config = kubeconfig(tmp_path / "kubeconfig", apiserver, token)
    cert_dir = tmp_path / "certs"
    names = ["cloud-1", "192.0.2.10"]

    async def sans() -> list[str]:
        return list(names)

    settings = RequestSettings(
        role="server",
        node="cloud-1",
        cert_dir=cert_dir,
        retry_base=0.3,
        retry_cap=1.0,
        request_timeout=20.0,
        san_check_interval=0.1,
    )
    signer = Signer(apiserver, ca, drop=("192.0.2.99",))
    api = connect(config)
    req = CertificateRequester(api, settings, sans=sans)
    task: asyncio.Task[None] | None = None
    try:
        async with running(signer):
            await req.bootstrap()
            task = asyncio.create_task(req.run(), name="test-cert-rotate")
            assert sans_of(cert_dir) == {"cloud-1", "192.0.2.10"}
            first = serial_on_disk(cert_dir)

            names.append("192.0.2.20")
            await eventually(
                lambda: serial_on_disk(cert_dir) != first, 10, what="a certificate with .20"
            )
            assert sans_of(cert_dir) == {"cloud-1", "192.0.2.10", "192.0.2.20"}
            assert req.requests == 2
            assert "certificate lacks names the node now has" in caplog.text

            names.remove("192.0.2.10")  # lost: kept until the rotation point
            names.append("192.0.2.99")  # the signer leaves it out: asked for once
            await eventually(lambda: req.requests == 3, 10, what="a request for .99")
            await asyncio.sleep(1.0)  # ten looks at the names
            assert req.requests == 3
            assert "192.0.2.99" not in sans_of(cert_dir)
            assert len(signer.seen) == 3
    finally:
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await req.close()
        await api.close()


async def test_rotation_at_70_to_90_percent_of_a_60s_lifetime(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    cert_dir = tmp_path / "certs"
    # 40 s of the 60 already gone, so the deadline (42-54 s) is 2-14 s away.
    signer = Signer(
        apiserver, ca, lifetime=dt.timedelta(seconds=60), backdate=dt.timedelta(seconds=40)
    )
    async with running(signer), requester(config, cert_dir, run=True) as req:
        first = load_cert(cert_dir / "tls.crt")
        first_key = (cert_dir / "tls.key").read_bytes()
        await eventually(lambda: len(signer.seen) >= 2, 40, interval=0.1, what="a second CSR")
        await eventually(
            lambda: serial_on_disk(cert_dir) != first.serial_number, 10, what="new tls.crt"
        )
        assert req.requests == 2
        second = sorted(signer.seen.values())[1]
        at = second - first.not_valid_before_utc.timestamp()
        assert 0.7 * 60 - 0.5 <= at <= 0.9 * 60 + 2.0, at
        assert (cert_dir / "tls.key").read_bytes() != first_key  # a new key per request
        assert key_matches(load_cert(cert_dir / "tls.crt"), load_key(cert_dir / "tls.key"))
    assert "certificate rotation due" in [r.getMessage() for r in caplog.records]


class Relay:
    """The API's address as the requester knows it: a TCP relay to the emulator that can be
    cut (connections reset, port closed) and restored on the same port."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers |= {writer, up_writer}
        pipes = [
            asyncio.create_task(_pipe(reader, up_writer), name="test-relay-up"),
            asyncio.create_task(_pipe(up_reader, writer), name="test-relay-down"),
        ]
        self._tasks.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._tasks.difference_update(pipes)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()


async def test_api_away_during_rotation_keeps_the_files_and_retries(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    relay = Relay(apiserver.port)
    await relay.start()
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    via_relay = kubeconfig(tmp_path / "relay-kubeconfig", apiserver, token)
    via_relay.write_text(
        via_relay.read_text().replace(apiserver.url, f"http://127.0.0.1:{relay.port}")
    )
    cert_dir = tmp_path / "certs"
    # 50 s of 60 gone: the rotation deadline (42-54 s) is passed or at most 4 s away.
    signer = Signer(
        apiserver, ca, lifetime=dt.timedelta(seconds=60), backdate=dt.timedelta(seconds=50)
    )
    try:
        async with running(signer):
            async with requester(via_relay, cert_dir) as req:
                before = {n: (cert_dir / n).read_bytes() for n in ("tls.key", "tls.crt", "ca.crt")}
                await relay.cut()
                task = asyncio.create_task(req.run(), name="test-cert-rotate")
                try:

                    def retries() -> int:
                        return sum(
                            r.getMessage() == "cannot request a certificate, retrying"
                            for r in caplog.records
                        )

                    await eventually(lambda: retries() >= 2, 15, interval=0.1, what="retries")
                    after = {n: (cert_dir / n).read_bytes() for n in before}
                    assert after == before  # the current set stays in place meanwhile
                    assert len(signer.seen) == 1
                    await relay.start()
                    await eventually(
                        lambda: (cert_dir / "tls.crt").read_bytes() != before["tls.crt"],
                        15,
                        interval=0.1,
                        what="a new certificate once the API is back",
                    )
                    # This signer backdates every certificate by 50 s of 60, so the new one is
                    # due at once too: on a slow machine a third request may already be out.
                    assert len(signer.seen) >= 2
                finally:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
                # Stopped, so no further rotation is half-written: the pair on disk matches.
                assert key_matches(load_cert(cert_dir / "tls.crt"), load_key(cert_dir / "tls.key"))
    finally:
        await relay.cut()


async def test_ca_bundle_change_rewrites_ca_crt(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path
) -> None:
    cert_dir = tmp_path / "certs"
    async with running(Signer(apiserver, ca)), requester(config, cert_dir, run=True):
        assert len(x509.load_pem_x509_certificates((cert_dir / "ca.crt").read_bytes())) == 1
        new_ca, _ = generate_ca("next-ca")
        await publish_bundle(apiserver, ca[0], new_ca)  # a CA rotation adds the next CA
        await eventually(
            lambda: len(x509.load_pem_x509_certificates((cert_dir / "ca.crt").read_bytes())) == 2,
            10,
            interval=0.05,
            what="ca.crt with both CAs",
        )


async def test_a_certificate_the_bundle_no_longer_vouches_for_is_replaced_at_once(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CA rotation done too fast: the new CA is added to the bundle (nothing happens: the
    certificate is still trusted), the signer switches to it, and the old CA is removed before
    this node renewed. Its certificate, which every peer now refuses, is replaced at once, not
    at its rotation point (an hour away here), by one from the new CA."""
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    cert_dir = tmp_path / "certs"
    new_ca = generate_ca("next-ca")
    old_signer = Signer(apiserver, ca)
    async with running(old_signer), requester(config, cert_dir, run=True) as req:
        serial, first = serial_on_disk(cert_dir), req.requests  # the bootstrap's
        await publish_bundle(apiserver, ca[0], new_ca[0])

        def cas_on_disk() -> int:
            return len(x509.load_pem_x509_certificates((cert_dir / "ca.crt").read_bytes()))

        await eventually(lambda: cas_on_disk() == 2, 10, interval=0.05, what="both CAs")
        await asyncio.sleep(0.5)
        assert req.requests == first and serial_on_disk(cert_dir) == serial
    async with running(Signer(apiserver, new_ca, seen=dict(old_signer.seen))):
        async with requester(config, cert_dir, run=True) as req:
            assert req.requests == 0  # a restart keeps it: still trusted
            await publish_bundle(apiserver, new_ca[0])
            await eventually(lambda: req.requests == 1, 10, interval=0.05, what="a new CSR")
            await eventually(
                lambda: is_issued_by(load_cert(cert_dir / "tls.crt"), new_ca[0]),
                10,
                interval=0.05,
                what="a certificate from the new CA",
            )
            await asyncio.sleep(0.5)
            assert req.requests == 1
    (untrusted,) = [
        r
        for r in caplog.records
        if r.getMessage() == "certificate not trusted by the CA bundle, requesting a new one"
    ]
    assert "unable to get local issuer certificate" in untrusted.fields["reason"]  # type: ignore[attr-defined]


async def test_a_rotation_under_way_when_the_ca_is_dropped_makes_one_request_not_two(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The old CA leaves the bundle while this node's rotation is pending: the certificate in
    place is flagged, then the pending request is issued by the new CA. That certificate is
    trusted: no second request follows it (one was made for a flag raised on its
    predecessor)."""
    caplog.set_level(logging.INFO, "ravenproxy.kube.certificates")
    cert_dir = tmp_path / "certs"
    new_ca = generate_ca("next-ca")
    await publish_bundle(apiserver, ca[0], new_ca[0])
    # Rotation at 70 % of a 6 s lifetime, while no signer answers.
    old_signer = Signer(apiserver, ca, lifetime=dt.timedelta(seconds=6))
    async with running(old_signer):
        async with requester(config, cert_dir, rng=lambda: 0.0) as req:
            pass
    async with requester(config, cert_dir, run=True, rng=lambda: 0.0) as req:
        await eventually(lambda: len(csrs(apiserver)) == 2, 15, interval=0.05, what="rotation")
        await publish_bundle(apiserver, new_ca[0])
        await eventually(
            lambda: (
                "certificate not trusted by the CA bundle, requesting a new one"
                in [r.getMessage() for r in caplog.records]
            ),
            10,
            interval=0.05,
            what="the certificate in place flagged",
        )
        new_signer = Signer(apiserver, new_ca, seen=dict(old_signer.seen))
        async with running(new_signer):
            await eventually(
                lambda: is_issued_by(load_cert(cert_dir / "tls.crt"), new_ca[0]),
                15,
                interval=0.05,
                what="a certificate from the new CA",
            )
            await asyncio.sleep(1.0)
        assert len(csrs(apiserver)) == 2 and req.requests == 1


async def test_a_cert_dir_that_cannot_be_written_is_an_error_naming_it(
    apiserver: APIServer, ca: CA, config: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--cert-dir under a file is a line naming it (it was a NotADirectoryError traceback);
    a ca.crt that cannot be replaced once running is logged, and the requester goes on (its
    task died with the OSError)."""
    (tmp_path / "file").write_text("")
    with pytest.raises(PKIError, match=r"--cert-dir .*/file/certs: cannot create it: Not a"):
        async with requester(config, tmp_path / "file" / "certs"):
            pass
    cert_dir = tmp_path / "certs"
    async with running(Signer(apiserver, ca)), requester(config, cert_dir, run=True) as req:
        (cert_dir / "ca.crt").unlink()
        (cert_dir / "ca.crt").mkdir()  # no file can be renamed over it
        await publish_bundle(apiserver, ca[0], generate_ca("next-ca")[0])
        await eventually(
            lambda: "CA bundle not written" in [r.getMessage() for r in caplog.records],
            10,
            interval=0.05,
            what="the failed write logged",
        )
        (cert_dir / "ca.crt").rmdir()
        await publish_bundle(apiserver, ca[0])
        await eventually(lambda: (cert_dir / "ca.crt").is_file(), 10, what="ca.crt again")
        assert req.requests == 1


async def test_agent_process_with_cert_dir_bootstraps_and_connects(
    apiserver: APIServer, tmp_path: Path
) -> None:
    """``ravenproxy agent --cert-dir D --kubeconfig K``: no certificate at start; it requests
    one (signed by the CA of the real server's embedded PKI), then connects and serves."""
    cluster = Cluster(tmp_path)
    cluster_ca = (load_cert(cluster.certs / "ca.crt"), load_key(cluster.certs / "ca.key"))
    await publish_bundle(apiserver, cluster_ca[0])
    token = apiserver.add_service_account("ravenproxy-agent", "edge-1")
    config = kubeconfig(tmp_path / "kubeconfig", apiserver, token)
    cert_dir = tmp_path / "agent-certs"
    signer = Signer(apiserver, cluster_ca)
    try:
        async with running(signer), tcp_server(echo) as port:
            cluster.start_server()
            await cluster.wait_up()
            agent = cluster.start_agent(
                "edge-1",
                f"127.0.0.1:{port}",
                cert_dir=cert_dir,
                extra=("--kubeconfig", str(config)),
            )
            await cluster.wait_routable(f"edge-1:{port}")
            reader, writer = await cluster.connect(f"edge-1:{port}")
            writer.write(b"issued by csr")
            assert await reader.readexactly(13) == b"issued by csr"
            writer.close()
            (csr,) = csrs(apiserver)
            assert csr["spec"]["extra"]["authentication.kubernetes.io/node-name"] == ["edge-1"]
            assert load_cert(cert_dir / "tls.crt").subject.rfc4514_string() == "CN=edge-1"
            assert stat.S_IMODE((cert_dir / "tls.key").stat().st_mode) == 0o600
            log = agent.output()
            assert "certificate requested" in log and "certificate issued" in log
    finally:
        cluster.stop_all()


async def test_server_process_with_cert_dir_requests_its_names_and_serves_agents(
    apiserver: APIServer, tmp_path: Path
) -> None:
    """``ravenproxy server --cert-dir D --kube-model``: the CSR carries the node's addresses, the
    internal Service's ClusterIP and names and ``--server-san``; an agent of the embedded PKI
    verifies the issued certificate (by IP) and its streams flow."""
    await apiserver.put("gateways", gateway_obj("gw-cloud", ["cloud-1"]))
    await apiserver.put("gateways", gateway_obj("gw-edge", ["edge-1"]))
    await apiserver.put("nodes", node_obj("cloud-1", "127.0.0.1", "gw-cloud"))
    await apiserver.put("nodes", node_obj("edge-1", "127.0.0.1", "gw-edge"))
    await apiserver.put(
        "services",
        {
            "metadata": {"name": "x-raven-proxy-internal-svc", "namespace": "kube-system"},
            "spec": {"clusterIP": "10.96.0.42", "ports": [{"port": 10263}]},
        },
    )
    cluster = Cluster(tmp_path)
    cluster_ca = (load_cert(cluster.certs / "ca.crt"), load_key(cluster.certs / "ca.key"))
    await publish_bundle(apiserver, cluster_ca[0])
    token = apiserver.add_service_account("ravenproxy-server", "cloud-1")
    config = str(kubeconfig(tmp_path / "kubeconfig", apiserver, token))
    cert_dir = tmp_path / "server-certs"
    try:
        async with running(Signer(apiserver, cluster_ca)), tcp_server(echo) as port:
            server = cluster.start_server(
                "--server-san", "proxy.example",
                extra_source=("--kube-model", "--kubeconfig", config),
                cert_dir=cert_dir,
            )  # fmt: skip
            await cluster.wait_up()
            cluster.start_agent("edge-1", f"127.0.0.1:{port}")
            await cluster.wait_routable(f"edge-1:{port}")
            reader, writer = await cluster.connect(f"edge-1:{port}")
            writer.write(b"server by csr")
            assert await reader.readexactly(13) == b"server by csr"
            writer.close()
            (csr,) = csrs(apiserver)
            assert csr["spec"]["signerName"] == "raven.openyurt.io/tunnel-server"
            assert csr["spec"]["usages"] == ["digital signature", "server auth"]
            requested = x509.load_pem_x509_csr(base64.b64decode(csr["spec"]["request"]))
            assert requested.subject.rfc4514_string() == "CN=cloud-1"
            sans = requested.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            names = {str(n.value) for n in sans.value}
            assert {
                "cloud-1",
                "127.0.0.1",
                "10.96.0.42",
                "x-raven-proxy-internal-svc.kube-system.svc",
                "proxy.example",
            } <= names
            assert "certificate issued" in server.output()
    finally:
        cluster.stop_all()
