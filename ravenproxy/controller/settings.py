"""Settings of ``ravenproxy controller`` and ``ravenproxy dns``: each declared once, with its
flag and help (:mod:`ravenproxy.flags`); both take ``--config FILE`` with the flag names as keys.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ravenproxy import config as cfg
from ravenproxy import flags
from ravenproxy.config import Address
from ravenproxy.errors import ConfigError, PKIError
from ravenproxy.flags import setting
from ravenproxy.pki.identity import server_san

# Defined here, where the flags are, and imported by the modules that use them: reading the
# command line then loads neither the election (and the model) nor the signer (cryptography).
DEFAULT_GRACE = 30.0
"""Seconds without a server reporting an edge gateway's agent before it fails over
(``--agent-grace``)."""
DEFAULT_MAX_LIFETIME = dt.timedelta(days=30)
"""The longest certificate lifetime the CSR issuer signs (``--max-cert-lifetime``)."""
LEASE_DURATION = 15.0
RENEW_DEADLINE = 10.0
RETRY_PERIOD = 2.0
"""Leader election's timings in seconds (``--leader-elect-*``): client-go's defaults, which
kube-controller-manager and kube-scheduler also keep."""
JITTER = 1.2
"""client-go's rule: lease duration > renew deadline > JITTER x retry period >= JITTER x 1s."""


@dataclass(frozen=True)
class IssuerSettings:
    """What the CSR issuer (:mod:`ravenproxy.controller.issuer`) runs with; declared here so
    that reading the command line imports neither it nor the Kubernetes client."""

    max_lifetime: dt.timedelta = DEFAULT_MAX_LIFETIME
    server_sans: tuple[str, ...] = ()
    cluster_domain: str = "cluster.local"
    # Cluster-scoped CSRs: their Events go to "default", as Kubernetes files them.
    event_namespace: str = "default"
    interval: float = 30.0


@dataclass(frozen=True)
class TCPLimits:
    """Bounds on DNS-over-TCP clients (flags of ``ravenproxy dns``, declared here)."""

    idle_timeout: float = setting(
        3.0,
        "--tcp-idle-timeout",
        "S",
        "close a TCP client that takes longer than this for a whole query, the wait for it "
        "included, or to read a reply",
    )
    """``--tcp-idle-timeout``: seconds a connection may take for each whole query (the wait for
    its first byte included) and for sending each reply; then it is closed."""
    max_clients: int = setting(
        256,
        "--max-tcp-clients",
        "N",
        "TCP connections served at once; when full, the longest-idle one is closed for a new "
        "client",
    )
    """``--max-tcp-clients``: connections served at once; when full, the longest-idle one is
    closed for a new client (refused only when none is idle)."""
    max_clients_per_source: int = setting(
        16,
        "--max-tcp-clients-per-source",
        "N",
        "TCP connections from one address (IPv6: one /64); more are closed at once",
    )
    """``--max-tcp-clients-per-source``: connections from one address (IPv6: one /64)."""


