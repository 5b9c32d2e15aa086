"""review35: a kubeconfig's TLS context (built from its CA alone since agentmem4) on real
handshakes. Two authorities: ``ours`` (the kubeconfig's CA) and ``public`` (in the system store:
``SSL_CERT_FILE`` points OpenSSL's default paths at it, as a distribution's bundle would). Given
a CA, only it is trusted (a server of a public CA is refused), the host name is checked, the
client certificate is sent; ``insecure-skip-tls-verify`` trusts anything; without a CA, the
system store is used as before."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
from pathlib import Path

import pytest
import yaml

from ravenproxy.kube.kubeconfig import from_kubeconfig
from ravenproxy.pki import init_pki


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in ("ours", "public"):
        d = tmp_path_factory.mktemp(name)
        init_pki(d, ("localhost",), ("edge-1",))
        out[name] = d
    return out


@pytest.fixture(autouse=True)
def system_store(pkis: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(pkis["public"] / "ca.crt"))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


def kubeconfig(path: Path, cluster: dict[str, object], user: dict[str, object]) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://localhost:6443", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def handshake(
    client: ssl.SSLContext, server_pki: Path, *, name: str = "localhost", ask: Path | None = None
) -> str:
    """A handshake with a server holding ``server_pki``'s server certificate (asking for a
    client certificate of ``ask``'s CA when given): the client's certificate's CN as the
    server saw it ("" without one), or the client's error."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_pki / "server.crt", server_pki / "server.key")
    if ask is not None:
        server.verify_mode = ssl.CERT_OPTIONAL
        server.load_verify_locations(ask / "ca.crt")
    a, b = socket.socketpair()
    seen: list[str] = []

    def serve() -> None:
        try:
            with server.wrap_socket(b, server_side=True) as tls:
                cert = tls.getpeercert() or {}
                subject = cert.get("subject", ())
                seen.extend(v for rdn in subject for k, v in rdn if k == "commonName")
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(a, server_hostname=name) as tls:
            tls.sendall(b"x")
            answer = "ok"
    except ssl.SSLError as exc:
        answer = type(exc).__name__ + ": " + str(exc.reason)
    finally:
        a.close()
        thread.join(10)
    return answer if answer != "ok" else (seen[0] if seen else "")


def access(tmp_path: Path, pkis: dict[str, Path], ca: str, **user: object) -> ssl.SSLContext:
    ours = pkis["ours"] / "ca.crt"
    cluster: dict[str, object] = {
        "file": {"certificate-authority": str(ours)},
        "data": {"certificate-authority-data": base64.b64encode(ours.read_bytes()).decode()},
        "none": {},
        "insecure": {"insecure-skip-tls-verify": True},
    }[ca]
    ctx = from_kubeconfig(kubeconfig(tmp_path / "kubeconfig", cluster, dict(user))).ssl_context()
    assert ctx is not None
    return ctx


@pytest.mark.parametrize("ca", ["file", "data"])
def test_the_kubeconfigs_ca_alone_is_trusted_and_the_host_name_checked(
    tmp_path: Path, pkis: dict[str, Path], ca: str
) -> None:
    ctx = access(tmp_path, pkis, ca)
    assert handshake(ctx, pkis["ours"]) == ""
    # The system store's CA (a public one) is not trusted beside it.
    assert handshake(ctx, pkis["public"]).startswith("SSLCertVerificationError")
    assert len(ctx.get_ca_certs()) == 1 and ctx.verify_mode == ssl.CERT_REQUIRED
    refused = handshake(ctx, pkis["ours"], name="api.example.com")
    assert refused.startswith("SSLCertVerificationError"), refused


def test_without_a_ca_the_system_store_is_trusted(tmp_path: Path, pkis: dict[str, Path]) -> None:
    ctx = access(tmp_path, pkis, "none")
    assert handshake(ctx, pkis["public"]) == ""
    assert handshake(ctx, pkis["ours"]).startswith("SSLCertVerificationError")
    assert handshake(ctx, pkis["public"], name="other").startswith("SSLCertVerificationError")


def test_insecure_skip_tls_verify_trusts_any_server(tmp_path: Path, pkis: dict[str, Path]) -> None:
    ctx = access(tmp_path, pkis, "insecure")
    assert handshake(ctx, pkis["ours"], name="other") == ""
    assert handshake(ctx, pkis["public"]) == ""


@pytest.mark.parametrize("ca", ["file", "data", "none"])
def test_the_client_certificate_is_sent(tmp_path: Path, pkis: dict[str, Path], ca: str) -> None:
    ours = pkis["ours"]
    ctx = access(
        tmp_path,
        pkis,
        ca,
        **{"client-certificate": str(ours / "edge-1.crt"), "client-key": str(ours / "edge-1.key")},
    )
    server = ours if ca != "none" else pkis["public"]
    assert handshake(ctx, server, ask=ours) == "edge-1"
