"""The proxy server's settings (``ravenproxy server``), validated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ravenproxy import config as cfg
from ravenproxy.config import Address
from ravenproxy.errors import ConfigError
from ravenproxy.model.allowlist import Allowlist
from ravenproxy.server import limits
from ravenproxy.transport.session import SessionConfig
from ravenproxy.wire.config import WireConfig

FIELDS = {
    "inventory",
    "ca_file",
    "cert_file",
    "key_file",
    "node_name",
    "tunnel_addr",
    "https_addr",
    "http_addr",
    "metrics_addr",
    "health_addr",
    "open_timeout",
    "ping_interval",
    "dead_after",
    "max_stream_window",
    "drain_timeout",
    "kubelet_ca_file",
    "kubelet_cert_file",
    "kubelet_key_file",
    "kubelet_insecure_skip_verify",
    "max_header_size",
    "dial_timeout",
    "allow",
    "metrics_ports",
    "front_client_ca_file",
    "agent_leases",
    "kubeconfig",
    "kube_model",
    "header_timeout",
    "max_front_connections",
    "idle_timeout",
    "max_streams_per_client",
}

DEFAULT_MAX_HEADER_SIZE = 64 * 1024


@dataclass(frozen=True)
class ServerSettings:
    inventory: str | None
    """The YAML inventory; None when the model comes from Kubernetes (``kube_model``)."""
    ca_file: str
    cert_file: str
    key_file: str
    node_name: str | None = None
    tunnel_addr: Address = Address("", cfg.DEFAULT_TUNNEL_PORT)
    https_addr: Address = Address("", cfg.DEFAULT_HTTPS_PORT)
    http_addr: Address = Address("", cfg.DEFAULT_HTTP_PORT)
    metrics_addr: Address = Address("127.0.0.1", cfg.DEFAULT_METRICS_PORT)
    health_addr: Address = Address("", cfg.DEFAULT_HEALTH_PORT)
    session: SessionConfig = field(default_factory=SessionConfig)
    drain_timeout: float = 10.0
    kubelet_ca_file: str | None = None
    """CA that verifies kubelet serving certificates (re-originated TLS); None: system store."""
    kubelet_cert_file: str | None = None
    """Client certificate presented to kubelets (re-originated TLS)."""
    kubelet_key_file: str | None = None
    kubelet_insecure_skip_verify: bool = False
    """Do not verify kubelet certificates at all (logged loudly at start-up)."""
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE
    """Largest request or response head the HTTP fronts accept (431 / 502 beyond)."""
    dial_timeout: float = 5.0
    """Timeout of the server's own dials (targets in its own gateway)."""
    allow: tuple[str, ...] = ()
    """``--allow`` entries added to the policy of the server's own dials (the agent's policy)."""
    metrics_ports: tuple[int, ...] = ()
    """Ports allowed on every node of the server's gateway, beside the kubelet port."""
    front_client_ca_file: str | None = None
    """CA of the HTTPS front's client certificates. Only for a client that presented one is
    the kubelet client certificate presented on re-originated TLS; None: never."""
    agent_leases: bool = False
    """Publish a coordination.k8s.io Lease per connected agent (the controller's liveness)."""
    kubeconfig: str | None = None
    """API access for ``agent_leases`` and ``kube_model``; None: the in-cluster account."""
    kube_model: bool = False
    """Read Nodes, Gateways and Pods from the Kubernetes API instead of an inventory."""
    header_timeout: float = limits.DEFAULT_HEADER_TIMEOUT
    """Longest a request head may take once its first byte arrived (the whole first head of a
    connection from its accept), and the TLS ClientHello plus handshake on the HTTPS front."""
    max_front_connections: int = limits.DEFAULT_MAX_FRONT_CONNECTIONS
    """Connections open on all fronts together; beyond it a new one is closed at once (lowered
    at start-up to stay well under the descriptor limit)."""
    idle_timeout: float = limits.DEFAULT_IDLE_TIMEOUT
    """A relayed connection on which no byte moved either way for this long is closed."""
    max_streams_per_client: int = limits.DEFAULT_MAX_STREAMS_PER_CLIENT
    """Concurrent streams of one client address; beyond it 429 (SNI passthrough: closed)."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ServerSettings:
        def addr(key: str, default: Address) -> Address:
            text = values.get(key)
            return cfg.parse_address(str(text), "--" + key.replace("_", "-")) if text else default

        def optional_file(key: str) -> str | None:
            value = values.get(key)
            return cfg.existing_file(value, "--" + key.replace("_", "-")) if value else None

        if values.get("kubelet_key_file") and not values.get("kubelet_cert_file"):
            raise ConfigError("--kubelet-key-file", "given without --kubelet-cert-file")
        if values.get("kubelet_cert_file") and not values.get("kubelet_key_file"):
            raise ConfigError("--kubelet-cert-file", "given without --kubelet-key-file")

        wire_kwargs: dict[str, Any] = {}
        if values.get("max_stream_window"):
            wire_kwargs["max_stream_window"] = int(
                cfg.positive(values["max_stream_window"], "--max-stream-window", integer=True)
            )
        try:
            wire = WireConfig(**wire_kwargs)
            session = SessionConfig(
                wire=wire,
                ping_interval=cfg.positive(values.get("ping_interval", 10.0), "--ping-interval"),
                dead_after=cfg.positive(values.get("dead_after", 30.0), "--dead-after"),
                open_timeout=cfg.positive(values.get("open_timeout", 15.0), "--open-timeout"),
            )
        except ValueError as exc:
            raise ConfigError("tunnel settings", str(exc)) from None
        return cls(
            inventory=_inventory(values),
            ca_file=cfg.existing_file(values.get("ca_file"), "--ca-file"),
            cert_file=cfg.existing_file(values.get("cert_file"), "--cert-file"),
            key_file=cfg.existing_file(values.get("key_file"), "--key-file"),
            node_name=values.get("node_name") or cfg.env_node_name(),
            tunnel_addr=addr("tunnel_addr", cls.tunnel_addr),
            https_addr=addr("https_addr", cls.https_addr),
            http_addr=addr("http_addr", cls.http_addr),
            metrics_addr=addr("metrics_addr", cls.metrics_addr),
            health_addr=addr("health_addr", cls.health_addr),
            session=session,
            drain_timeout=cfg.positive(values.get("drain_timeout", 10.0), "--drain-timeout"),
            kubelet_ca_file=optional_file("kubelet_ca_file"),
            kubelet_cert_file=optional_file("kubelet_cert_file"),
            kubelet_key_file=optional_file("kubelet_key_file"),
            kubelet_insecure_skip_verify=bool(values.get("kubelet_insecure_skip_verify")),
            max_header_size=int(
                cfg.positive(
                    values.get("max_header_size", DEFAULT_MAX_HEADER_SIZE),
                    "--max-header-size",
                    integer=True,
                )
            ),
            dial_timeout=cfg.positive(values.get("dial_timeout", 5.0), "--dial-timeout"),
            allow=_allow(values),
            metrics_ports=cfg.port_list(values.get("metrics_ports"), "--metrics-port"),
            front_client_ca_file=optional_file("front_client_ca_file"),
            agent_leases=bool(values.get("agent_leases")),
            kubeconfig=optional_file("kubeconfig"),
            kube_model=bool(values.get("kube_model")),
            header_timeout=cfg.positive(
                values.get("header_timeout", limits.DEFAULT_HEADER_TIMEOUT), "--header-timeout"
            ),
            max_front_connections=int(
                cfg.positive(
                    values.get("max_front_connections", limits.DEFAULT_MAX_FRONT_CONNECTIONS),
                    "--max-front-connections",
                    integer=True,
                )
            ),
            idle_timeout=cfg.positive(
                values.get("idle_timeout", limits.DEFAULT_IDLE_TIMEOUT), "--idle-timeout"
            ),
            max_streams_per_client=int(
                cfg.positive(
                    values.get("max_streams_per_client", limits.DEFAULT_MAX_STREAMS_PER_CLIENT),
                    "--max-streams-per-client",
                    integer=True,
                )
            ),
        )


def _inventory(values: Mapping[str, Any]) -> str | None:
    """Exactly one model source: the inventory file, or the Kubernetes API."""
    if values.get("kube_model"):
        if values.get("inventory"):
            raise ConfigError("--inventory", "give either --inventory or --kube-model, not both")
        return None
    return cfg.existing_file(values.get("inventory"), "--inventory")


def _allow(values: Mapping[str, Any]) -> tuple[str, ...]:
    """``--allow`` entries, checked now (a bad one names the flag) and kept as text: names in
    them are resolved again whenever the policy is rebuilt."""
    entries = cfg.string_list(values.get("allow"))
    Allowlist.parse(entries)
    return entries
