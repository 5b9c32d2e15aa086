"""The agent's settings (``ravenproxy agent``), validated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ravenproxy import config as cfg
from ravenproxy.config import Address
from ravenproxy.errors import ConfigError, PKIError
from ravenproxy.l3.settings import L3_FIELDS, L3Settings, settings_from
from ravenproxy.pki.authority import cert_node_name, load_cert, validate_node_name
from ravenproxy.transport.session import SessionConfig

FIELDS = {
    "node_name",
    "server_addr",
    "ca_file",
    "cert_file",
    "key_file",
    "allow",
    "inventory",
    "metrics_ports",
    "metrics_addr",
    "dial_timeout",
    "ping_interval",
    "dead_after",
    "backoff_base",
    "backoff_cap",
    "no_server_hostname_check",
    "l3",
    "kube_model",
    "kubeconfig",
    *L3_FIELDS,
}


@dataclass(frozen=True)
class AgentSettings:
    node_name: str
    server_url: str
    ca_file: str
    cert_file: str
    key_file: str
    allow: tuple[str, ...] = ()
    inventory: str | None = None
    metrics_ports: tuple[int, ...] = ()
    metrics_addr: Address | None = None
    dial_timeout: float = 5.0
    session: SessionConfig = field(default_factory=SessionConfig)
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    server_hostname_check: bool = True
    kube_model: bool = False
    """Read Nodes and Gateways from the Kubernetes API instead of an inventory."""
    kubeconfig: str | None = None
    """API access for ``kube_model``; None: the in-cluster service account."""
    l3: L3Settings | None = None
    """The embedded L3 route driver's settings; None: L3 off (the tunnel only)."""

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> AgentSettings:
        # A flag (or config-file value) wins over NODE_NAME; neither: the certificate's node.
        flag_node = values.get("node_name")
        given_node, node_source = (
            (str(flag_node), "--node-name") if flag_node else (cfg.env_node_name(), "NODE_NAME")
        )
        if given_node:
            try:
                validate_node_name(given_node)
            except PKIError as exc:
                raise ConfigError(node_source, str(exc)) from None
        url = str(values.get("server_addr") or "")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "wss" or not parts.hostname or not port:
            raise ConfigError("--server-addr", f"{url!r} must look like wss://HOST:PORT")
        allow = cfg.string_list(values.get("allow"))
        metrics_ports = cfg.port_list(values.get("metrics_ports"), "--metrics-port")
        metrics_addr = values.get("metrics_addr")
        inventory = values.get("inventory")
        try:
            session = SessionConfig(
                ping_interval=cfg.positive(values.get("ping_interval", 10.0), "--ping-interval"),
                dead_after=cfg.positive(values.get("dead_after", 30.0), "--dead-after"),
            )
        except ValueError as exc:
            raise ConfigError("tunnel settings", str(exc)) from None
        l3 = settings_from(values) if values.get("l3") else None
        kube_model = bool(values.get("kube_model"))
        if kube_model and inventory:
            raise ConfigError("--inventory", "give either --inventory or --kube-model, not both")
        if l3 is not None and not (inventory or kube_model):
            raise ConfigError(
                "--l3", "needs --inventory or --kube-model: the route driver plans from the model"
            )
        kubeconfig = values.get("kubeconfig")
        cert_file = cfg.existing_file(values.get("cert_file"), "--cert-file")
        node = _node_name(given_node, node_source, cert_node(cert_file), cert_file)
        return cls(
            node_name=node,
            server_url=url,
            ca_file=cfg.existing_file(values.get("ca_file"), "--ca-file"),
            cert_file=cert_file,
            key_file=cfg.existing_file(values.get("key_file"), "--key-file"),
            allow=allow,
            inventory=cfg.existing_file(inventory, "--inventory") if inventory else None,
            metrics_ports=metrics_ports,
            metrics_addr=cfg.parse_address(str(metrics_addr), "--metrics-addr")
            if metrics_addr
            else None,
            dial_timeout=cfg.positive(values.get("dial_timeout", 5.0), "--dial-timeout"),
            session=session,
            backoff_base=cfg.positive(values.get("backoff_base", 0.5), "--backoff-base"),
            backoff_cap=cfg.positive(values.get("backoff_cap", 30.0), "--backoff-cap"),
            server_hostname_check=not values.get("no_server_hostname_check"),
            l3=l3,
            kube_model=kube_model,
            kubeconfig=cfg.existing_file(kubeconfig, "--kubeconfig") if kubeconfig else None,
        )


def cert_node(cert_file: str) -> str:
    """The node ``cert_file`` (the agent's client certificate) names: what the server will
    register this agent as (the same rule as the server's, :func:`cert_node_name`)."""
    try:
        return cert_node_name(load_cert(cert_file, "--cert-file"), f"--cert-file {cert_file}")
    except PKIError as exc:
        raise ConfigError("--cert-file", str(exc).removeprefix("--cert-file ")) from None


def _node_name(given: str | None, source: str, from_cert: str, cert_file: str) -> str:
    """This agent's node: the certificate's, which a given name (from ``source``) must equal.

    The server identifies the agent by its certificate alone, so an agent running under another
    name would serve the certificate's node with an allowlist, an L3 plan and a key publisher
    built for the other one (half its requests refused). Refused at start-up instead, naming
    both.
    """
    if given and given != from_cert:
        raise ConfigError(
            source,
            f"{given} differs from {from_cert}, the node of --cert-file {cert_file} and the "
            f"name the server registers this agent as; give the certificate of {given}, or "
            f"leave {source} unset to run as {from_cert}",
        )
    return from_cert
