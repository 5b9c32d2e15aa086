"""Where the Kubernetes API is and who we are to it: a kubeconfig file, or the pod's service
account.

A kubeconfig's current context names a cluster (``server``, ``certificate-authority`` /
``-data``, ``insecure-skip-tls-verify`` (a boolean, and not with a CA, as client-go rules),
``tls-server-name``; ``proxy-url`` is refused) and a
user (``token``, ``tokenFile``, ``client-certificate`` / ``-data`` with ``client-key`` /
``-data``). ``exec`` and ``auth-provider`` users run plugins we do not carry: they are refused
with a line naming the field.
In a pod (no kubeconfig), ``KUBERNETES_SERVICE_HOST`` / ``_PORT`` give the server and the mounted
service account its token and CA. Tokens read from a file are read again every minute (what
client-go does), so a token the kubelet rotates is picked up; a read that fails or finds the
file empty keeps the last token. Relative paths in a kubeconfig are
relative to the file, as kubectl reads them.

Every error is a :class:`KubeConfigError` naming the file and the field. This module reads files
only: :mod:`ravenproxy.kube.rest` speaks to the server.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ravenproxy.errors import RavenProxyError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# client-go's cached token source re-reads the file this often.
TOKEN_REREAD = 60.0


class KubeConfigError(RavenProxyError):
    """No usable API access: a kubeconfig or the service account is missing or wrong."""


@dataclass
class TokenFile:
    """A bearer token kept in a file, read again once it is ``reread`` seconds old."""

    path: Path
    reread: float = TOKEN_REREAD
    _token: str = field(default="", init=False)
    _read_at: float = field(default=float("-inf"), init=False)

    def token(self) -> str:
        now = time.monotonic()
        if now - self._read_at >= self.reread:
            try:
                token = self.path.read_text().strip()
                problem = "" if token else "the file is empty"
            except OSError as exc:
                token, problem = "", str(exc)
            if problem:
                # Keep the last one (client-go's cached token source does): the kubelet may be
                # swapping the file. Without one, a request would go out anonymous.
                if not self._token:
                    raise KubeConfigError(f"{self.path}: cannot read the token: {problem}")
                token = self._token
            self._token, self._read_at = token, now
        return self._token


@dataclass(frozen=True)
class ClusterAccess:
    """How to reach one API server: its URL, how to trust it and how to authenticate."""

    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    """The name the server's certificate is checked against, when not the URL's host."""
    token: str | None = None
    token_file: TokenFile | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    origin: str = ""
    """Where this came from (a kubeconfig path, "in-cluster"), for error messages."""
    ca_field: str = "clusters[].cluster.certificate-authority"
    """The field ``ca_pem`` came from, for error messages."""
    pair_files: tuple[Path, Path] | None = None
    """The files ``cert_pem`` and ``key_pem`` were read from (not ``-data``): read again when
    they change (:meth:`pair_stamp`), as client-go reloads them: a kubelet-style rotated
    client certificate is used before the one loaded at start expires."""

    @property
    def tls(self) -> bool:
        return self.server.startswith("https://")

    def authorization(self) -> str | None:
        """The ``Authorization`` header value, if any (a file token is re-read when stale)."""
        token = self.token_file.token() if self.token_file is not None else self.token
        return f"Bearer {token}" if token else None

    def pair_stamp(self) -> tuple[int, ...] | None:
        """What the client certificate and key files are now (inode, mtime, size of each;
        None when they are not files, or cannot be looked at)."""
        if self.pair_files is None:
            return None
        try:
            stats = [os.stat(path) for path in self.pair_files]
        except OSError:
            return None
        return tuple(v for st in stats for v in (st.st_ino, st.st_mtime_ns, st.st_size))

    def reread_pair(self) -> ClusterAccess:
        """This access with its client certificate and key read again from their files."""
        if self.pair_files is None:
            return self
        cert_file, key_file = self.pair_files
        return replace(
            self,
            cert_pem=_read(cert_file, self.origin, "users[].user.client-certificate"),
            key_pem=_read(key_file, self.origin, "users[].user.client-key"),
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client context for an https server (None for http)."""
        if not self.tls:
            return None
        if self.ca_pem is not None and not self.insecure:
            # Only this CA: the system's store (~150 certificates, ~1.1 MiB of a process's
            # resident set once parsed) is not loaded for a context that does not use it.
            try:
                ctx = ssl.create_default_context(
                    ssl.Purpose.SERVER_AUTH, cadata=self.ca_pem.decode("ascii", "replace")
                )
            except (ssl.SSLError, ValueError) as exc:
                raise KubeConfigError(
                    f"{self.origin}: {self.ca_field}: not a PEM CA certificate: "
                    f"{getattr(exc, 'reason', None) or exc}"
                ) from None
        else:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
            if self.insecure:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
        if self.cert_pem is not None and self.key_pem is not None:
            _load_chain(ctx, self.cert_pem, self.key_pem, self.origin)
        return ctx


