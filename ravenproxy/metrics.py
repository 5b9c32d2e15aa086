"""Prometheus metrics (prometheus_client): the counters and gauges of each component.

Each process component owns a :class:`CollectorRegistry`, so several servers or agents in one
test process never share counters. The HTTP app that serves them with health is
:mod:`ravenproxy.metrics_http` (aiohttp's server, loaded only by a process that serves it).

prometheus_client is imported by the component that builds its metrics, not with this module:
an agent without ``--metrics-addr`` has nothing to read its metrics, so it keeps none
(:class:`Unread` takes every update and drops it) and never loads prometheus_client, whose
package brings http.server, wsgiref, urllib.request and more.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge

NS = "ravenproxy"


class Unread:
    """A metric nothing will read: labels, increments and sets are accepted and dropped."""

    __slots__ = ()

    def labels(self, *values: object, **labels: object) -> Unread:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def set_function(self, f: Callable[[], float]) -> None:
        pass

    def remove(self, *values: object) -> None:
        pass


UNREAD = Unread()


class Tallied:
    """One labelled series of a :class:`Tally`: ``n`` is its count, which the hot path adds to
    in place (``child.n += 1``: no call, no lock; every writer runs in the event loop's
    thread)."""

    __slots__ = ("created", "n")

    def __init__(self) -> None:
        self.n: float = 0
        self.created = time.time()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.n += amount


class Tally:
    """A labelled counter read at scrape time: exposed exactly as a prometheus_client
    ``Counter`` of the same name, labels and help (``NAME_total`` and ``NAME_created`` per
    series), but counted into plain numbers (:class:`Tallied`) instead of through
    ``Counter.inc`` (four Python calls and a lock): a per-request counter on the fronts."""

    def __init__(
        self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._series: dict[tuple[str, ...], Tallied] = {}
        registry.register(self)

    def labels(self, *values: object, **labels: object) -> Tallied:
        if labels:
            if values or set(labels) != set(self.labelnames):
                raise ValueError(f"labels {sorted(labels)}: expected {list(self.labelnames)}")
            values = tuple(labels[name] for name in self.labelnames)
        elif len(values) != len(self.labelnames):
            raise ValueError(f"{len(values)} label values: expected {len(self.labelnames)}")
        key = tuple(str(v) for v in values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Tallied()
        return series

    def describe(self) -> list[Any]:
        from prometheus_client.metrics_core import CounterMetricFamily

        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> list[Any]:
        from prometheus_client import metrics as prom
        from prometheus_client.metrics_core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = getattr(prom, "_use_created", True)  # PROMETHEUS_DISABLE_CREATED_SERIES
        for key, series in list(self._series.items()):
            family.add_metric(key, float(series.n), series.created if created else None)
        return [family]


def _task_gauge(registry: CollectorRegistry, component: str) -> None:
    """Live asyncio tasks: flat in a healthy process, so a leak shows as a slope."""
    from prometheus_client import Gauge

    gauge = Gauge(f"{NS}_{component}_asyncio_tasks", "asyncio tasks alive", registry=registry)

    def count() -> float:
        try:
            return float(len(asyncio.all_tasks()))
        except RuntimeError:
            return 0.0

    gauge.set_function(count)


def _expiry_gauge(registry: CollectorRegistry) -> Gauge:
    """Certificate expiry by role, the same name on server and agent (one alert rule for both):
    ``server``/``agent`` is the process's own certificate, ``ca`` the CA it chains to. It moves
    at every reload."""
    from prometheus_client import Gauge

    return Gauge(
        f"{NS}_certificate_expiry_timestamp_seconds",
        "When the certificate in use expires (Unix time), by role: this process's own "
        "certificate (server, agent) or the CA it chains to (ca)",
        ["role"],
        registry=registry,
    )


class ServerMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        _task_gauge(r, "server")
        self.cert_expiry = _expiry_gauge(r)
        self.buffered = Gauge(
            f"{NS}_server_stream_buffered_max_bytes",
            "Largest number of bytes received on one stream and not yet written out",
            registry=r,
        )
        self.agents = Gauge(f"{NS}_server_agents_connected", "Agent tunnels connected", registry=r)
        self.streams = Gauge(
            f"{NS}_server_streams_open", "Streams open over all tunnels", registry=r
        )
        self.opens = Counter(
            f"{NS}_server_stream_opens", "Stream opens by result", ["result"], registry=r
        )
        self.bytes = Counter(
            f"{NS}_server_bytes",
            "Bytes relayed, by direction (up: to the edge)",
            ["direction"],
            registry=r,
        )
        self.dial = Histogram(
            f"{NS}_server_dial_duration_seconds",
            "Time from OPEN to OPEN_RESULT (the agent's dial included)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.requests = Tally(
            f"{NS}_server_front_requests",
            "Front requests by front and status",
            ["front", "status"],
            registry=r,
        )
        self.egress_requests = Tally(
            f"{NS}_server_egress_requests",
            "Egress listener requests (kube-apiserver's HTTP CONNECT) by transport (uds, tcp) "
            "and status",
            ["transport", "status"],
            registry=r,
        )
        self.egress_tls_refused = Counter(
            f"{NS}_server_egress_tls_refused",
            "Egress listener (--egress-addr) TLS handshakes refused: no client certificate, one "
            "from another CA, not TLS, or too slow",
            registry=r,
        )
        self.tls_connections = Counter(
            f"{NS}_server_tls_connections",
            "HTTPS front connections by what was done with them (passthrough, terminate, refused)",
            ["mode"],
            registry=r,
        )
        self.direct_dials = Counter(
            f"{NS}_server_direct_dials",
            "Dials the server made itself (targets in its own gateway), by result",
            ["result"],
            registry=r,
        )
        self.agent_sessions = Counter(
            f"{NS}_server_agent_sessions",
            "Agent tunnel sessions by outcome",
            ["outcome"],
            registry=r,
        )
        self.loops = Counter(
            f"{NS}_server_loops",
            "Requests refused with 508 because they would loop back into this server "
            "(self_dial: a target that is one of its own fronts; via: it carried our Via marker)",
            ["kind"],
            registry=r,
        )
        self.kubelet_tls = Counter(
            f"{NS}_server_kubelet_tls",
            "TLS connections re-originated to kubelets, by whether the kubelet client "
            "certificate was presented (only for clients authenticated by the front)",
            ["client_cert"],
            registry=r,
        )
        self.front_connections = Gauge(
            f"{NS}_server_front_connections",
            "Client connections open on the HTTP and HTTPS fronts together",
            registry=r,
        )
        self.front_refused = Counter(
            f"{NS}_server_front_connections_refused",
            "Front connections closed at once because --max-front-connections were open",
            ["front"],
            registry=r,
        )
        self.accept_errors = Counter(
            f"{NS}_server_accept_errors",
            "Failed accepts on a front, by error (emfile, enfile: out of descriptors)",
            ["front", "error"],
            registry=r,
        )
        self.header_timeouts = Counter(
            f"{NS}_server_header_timeouts",
            "Connections closed for taking longer than --header-timeout, by stage "
            "(head, client_hello, tls_handshake)",
            ["front", "stage"],
            registry=r,
        )
        self.idle_timeouts = Counter(
            f"{NS}_server_idle_timeouts",
            "Relayed connections closed after --idle-timeout without a byte either way, by relay "
            "(connect, upgrade, passthrough, request; not a refusal its client does not take)",
            ["front", "relay"],
            registry=r,
        )
        self.upstream_stray = Counter(
            f"{NS}_server_upstream_stray",
            "Kept target connections let go because the target sent bytes past its answer's end "
            "or while no request was outstanding (the next request went on a fresh connection; "
            "a 408 before the target closes an idle connection is its end, not counted)",
            ["front"],
            registry=r,
        )
        self.client_stream_limit = Counter(
            f"{NS}_server_client_stream_limit",
            "Streams refused because their client address held --max-streams-per-client",
            ["front"],
            registry=r,
        )


class AgentMetrics:
    """The agent's metrics; with ``served=False`` (no ``--metrics-addr``: nothing would read
    them) every one is :data:`UNREAD`, there is no registry, and prometheus_client is not
    imported."""

    registry: CollectorRegistry | None
    cert_expiry: Gauge | Unread
    connected: Gauge | Unread
    tunnels_up: Gauge | Unread
    tunnels_wanted: Gauge | Unread
    server_tunnel: Gauge | Unread
    reconnects: Counter | Unread
    duplicates: Counter | Unread
    connects: Counter | Unread
    streams: Gauge | Unread
    dials: Counter | Unread
    bytes: Counter | Unread

    def __init__(self, served: bool = True) -> None:
        if not served:
            self.registry = None
            for name in AgentMetrics.__annotations__:
                if name != "registry":
                    setattr(self, name, UNREAD)
            return
        from prometheus_client import CollectorRegistry, Counter, Gauge

        r = self.registry = CollectorRegistry()
        _task_gauge(r, "agent")
        self.cert_expiry = _expiry_gauge(r)
        self.connected = Gauge(
            f"{NS}_agent_tunnel_connected", "1 while at least one tunnel is up", registry=r
        )
        self.tunnels_up = Gauge(f"{NS}_agent_tunnels_up", "Tunnels up", registry=r)
        self.tunnels_wanted = Gauge(
            f"{NS}_agent_tunnels_wanted",
            "Tunnels to distinct servers the agent wants (--server-count, or servers discovered)",
            registry=r,
        )
        self.server_tunnel = Gauge(
            f"{NS}_agent_server_tunnel_up",
            "1 while the tunnel to this server is up, 0 while it is down or draining",
            ["server", "address"],
            registry=r,
        )
        self.reconnects = Counter(
            f"{NS}_agent_reconnects",
            "Tunnels that came up again after an earlier one of the same slot ended, by server",
            ["server"],
            registry=r,
        )
        self.duplicates = Counter(
            f"{NS}_agent_duplicate_tunnels",
            "Tunnels closed at once because the agent already held one to that server id",
            ["server"],
            registry=r,
        )
        self.connects = Counter(
            f"{NS}_agent_connect_attempts",
            "Tunnel connection attempts by result",
            ["result"],
            registry=r,
        )
        self.streams = Gauge(f"{NS}_agent_streams_open", "Streams open", registry=r)
        self.dials = Counter(f"{NS}_agent_dials", "Dials by result", ["result"], registry=r)
        self.bytes = Counter(
            f"{NS}_agent_bytes",
            "Bytes relayed, by direction (up: to the cloud)",
            ["direction"],
            registry=r,
        )

    def forget_server(self, server: str, address: str) -> None:
        """Drop a server's tunnel series (it left the model, or the slot now holds another)."""
        with contextlib.suppress(KeyError):
            self.server_tunnel.remove(server, address)


