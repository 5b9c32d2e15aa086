"""The proxy server's settings (``ravenproxy server``), validated once.

Each field is declared once, with its flag and help (:mod:`ravenproxy.flags`); the tunnel's
keepalive, open timeout and window cap are lent by :class:`SessionConfig`.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ravenproxy import config as cfg
from ravenproxy import flags
from ravenproxy.config import Address
from ravenproxy.errors import ConfigError, PKIError
from ravenproxy.flags import setting
from ravenproxy.model.allowlist import Allowlist
from ravenproxy.pki.identity import server_san
from ravenproxy.pki.issuance import CERT_DIR_CA, CERT_LIFETIME, CERT_LIFETIME_OPTION
from ravenproxy.server import limits
from ravenproxy.transport.session import SessionConfig
from ravenproxy.wire.config import WireConfig

DEFAULT_MAX_HEADER_SIZE = 64 * 1024


@dataclass(frozen=True)
class ServerSettings:
    inventory: str | None = setting(
        flag="--inventory",
        metavar="FILE",
        help="YAML inventory of Nodes and Gateways (or --kube-model)",
    )
    """The YAML inventory; None when the model comes from Kubernetes (``kube_model``)."""
    ca_file: str = setting(
        flag="--ca-file",
        metavar="F",
        help="CA that signs agent certificates (with --cert-dir: optional, wins over the CA "
        "bundle)",
        kind="file",
    )
    cert_file: str = setting(
        flag="--cert-file", metavar="F", help="server certificate", kind="file"
    )
    key_file: str = setting(flag="--key-file", metavar="F", help="server key", kind="file")
    cert_dir: str | None = setting(
        None,
        "--cert-dir",
        "DIR",
        "instead of --cert-file/--key-file: request the server certificate from Kubernetes "
        "(a CSR of signer raven.openyurt.io/tunnel-server for --node-name, with the node's "
        "addresses, its gateway's public IPs, the internal Service's ClusterIP and names, and "
        "--server-san) and rotate it, keeping tls.key, tls.crt and ca.crt in DIR; needs "
        "--kubeconfig or the in-cluster account",
    )
    """Kept by :mod:`ravenproxy.kube.certificates`; then ``ca_file``/``cert_file``/``key_file``
    are the files in it (``ca_file``: unless ``--ca-file`` was given)."""
    cert_lifetime: float = field(default=CERT_LIFETIME, metadata=CERT_LIFETIME_OPTION)
    server_sans: tuple[str, ...] = setting(
        (),
        "--server-san",
        "NAME|IP",
        "with --cert-dir: a name or IP added to the server certificate's SANs (repeatable)",
        key="server_san",
    )
    """Extra SANs of the requested server certificate (after the computed ones)."""
    node_name: str | None = setting(
        None, "--node-name", "NODE", "node this server runs on (NODE_NAME)"
    )
    server_id: str | None = setting(
        None,
        "--server-id",
        "ID",
        "this server's identity, announced to agents (the SERVER_ID setting) so that one agent "
        "holds one tunnel per server, also through a load balancer; unique per server, up to "
        "253 bytes; without it: --node-name, else the host name",
    )
    """``--server-id`` as given; :attr:`identity` is the id announced."""
    tunnel_addr: Address = setting(Address("", 10262), "--tunnel-addr", "H:P", "agent listener")
    https_addr: Address = setting(Address("", 10263), "--https-addr", "H:P", "HTTPS front")
    http_addr: Address = setting(Address("", 10264), "--http-addr", "H:P", "HTTP/CONNECT front")
    egress_uds: str | None = setting(
        None,
        "--egress-uds",
        "PATH",
        "serve kube-apiserver's HTTPConnect egress (CONNECT ip:port, as konnectivity-server's "
        "--uds-name) on this Unix socket; a stale socket file is replaced, a live one refused",
    )
    """The egress Unix socket (:mod:`ravenproxy.server.egress`); None: none."""
    egress_uds_mode: str = setting(
        "0600", "--egress-uds-mode", "OCTAL", "permissions of the --egress-uds socket file"
    )
    """Octal text, checked in :meth:`from_mapping` (:attr:`egress_mode` is the number)."""
    egress_uds_owner: str | None = setting(
        None,
        "--egress-uds-owner",
        "USER[:GROUP]",
        "owner of the --egress-uds socket file, by name or number (without it: this process's)",
    )
    egress_addr: Address | None = setting(
        None,
        "--egress-addr",
        "H:P",
        "serve the same egress over TLS (the apiserver's transport.tcp), requiring a client "
        "certificate from --egress-client-ca-file",
    )
    egress_client_ca_file: str | None = setting(
        None,
        "--egress-client-ca-file",
        "F",
        "CA of the client certificates --egress-addr requires (the apiserver's egress "
        "tlsConfig.clientCert)",
        kind="file",
    )
    allow_pods: bool = setting(
        False,
        "--allow-pods",
        help="also let the server dial the pod IPs of its own gateway's nodes, on any port "
        "(egress to cloud-side pods; the agents' --allow-pods)",
    )
    metrics_addr: Address = setting(
        Address("127.0.0.1", 10266), "--metrics-addr", "H:P", "/metrics and /agents"
    )
    health_addr: Address = setting(
        Address("", 10275), "--health-addr", "H:P", "/healthz and /readyz only (probes)"
    )
    session: SessionConfig = field(
        default_factory=SessionConfig,
        metadata={"options": ("open_timeout", "ping_interval", "dead_after", "max_stream_window")},
    )
    drain_timeout: float = setting(
        10.0, "--drain-timeout", "S", "how long shutdown waits for open streams"
    )
    kubelet_ca_file: str | None = setting(
        None,
        "--kubelet-ca-file",
        "F",
        "CA that verifies kubelet certificates when TLS is re-originated (without it: the "
        "system store)",
        kind="file",
    )
    """CA that verifies kubelet serving certificates (re-originated TLS); None: system store."""
    kubelet_cert_file: str | None = setting(
        None, "--kubelet-cert-file", "F", "client certificate presented to kubelets", kind="file"
    )
    """Client certificate presented to kubelets (re-originated TLS)."""
    kubelet_key_file: str | None = setting(None, "--kubelet-key-file", "F", "its key", kind="file")
    front_client_ca_file: str | None = setting(
        None,
        "--front-client-ca-file",
        "F",
        "CA whose client certificates authenticate clients of the HTTPS front; only for them "
        "is --kubelet-cert-file presented (others reach kubelets without a client certificate)",
        kind="file",
    )
    """CA of the HTTPS front's client certificates. Only for a client that presented one is
    the kubelet client certificate presented on re-originated TLS; None: never."""
    kubelet_insecure_skip_verify: bool = setting(
        False,
        "--kubelet-insecure-skip-verify",
        help="do not verify kubelet certificates (logged as a warning)",
    )
    """Do not verify kubelet certificates at all (logged loudly at start-up)."""
    max_header_size: int = setting(
        DEFAULT_MAX_HEADER_SIZE,
        "--max-header-size",
        "BYTES",
        "largest HTTP request/response head the fronts accept (and chunked trailers)",
    )
    """Largest request or response head the HTTP fronts accept (431 / 502 beyond)."""
    dial_timeout: float = setting(
        5.0,
        "--dial-timeout",
        "S",
        "timeout of the server's own dials to targets in its gateway",
    )
    """Timeout of the server's own dials (targets in its own gateway)."""
    allow: tuple[str, ...] = setting(
        (),
        "--allow",
        "HOST:PORT",
        "also let the server dial this in its own gateway (repeatable; port N, N-M or *); "
        "the gateway's kubelet ports and --metrics-port are allowed already",
    )
    """``--allow`` entries added to the policy of the server's own dials (the agent's policy)."""
    metrics_ports: tuple[int, ...] = setting(
        (),
        "--metrics-port",
        "PORT",
        "also allow this port on every node of the server's gateway (repeatable)",
        key="metrics_ports",  # as before: the --config key is plural
    )
    """Ports allowed on every node of the server's gateway, beside the kubelet port."""
    header_timeout: float = setting(
        limits.DEFAULT_HEADER_TIMEOUT,
        "--header-timeout",
        "S",
        "longest a request head may take once begun, and the TLS ClientHello and handshake on "
        "the HTTPS front (the handshake on --egress-addr); 408 where HTTP can answer, else "
        "closed",
    )
    """Longest a request head may take once its first byte arrived (the whole first head of a
    connection from its accept), and the TLS ClientHello plus handshake on the HTTPS front."""
    max_front_connections: int = setting(
        limits.DEFAULT_MAX_FRONT_CONNECTIONS,
        "--max-front-connections",
        "N",
        "connections open on the HTTP, HTTPS and egress fronts together; beyond it new ones "
        "are closed at once; lowered at start-up to stay well under the descriptor limit",
    )
    """Connections open on all fronts together; beyond it a new one is closed at once (lowered
    at start-up to stay well under the descriptor limit)."""
    idle_timeout: float = setting(
        limits.DEFAULT_IDLE_TIMEOUT,
        "--idle-timeout",
        "S",
        "close a relayed connection (CONNECT, upgraded stream, SNI passthrough, request) on "
        "which no byte moved either way for this long",
    )
    """A relayed connection on which no byte moved either way for this long is closed."""
    max_streams_per_client: int = setting(
        limits.DEFAULT_MAX_STREAMS_PER_CLIENT,
        "--max-streams-per-client",
        "N",
        "concurrent streams of one client address on the HTTP and HTTPS fronts (not the egress "
        "listeners); beyond it 429, or closed on SNI passthrough",
    )
    """Concurrent streams of one client address; beyond it 429 (SNI passthrough: closed)."""
    agent_leases: bool = setting(
        False,
        "--agent-leases",
        help="publish a Lease per connected agent in kube-system (the controller's liveness "
        "signal); uses --kubeconfig or the in-cluster service account",
    )
    """Publish a coordination.k8s.io Lease per connected agent (the controller's liveness)."""
    kube_model: bool = setting(
        False,
        "--kube-model",
        help="read Nodes, Gateways and Pods from the Kubernetes API (list-then-watch) instead "
        "of --inventory",
    )
    """Read Nodes, Gateways and Pods from the Kubernetes API instead of an inventory."""
    kubeconfig: str | None = setting(
        None,
        "--kubeconfig",
        "F",
        "API access for --agent-leases, --kube-model and --cert-dir (without it: the "
        "in-cluster account)",
        kind="file",
    )
    """API access for ``agent_leases``, ``kube_model`` and ``cert_dir``; None: the in-cluster
    account."""

    @property
    def follows_ca_bundle(self) -> bool:
        """With ``cert_dir``: ``ca.crt`` in it is written from the CA bundle ConfigMap (not
        when ``--ca-file`` names another file: that one wins)."""
        return self.cert_dir is not None and Path(self.ca_file) == Path(self.cert_dir, CERT_DIR_CA)

    @property
    def egress_mode(self) -> int:
        """``--egress-uds-mode`` as a number."""
        return int(self.egress_uds_mode, 8)

    @property
    def identity(self) -> str:
        """The id announced to agents: ``--server-id``, else the node name, else the host name
        (unique per server in a cluster, one server per gateway node, and stable across
        restarts, so an agent recognises the server it held a tunnel to)."""
        return self.server_id or self.node_name or socket.gethostname()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ServerSettings:
        """Settings from flag and ``--config`` values keyed by flag name (``snake_case``)."""
        if values.get("kubelet_key_file") and not values.get("kubelet_cert_file"):
            raise ConfigError("--kubelet-key-file", "given without --kubelet-cert-file")
        if values.get("kubelet_cert_file") and not values.get("kubelet_key_file"):
            raise ConfigError("--kubelet-cert-file", "given without --kubelet-key-file")
        v = flags.read(cls, values)
        node_name = v["node_name"] or cfg.env_node_name()
        try:
            session = SessionConfig(
                wire=WireConfig(max_stream_window=v.pop("max_stream_window")),
                ping_interval=v.pop("ping_interval"),
                dead_after=v.pop("dead_after"),
                open_timeout=v.pop("open_timeout"),
            )
        except ValueError as exc:
            raise ConfigError("tunnel settings", str(exc)) from None
        if v["server_san"] and not values.get("cert_dir"):
            raise ConfigError(
                "--server-san", "only with --cert-dir (a given --cert-file has its own SANs)"
            )
        _egress(v)
        files = cfg.cert_files(values, v["kubeconfig"])
        if files.cert_dir is not None and not node_name:
            raise ConfigError(
                "--node-name",
                "required with --cert-dir (or set NODE_NAME): the node the server certificate "
                "is requested for",
            )
        for san in v["server_san"]:
            try:
                server_san(san)
            except PKIError as exc:
                raise ConfigError("--server-san", str(exc)) from None
        return cls(
            **{
                **{k: x for k, x in v.items() if k != "server_san"},
                "inventory": _inventory(values),
                "ca_file": files.ca_file,
                "cert_file": files.cert_file,
                "key_file": files.key_file,
                "cert_dir": files.cert_dir,
                "cert_lifetime": cfg.cert_lifetime(v["cert_lifetime"]),
                "server_sans": v["server_san"],
                "node_name": node_name,
                "server_id": _server_id(v["server_id"]),
                "session": session,
                "allow": _allow(v["allow"]),
            }
        )


