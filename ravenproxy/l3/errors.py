"""Errors of the L3 route driver, all under :class:`ravenproxy.errors.RavenProxyError`."""

from __future__ import annotations

from ravenproxy.errors import RavenProxyError


class L3Error(RavenProxyError):
    """Root of the route driver's errors."""


class CidrError(L3Error):
    """A string that should be a CIDR (or an address) is not one."""


class DesiredStateError(L3Error):
    """The model does not allow a desired state for this node (e.g. the node is unknown)."""


class ParseError(L3Error):
    """Output of a system tool (``iptables-save``, ``ip``) is not what we can read."""


class ApplyError(L3Error):
    """Applying an op to the kernel failed; ``command`` is what ran, ``detail`` what it said."""

    def __init__(self, command: str, detail: str) -> None:
        super().__init__(f"{command}: {detail}")
        self.command = command
        self.detail = detail