def _load_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes, origin: str) -> None:
    # ssl loads a chain from files only: in-memory ones (the key never lands on a disk), and
    # an encrypted key refused rather than prompted for on the terminal.
    from ravenproxy.pki.x509info import KeyPairError, load_pair, private_file

    with private_file(cert) as cert_path, private_file(key) as key_path:
        try:
            load_pair(ctx, cert_path, key_path)
        except KeyPairError as exc:
            raise KubeConfigError(
                f"{origin}: users[].user.client-certificate / client-key: not a certificate "
                f"and its key: {exc.reason}"
            ) from None


def load(kubeconfig: str | os.PathLike[str] | None) -> ClusterAccess:
    """From ``kubeconfig``, or from the in-cluster service account when it is None."""
    return from_kubeconfig(Path(kubeconfig)) if kubeconfig is not None else in_cluster()


def in_cluster(
    env: Mapping[str, str] | None = None, account: Path = SERVICE_ACCOUNT
) -> ClusterAccess:
    """The pod's service account (what client-go's ``InClusterConfig`` reads)."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError(
            "not in a cluster (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set) "
            "and no --kubeconfig given"
        )
    if ":" in host:
        host = f"[{host}]"  # an IPv6 service address
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise KubeConfigError(f"in-cluster: KUBERNETES_SERVICE_PORT: not a port: {port!r}")
    token = TokenFile(account / "token")
    token.token()  # a missing token fails the start, not the first call
    return ClusterAccess(
        server=f"https://{host}:{port}",
        ca_pem=_read(account / "ca.crt", "in-cluster", "ca.crt"),
        token_file=token,
        origin="in-cluster",
        ca_field=str(account / "ca.crt"),
    )


def from_kubeconfig(path: Path) -> ClusterAccess:
    """The current context of the kubeconfig at ``path``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeConfigError(f"{path}: cannot load kubeconfig: {exc}") from None
    return parse(text, path)