def _inventory(values: Mapping[str, Any]) -> str | None:
    """Exactly one model source: the inventory file, or the Kubernetes API."""
    if values.get("kube_model"):
        if values.get("inventory"):
            raise ConfigError("--inventory", "give either --inventory or --kube-model, not both")
        return None
    return cfg.existing_file(values.get("inventory"), "--inventory")


def _egress(v: Mapping[str, Any]) -> None:
    """The egress flags fit together: a mode or owner needs the socket, the TLS listener its
    client CA (and the CA the listener)."""
    mode = v["egress_uds_mode"]
    if not (isinstance(mode, str) and mode.isascii() and mode.isdigit() and len(mode) <= 4):
        raise ConfigError("--egress-uds-mode", f"{mode!r} is not an octal mode such as 0600")
    try:
        number = int(mode, 8)
    except ValueError:
        raise ConfigError(
            "--egress-uds-mode", f"{mode!r} is not an octal mode such as 0600"
        ) from None
    if number > 0o777:
        raise ConfigError("--egress-uds-mode", f"{mode!r}: only permission bits (at most 0777)")
    if v["egress_uds"] is None:
        if v["egress_uds_owner"] is not None:
            raise ConfigError("--egress-uds-owner", "given without --egress-uds")
    else:
        path = v["egress_uds"]
        if not path or "\0" in path:
            raise ConfigError("--egress-uds", f"{path!r} is not a path")
        if len(os.fsencode(path)) > MAX_UDS_PATH:
            raise ConfigError("--egress-uds", f"{path}: longer than {MAX_UDS_PATH} bytes")
        if not Path(path).parent.is_dir():
            raise ConfigError("--egress-uds", f"{path}: its directory does not exist")
        if v["egress_uds_owner"] is not None:
            owner_ids(v["egress_uds_owner"])
    if v["egress_addr"] is not None and v["egress_client_ca_file"] is None:
        raise ConfigError(
            "--egress-client-ca-file",
            "required with --egress-addr: the egress listener requires client certificates",
        )
    if v["egress_client_ca_file"] is not None and v["egress_addr"] is None:
        raise ConfigError("--egress-client-ca-file", "given without --egress-addr")