class ControllerMetrics:
    """What a controller replica did: leadership, reconciles, API writes, CSR decisions, and
    whether its model has synced."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        _task_gauge(r, "controller")
        self.leader = Gauge(
            f"{NS}_controller_leader", "1 while this replica holds the leader Lease", registry=r
        )
        self.leader_transitions = Counter(
            f"{NS}_controller_leader_transitions",
            "Leader elections this replica took part in, by outcome (acquired, lost)",
            ["transition"],
            registry=r,
        )
        self.model_synced = Gauge(
            f"{NS}_controller_model_synced",
            "1 once the model (Nodes, Gateways) has been listed completely",
            registry=r,
        )
        self.reconciles = Counter(
            f"{NS}_controller_reconciles",
            "Reconcile rounds by result (ok, not_leader, error)",
            ["result"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            f"{NS}_controller_reconcile_errors",
            "Failed reconcile rounds by kind of error (api, http, timeout)",
            ["kind"],
            registry=r,
        )
        self.reconcile_duration = Histogram(
            f"{NS}_controller_reconcile_duration_seconds",
            "Time of one reconcile round (reads and writes)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.writes = Counter(
            f"{NS}_controller_api_writes",
            "Writes to the Kubernetes API by kind, verb and result (ok, conflict, not_found, "
            "refused, error)",
            ["kind", "verb", "result"],
            registry=r,
        )
        self.csr_decisions = Counter(
            f"{NS}_controller_csr_decisions",
            "CertificateSigningRequests of our signers by decision (approved, denied, signed, "
            "sign_failed)",
            ["decision", "signer"],
            registry=r,
        )

    def write(self, kind: str, verb: str, status: int | None) -> None:
        """Count one API write; ``status`` is the HTTP status (None: no answer)."""
        if status is None:
            result = "error"
        elif status < 300:
            result = "ok"
        else:
            result = {409: "conflict", 404: "not_found", 403: "refused"}.get(status, "error")
        self.writes.labels(kind=kind, verb=verb, result=result).inc()
