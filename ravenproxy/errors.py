"""Typed errors under one root.

Wire-level errors carry their wire code (see :mod:`ravenproxy.wire.codes`) so that whoever catches
one can put it on the wire or into an HTTP status without guessing.
"""

from __future__ import annotations


class RavenProxyError(Exception):
    """Root of every error ravenproxy raises on purpose."""


class ConfigError(RavenProxyError):
    """A configuration value is invalid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class InventoryError(RavenProxyError):
    """The inventory (YAML or Kubernetes objects) cannot be read into the model."""


class ChildError(RavenProxyError):
    """A short-lived child of ours (:mod:`ravenproxy.children`) that could not start or did not
    answer in time: one line, which its caller's own error carries on."""


class PKIError(RavenProxyError):
    """Certificates or keys cannot be created, read or used."""


class RoutingError(RavenProxyError):
    """A request cannot be routed to an agent; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, node: str, reason: str) -> None:
        super().__init__(f"{node}: {reason}")
        self.status = status
        self.node = node
        self.reason = reason


class LabError(RavenProxyError):
    """A ``ravenproxy lab`` action cannot be done: not root, a tool missing, a lab that exists
    already or not at all, a host that failed to come up."""