def parse(text: str, path: Path) -> ClusterAccess:
    """A kubeconfig's text (YAML or JSON) → its current context's access; ``path`` names the
    file in errors and anchors its relative paths."""
    doc = _document(text, path)
    where = str(path)
    current = doc.get("current-context")
    if not current:
        raise KubeConfigError(f"{where}: current-context: not set")
    context = _named(doc, "contexts", "context", str(current), where)
    cluster = _named(doc, "clusters", "cluster", str(context.get("cluster") or ""), where)
    user_name = context.get("user")
    user = _named(doc, "users", "user", str(user_name), where) if user_name else {}
    base = path.parent
    server = str(cluster.get("server") or "")
    if not server.startswith(("https://", "http://")):
        raise KubeConfigError(f"{where}: clusters[].cluster.server: not an http(s) URL: {server!r}")
    try:
        url = urlsplit(server)
        url.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as exc:
        raise KubeConfigError(f"{where}: clusters[].cluster.server: {exc}: {server!r}") from None
    if not url.hostname:
        raise KubeConfigError(f"{where}: clusters[].cluster.server: no host in {server!r}")
    if cluster.get("proxy-url"):
        raise KubeConfigError(
            f"{where}: clusters[].cluster.proxy-url: proxies are not supported; "
            "give a server reachable directly"
        )
    for refused in ("exec", "auth-provider"):
        if user.get(refused):
            raise KubeConfigError(
                f"{where}: users[].user.{refused}: credential plugins are not supported; "
                "give a token, tokenFile or client certificate"
            )
    token_file = None
    if user.get("tokenFile"):
        token_file = TokenFile(base / str(user["tokenFile"]))
        try:
            token_file.token()
        except KubeConfigError as exc:
            raise KubeConfigError(f"{where}: users[].user.tokenFile: {exc}") from None
    cert = _pem(user, "client-certificate", base, where)
    key = _pem(user, "client-key", base, where)
    if (cert is None) != (key is None):
        missing = "client-key" if key is None else "client-certificate"
        raise KubeConfigError(f"{where}: users[].user.{missing}: required with the other one")
    insecure = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(insecure, bool):
        # A quoted "false" is a string, and a non-empty string is true: refused, as kubectl
        # refuses it, rather than read as "do not verify".
        raise KubeConfigError(
            f"{where}: clusters[].cluster.insecure-skip-tls-verify: not true or false: {insecure!r}"
        )
    ca_pem = _pem(cluster, "certificate-authority", base, where, section="clusters[].cluster")
    if insecure and ca_pem is not None:
        # client-go refuses the pair: the CA given would not be checked.
        raise KubeConfigError(
            f"{where}: clusters[].cluster.insecure-skip-tls-verify: not allowed with "
            "certificate-authority (the CA would not be checked)"
        )
    return ClusterAccess(
        server=server.rstrip("/"),
        ca_pem=ca_pem,
        insecure=insecure,
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        token=str(user["token"]) if user.get("token") else None,
        token_file=token_file,
        cert_pem=cert,
        key_pem=key,
        origin=where,
        pair_files=_pair_files(user, base),
    )


def _pair_files(user: Mapping[str, Any], base: Path) -> tuple[Path, Path] | None:
    """The client certificate and key files, when both are files (client-go reloads only
    then)."""
    if user.get("client-certificate-data") or user.get("client-key-data"):
        return None
    if not (user.get("client-certificate") and user.get("client-key")):
        return None
    return base / str(user["client-certificate"]), base / str(user["client-key"])


def _document(text: str, path: Path) -> dict[str, Any]:
    try:
        doc: Any = json.loads(text)
    except ValueError:
        # PyYAML only for a YAML kubeconfig (most are): an in-cluster process never loads it.
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise KubeConfigError(f"{path}: not YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"{path}: not a kubeconfig (a mapping is expected)")
    return doc


def _named(doc: Mapping[str, Any], section: str, key: str, name: str, where: str) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, dict):
                raise KubeConfigError(f"{where}: {section}[{name}].{key}: not a mapping")
            return value
    raise KubeConfigError(f"{where}: {section}: no entry named {name!r}")


def _pem(
    entry: Mapping[str, Any], name: str, base: Path, where: str, section: str = "users[].user"
) -> bytes | None:
    """``name-data`` (base64 of PEM) or ``name`` (a file), the data first as kubectl does."""
    data = entry.get(f"{name}-data")
    if data:
        # Line breaks are skipped, as Go's base64 skips them: `base64` wraps at 76 columns,
        # and kubectl reads such a kubeconfig.
        text = str(data).replace("\n", "").replace("\r", "")
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error:
            raise KubeConfigError(f"{where}: {section}.{name}-data: not base64") from None
    if entry.get(name):
        return _read(base / str(entry[name]), where, f"{section}.{name}")
    return None


def _read(path: Path, where: str, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KubeConfigError(f"{where}: {what}: cannot read {path}: {exc}") from None
