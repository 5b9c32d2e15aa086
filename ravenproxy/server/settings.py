"""The proxy server's settings (``ravenproxy server``), validated once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ravenproxy import config as cfg
from ravenproxy.config import Address
from ravenproxy.errors import ConfigError
from ravenproxy.transport.session import SessionConfig
from ravenproxy.wire.connection import WireConfig

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
}


@dataclass(frozen=True)
class ServerSettings:
    inventory: str
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

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ServerSettings:
        def addr(key: str, default: Address) -> Address:
            text = values.get(key)
            return cfg.parse_address(str(text), "--" + key.replace("_", "-")) if text else default

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
            inventory=cfg.existing_file(values.get("inventory"), "--inventory"),
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
        )
