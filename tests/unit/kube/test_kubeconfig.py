"""Reading a kubeconfig and the in-cluster service account: each field, each refusal, each
error naming the file and the field."""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path
from typing import Any

import pytest
import yaml

from ravenproxy.kube.kubeconfig import KubeConfigError, TokenFile, from_kubeconfig, in_cluster
from ravenproxy.pki import init_pki


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("certs")
    init_pki(d, ("localhost",), ("edge-1",))
    return d


def write(
    path: Path,
    cluster: dict[str, Any],
    user: dict[str, Any] | None = None,
    *,
    as_json: bool = False,
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user or {}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(json.dumps(doc) if as_json else yaml.safe_dump(doc))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.parametrize("as_json", [False, True])
def test_server_and_token(tmp_path: Path, as_json: bool) -> None:
    path = write(
        tmp_path / "kc", {"server": "https://api.example:6443/"}, {"token": "t1"}, as_json=as_json
    )
    access = from_kubeconfig(path)
    assert access.server == "https://api.example:6443"
    assert access.authorization() == "Bearer t1"
    assert access.origin == str(path)


def test_token_file_is_relative_to_the_kubeconfig_and_read_again(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    access = from_kubeconfig(write(tmp_path / "kc", {"server": "http://x"}, {"tokenFile": "token"}))
    assert access.authorization() == "Bearer first"
    (tmp_path / "token").write_text("second\n")
    assert access.authorization() == "Bearer first"  # cached for a minute, as client-go does
    assert access.token_file is not None
    access.token_file.reread = 0
    assert access.authorization() == "Bearer second"


def test_a_token_file_that_goes_away_keeps_the_last_token(tmp_path: Path) -> None:
    token = TokenFile(tmp_path / "token", reread=0)
    (tmp_path / "token").write_text("t")
    assert token.token() == "t"
    (tmp_path / "token").unlink()
    assert token.token() == "t"


def test_an_empty_token_file_keeps_the_last_token_or_is_refused(tmp_path: Path) -> None:
    """Read empty (the kubelet swapping it), a token file keeps the last token, as client-go's
    cached token source does; empty at start it is refused: requests would go out anonymous."""
    token = TokenFile(tmp_path / "token", reread=0)
    (tmp_path / "token").write_text("t\n")
    assert token.token() == "t"
    (tmp_path / "token").write_text("")
    assert token.token() == "t"
    kc = write(tmp_path / "kc", {"server": "https://h"}, {"tokenFile": "token"})
    with pytest.raises(KubeConfigError, match=r"users\[\]\.user\.tokenFile: .*empty"):
        from_kubeconfig(kc)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match="token: cannot read the token: the file is empty"):
        in_cluster(env, tmp_path)


def test_no_user_is_anonymous_http(tmp_path: Path) -> None:
    access = from_kubeconfig(write(tmp_path / "kc", {"server": "http://127.0.0.1:8080"}))
    assert access.authorization() is None
    assert access.ssl_context() is None


def test_certificate_authority_file_and_data(tmp_path: Path, certs: Path) -> None:
    ca = (certs / "ca.crt").read_bytes()
    by_file = from_kubeconfig(
        write(
            tmp_path / "a", {"server": "https://h", "certificate-authority": str(certs / "ca.crt")}
        )
    )
    by_data = from_kubeconfig(
        write(tmp_path / "b", {"server": "https://h", "certificate-authority-data": b64(ca)})
    )
    assert by_file.ca_pem == by_data.ca_pem == ca
    ctx = by_data.ssl_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert len(ctx.get_ca_certs()) == 1


def test_a_context_with_a_ca_never_loads_the_systems_store(
    tmp_path: Path, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The system's CA store (~150 certificates parsed: ~1.1 MiB of an agent's resident set)
    is loaded only where it is used: with no CA given (issue 15)."""
    ca = (certs / "ca.crt").read_bytes()
    loads: list[object] = []
    real = ssl.SSLContext.load_default_certs

    def load_default_certs(self: ssl.SSLContext, *args: object) -> None:
        loads.append(args)
        real(self, *args)

    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", load_default_certs)
    with_ca = from_kubeconfig(
        write(tmp_path / "a", {"server": "https://h", "certificate-authority-data": b64(ca)})
    )
    ctx = with_ca.ssl_context()
    assert ctx is not None and len(ctx.get_ca_certs()) == 1 and not loads
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    without = from_kubeconfig(write(tmp_path / "b", {"server": "https://h"}))
    assert without.ssl_context() is not None and len(loads) == 1


def test_data_fields_wrapped_over_lines_are_read(tmp_path: Path, certs: Path) -> None:
    """``base64`` wraps its output at 76 columns; kubectl (Go's base64) skips the breaks."""
    ca = (certs / "ca.crt").read_bytes()
    wrapped = "\n".join(b64(ca)[i : i + 76] for i in range(0, len(b64(ca)), 76)) + "\n"
    access = from_kubeconfig(
        write(tmp_path / "kc", {"server": "https://h", "certificate-authority-data": wrapped})
    )
    assert access.ca_pem == ca


def test_tls_server_name(tmp_path: Path) -> None:
    access = from_kubeconfig(
        write(tmp_path / "kc", {"server": "https://10.0.0.1", "tls-server-name": "api.internal"})
    )
    assert access.tls_server_name == "api.internal"


def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    access = from_kubeconfig(
        write(tmp_path / "kc", {"server": "https://h", "insecure-skip-tls-verify": True})
    )
    ctx = access.ssl_context()
    assert ctx is not None and ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname


@pytest.mark.parametrize("form", ["file", "data"])
def test_client_certificate_and_key(tmp_path: Path, certs: Path, form: str) -> None:
    crt, key = certs / "edge-1.crt", certs / "edge-1.key"
    if form == "file":
        user = {"client-certificate": str(crt), "client-key": str(key)}
    else:
        user = {
            "client-certificate-data": b64(crt.read_bytes()),
            "client-key-data": b64(key.read_bytes()),
        }
    access = from_kubeconfig(write(tmp_path / "kc", {"server": "https://h"}, user))
    assert access.cert_pem == crt.read_bytes() and access.key_pem == key.read_bytes()
    assert access.ssl_context() is not None  # the pair loads


@pytest.mark.parametrize(
    ("cluster", "user", "field"),
    [
        ({"server": "https://h"}, {"exec": {"command": "aws"}}, "users[].user.exec"),
        ({"server": "https://h"}, {"auth-provider": {"name": "gcp"}}, "users[].user.auth-provider"),
        ({"server": "h:6443"}, {}, "clusters[].cluster.server"),
        ({"server": "https://h", "proxy-url": "http://p:3128"}, {}, "clusters[].cluster.proxy-url"),
        ({}, {}, "clusters[].cluster.server"),
        ({"server": "https://h"}, {"client-certificate-data": "eA=="}, "users[].user.client-key"),
        ({"server": "https://h"}, {"client-key-data": "eA=="}, "users[].user.client-certificate"),
        ({"server": "https://h"}, {"client-key-data": "!!", "client-certificate-data": "eA=="},
         "users[].user.client-key-data: not base64"),
        ({"server": "https://h", "certificate-authority": "nope.crt"}, {},
         "clusters[].cluster.certificate-authority: cannot read"),
        ({"server": "https://h"}, {"tokenFile": "nope"}, "users[].user.tokenFile"),
        ({"server": "https://h:6443x"}, {}, "clusters[].cluster.server: Port could not be cast"),
        ({"server": "https://h:99999"}, {}, "clusters[].cluster.server: Port out of range"),
        ({"server": "https://:6443"}, {}, "clusters[].cluster.server: no host"),
        ({"server": "https://h", "insecure-skip-tls-verify": "false"}, {},
         "clusters[].cluster.insecure-skip-tls-verify: not true or false: 'false'"),
        ({"server": "https://h", "insecure-skip-tls-verify": True,
          "certificate-authority-data": "eA=="}, {},
         "clusters[].cluster.insecure-skip-tls-verify: not allowed with certificate-authority"),
    ],
)  # fmt: skip
def test_refusals_name_the_file_and_the_field(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], field: str
) -> None:
    path = write(tmp_path / "kc", cluster, user)
    with pytest.raises(KubeConfigError) as err:
        from_kubeconfig(path)
    assert str(err.value).startswith(f"{path}: ") and field in str(err.value)
    assert "\n" not in str(err.value)


def test_a_client_pair_that_does_not_load(tmp_path: Path, certs: Path) -> None:
    user = {"client-certificate-data": b64(b"junk"), "client-key-data": b64(b"junk")}
    access = from_kubeconfig(write(tmp_path / "kc", {"server": "https://h"}, user))
    with pytest.raises(KubeConfigError, match="client-certificate / client-key"):
        access.ssl_context()


def test_an_encrypted_client_key_is_refused_not_prompted_for(tmp_path: Path, certs: Path) -> None:
    """ssl would ask for the passphrase on the terminal (kubectl cannot use one either)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key((certs / "edge-1.key").read_bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    user = {
        "client-certificate-data": b64((certs / "edge-1.crt").read_bytes()),
        "client-key-data": b64(encrypted),
    }
    path = write(tmp_path / "kc", {"server": "https://h"}, user)
    with pytest.raises(KubeConfigError) as err:
        from_kubeconfig(path).ssl_context()
    assert str(err.value).startswith(f"{path}: users[].user.client-certificate / client-key")
    assert str(err.value).endswith("key is encrypted; an unencrypted key is needed")


@pytest.mark.parametrize("form", ["file", "data"])
def test_a_ca_that_is_not_pem_names_the_field(tmp_path: Path, form: str) -> None:
    """Not an ssl.SSLError traceback at the client's start: a line naming the field."""
    (tmp_path / "ca.crt").write_bytes(b"junk")
    if form == "file":
        cluster = {"server": "https://h", "certificate-authority": "ca.crt"}
    else:
        cluster = {"server": "https://h", "certificate-authority-data": b64(b"junk")}
    path = write(tmp_path / "kc", cluster)
    with pytest.raises(KubeConfigError) as err:
        from_kubeconfig(path).ssl_context()
    assert str(err.value).startswith(
        f"{path}: clusters[].cluster.certificate-authority: not a PEM CA certificate"
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    (tmp_path / "token").write_text("t")
    with pytest.raises(KubeConfigError, match=r"in-cluster: .*ca\.crt: not a PEM CA certificate"):
        in_cluster(env, tmp_path).ssl_context()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("current-context: x\n", "contexts: no entry named 'x'"),
        ("clusters: []\n", "current-context: not set"),
        ("- a list\n", "not a kubeconfig"),
        ("a: [\n", "not YAML"),
    ],
)
def test_broken_documents(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "kc"
    path.write_text(text)
    with pytest.raises(KubeConfigError, match=message):
        from_kubeconfig(path)


def test_a_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="cannot load kubeconfig"):
        from_kubeconfig(tmp_path / "nope")


def test_in_cluster(tmp_path: Path, certs: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "ca.crt").write_bytes((certs / "ca.crt").read_bytes())
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    access = in_cluster(env, tmp_path)
    assert access.server == "https://10.96.0.1:443"
    assert access.authorization() == "Bearer sa-token"
    assert access.ca_pem == (certs / "ca.crt").read_bytes()
    v6 = in_cluster({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path)
    assert v6.server == "https://[fd00::1]:443"


def test_in_cluster_refusals(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match=r"not in a cluster .* no --kubeconfig given"):
        in_cluster({}, tmp_path)
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeConfigError, match="token: cannot read the token"):
        in_cluster(env, tmp_path)
    (tmp_path / "token").write_text("t")
    with pytest.raises(KubeConfigError, match=r"in-cluster: ca\.crt: cannot read"):
        in_cluster(env, tmp_path)
    with pytest.raises(KubeConfigError, match="KUBERNETES_SERVICE_PORT: not a port: 'https'"):
        in_cluster({**env, "KUBERNETES_SERVICE_PORT": "https"}, tmp_path)