@dataclass(frozen=True)
class ControllerCommand:
    """``ravenproxy controller``: where the model comes from, agent liveness, and how it signs
    certificates."""

    kubeconfig: str | None = setting(
        None, "--kubeconfig", "F", "API access (without it: the in-cluster account)", kind="file"
    )
    inventory: str | None = setting(
        None,
        "--inventory",
        "FILE",
        "print the objects it would write instead (no cluster)",
        kind="file",
    )
    dry_run: bool = setting(False, "--dry-run", help="print the objects once and exit")
    agent_grace: float = setting(
        DEFAULT_GRACE,
        "--agent-grace",
        "S",
        "an edge gateway whose agent no server has reported for this long fails over",
    )
    agents_urls: tuple[str, ...] = setting(
        (),
        "--agents-url",
        "URL",
        "poll this server's GET /agents (H:P of its --metrics-addr, or a URL; repeatable) "
        "instead of watching the servers' agent Leases; with --inventory, the only source",
    )

    max_cert_lifetime: float = setting(
        DEFAULT_MAX_LIFETIME.total_seconds(),
        "--max-cert-lifetime",
        "DURATION",
        "longest lifetime of a certificate it signs, in seconds or with a unit s/m/h/d "
        "(2592000 is 30d); a CSR's expirationSeconds may only shorten it, the CA's expiry "
        "caps it",
        kind="duration",
    )
    server_sans: tuple[str, ...] = setting(
        (),
        "--server-san",
        "NAME",
        "a DNS name or IP a server certificate may also carry (repeatable; the servers' "
        "--server-san)",
    )
    cluster_domain: str = setting(
        "cluster.local",
        "--cluster-domain",
        "D",
        "the cluster's DNS domain, for the internal Service's names in server certificates",
    )
    metrics_addr: Address = setting(
        Address("127.0.0.1", 10266),
        "--metrics-addr",
        "H:P",
        "/metrics (Prometheus): leadership, reconciles, API writes, CSR decisions, model sync "
        "(not with --inventory)",
    )
    health_addr: Address = setting(
        Address("", 10275),
        "--health-addr",
        "H:P",
        "/healthz, and /readyz: 200 once the model has synced, its body 'leader' or "
        "'follower' (not with --inventory)",
    )
    lease_duration: float = setting(
        LEASE_DURATION,
        "--leader-elect-lease-duration",
        "DURATION",
        "how long the leader's Lease stays valid unrenewed, before another replica may take "
        "it (rounded up to whole seconds); more than --leader-elect-renew-deadline (not with "
        "--inventory)",
        kind="duration",
    )
    renew_deadline: float = setting(
        RENEW_DEADLINE,
        "--leader-elect-renew-deadline",
        "DURATION",
        "the leader that has not renewed its Lease for this long stops writing; more than "
        f"{JITTER:g} x --leader-elect-retry-period (not with --inventory)",
        kind="duration",
    )
    retry_period: float = setting(
        RETRY_PERIOD,
        "--leader-elect-retry-period",
        "DURATION",
        "how often a replica tries to take or renew the Lease; at least 1s (not with --inventory)",
        kind="duration",
    )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ControllerCommand:
        v = flags.read(cls, values)
        if v["inventory"] and v["kubeconfig"]:
            raise ConfigError("--inventory", "give either --inventory or --kubeconfig, not both")
        for san in v["server_san"]:
            try:
                server_san(san)
            except PKIError as exc:
                raise ConfigError("--server-san", str(exc)) from None
        _check_leader_timing(
            v["leader_elect_lease_duration"],
            v["leader_elect_renew_deadline"],
            v["leader_elect_retry_period"],
        )
        return cls(**{o.path[0]: v[o.key] for o in flags.options(cls)})

    @property
    def issuing(self) -> IssuerSettings:
        return IssuerSettings(
            max_lifetime=dt.timedelta(seconds=self.max_cert_lifetime),
            server_sans=self.server_sans,
            cluster_domain=self.cluster_domain,
        )


def _check_leader_timing(lease: float, renew: float, retry: float) -> None:
    """client-go's rule (kubernetes_asyncio checks it too, but only when the election starts,
    and the controller would retry it forever): each broken link names its flag."""
    rule = f"lease duration > renew deadline > {JITTER:g} x retry period >= {JITTER:g}s"
    if retry < 1:
        raise ConfigError("--leader-elect-retry-period", f"{retry:g}s is under 1s ({rule})")
    if renew <= JITTER * retry:
        raise ConfigError(
            "--leader-elect-renew-deadline",
            f"{renew:g}s is not more than {JITTER:g} x --leader-elect-retry-period "
            f"{retry:g}s ({rule})",
        )
    if lease <= renew:
        raise ConfigError(
            "--leader-elect-lease-duration",
            f"{lease:g}s is not more than --leader-elect-renew-deadline {renew:g}s ({rule})",
        )


@dataclass(frozen=True)
class DnsCommand:
    """``ravenproxy dns``: the map's source, where to answer, the DNS-over-TCP limits."""

    listen: Address = setting(
        flag="--listen", metavar="H:P", help="where to answer, UDP and TCP (required)"
    )
    inventory: str | None = setting(
        None, "--inventory", "FILE", "answer from this inventory", kind="file"
    )
    kubeconfig: str | None = setting(
        None, "--kubeconfig", "F", "answer from the published ConfigMap (API access)", kind="file"
    )
    suffix: str | None = setting(None, "--suffix", "S", "also answer NODE.S")
    cluster_ip: str | None = setting(
        None, "--cluster-ip", "IP", "answer this address (the internal Service) for every node"
    )
    limits: TCPLimits = field(default_factory=TCPLimits, metadata={"options": "*"})

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DnsCommand:
        v = flags.read(cls, values)
        if v["listen"] is None:
            raise ConfigError("--listen", "is required")
        if bool(v["inventory"]) == bool(v["kubeconfig"]):
            raise ConfigError("--inventory", "give exactly one of --inventory or --kubeconfig")
        inventory = cfg.existing_file(v["inventory"], "--inventory") if v["inventory"] else None
        return cls(
            listen=v["listen"],
            inventory=inventory,
            kubeconfig=v["kubeconfig"],
            suffix=v["suffix"],
            cluster_ip=v["cluster_ip"],
            limits=flags.build(TCPLimits, values),
        )

    @property
    def where(self) -> tuple[str, int]:
        """The address to bind: every IPv4 interface when ``--listen`` gives no host."""
        return (self.listen.host or "0.0.0.0", self.listen.port)