MAX_UDS_PATH = 107
"""Longest Unix socket path in bytes (``sun_path`` holds 108, with the terminating NUL)."""


def owner_ids(text: str) -> tuple[int, int]:
    """``--egress-uds-owner`` ``USER[:GROUP]`` (names or numbers) → (uid, gid); -1: unchanged.
    An unknown name is a :class:`ConfigError` naming the flag."""
    user, _, group = text.partition(":")
    if not user and not group:
        raise ConfigError("--egress-uds-owner", f"{text!r} names no user or group")
    try:
        uid = -1 if not user else int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ConfigError("--egress-uds-owner", f"no user {user!r}") from None
    try:
        gid = -1 if not group else int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError("--egress-uds-owner", f"no group {group!r}") from None
    return uid, gid


MAX_SERVER_ID = 253
"""Longest ``--server-id`` in UTF-8 bytes (a DNS name's limit, like a node name's; the wire
allows 256, docs/protocol.md 5.1)."""


def _server_id(given: str | None) -> str | None:
    if given is not None and (not given.isprintable() or not given.strip()):
        raise ConfigError("--server-id", f"{given!r} must be printable text, not blank")
    if given is not None and len(given.encode("utf-8")) > MAX_SERVER_ID:
        raise ConfigError("--server-id", f"longer than {MAX_SERVER_ID} bytes")
    return given


def _allow(entries: tuple[str, ...]) -> tuple[str, ...]:
    """``--allow`` entries, checked now (a bad one names the flag) and kept as text: names in
    them are resolved again whenever the policy is rebuilt."""
    Allowlist.parse(entries)
    return entries
