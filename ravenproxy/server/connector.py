"""The connector: a route becomes a byte stream to its target.

Through the route's agent (a tunnel stream), or — for a target in the server's own gateway —
dialled by the server itself under the agent's policy (:func:`ravenproxy.transport.dialer.dial`
with :func:`ravenproxy.model.allowlist.gateway_allowlist`), never one of the server's own
listeners (:mod:`ravenproxy.server.loops`). On a route with ``tls``, TLS to the kubelet is
re-originated on top. Every failure leaves here as one :class:`RoutingError` with its HTTP status
(:func:`_refusal`); dials and opens are counted and timed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import time

from ravenproxy.errors import RoutingError
from ravenproxy.log import kv
from ravenproxy.metrics import ServerMetrics
from ravenproxy.model.allowlist import Allowlist, gateway_allowlist
from ravenproxy.model.store import ModelStore
from ravenproxy.server.loops import FRONTS, OwnListeners
from ravenproxy.server.router import Route, http_status, reason
from ravenproxy.server.settings import ServerSettings
from ravenproxy.transport import tls
from ravenproxy.transport.bytestream import (
    ByteStream,
    SocketByteStream,
    TlsByteStream,
    TlsError,
    TunnelByteStream,
)
from ravenproxy.transport.dialer import DialError, dial
from ravenproxy.transport.tunnel_stream import OpenError, StreamClosedError, TunnelStream

log = logging.getLogger(__name__)


class Connector:
    def __init__(
        self,
        settings: ServerSettings,
        store: ModelStore,
        metrics: ServerMetrics,
        listeners: OwnListeners,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.listeners = listeners
        self.kubelet_tls: ssl.SSLContext | None = None
        """Re-originated TLS presenting --kubelet-cert-file: for authenticated clients only."""
        self.kubelet_tls_anonymous: ssl.SSLContext | None = None
        """Re-originated TLS without a client certificate: for everyone else."""
        self._extra_allow = Allowlist.parse(settings.allow)
        self.allowlist = self._build_allowlist()
        store.subscribe(lambda _model: self._refresh_allowlist())

    def load_tls(self) -> None:
        """Read the kubelet TLS files (at start-up: a bad file stops the start)."""
        self.kubelet_tls = self._kubelet_context(with_client_cert=True)
        self.kubelet_tls_anonymous = self._kubelet_context(with_client_cert=False)

    # -- policy -------------------------------------------------------------------------------
    def _build_allowlist(self) -> Allowlist:
        """The policy of the server's own dials: the agent's, for the server's node."""
        node = self.settings.node_name
        if node is None:
            return Allowlist()  # no node, no gateway of its own: it never dials directly
        return gateway_allowlist(
            self.store.model,
            node,
            self.settings.metrics_ports,
            self._extra_allow,
            pods=self.settings.allow_pods,
        )

    def _refresh_allowlist(self) -> None:
        self.allowlist = self._build_allowlist()
        log.debug("direct-dial allowlist updated", extra=kv(entries=len(self.allowlist)))

    def _kubelet_context(self, *, with_client_cert: bool) -> ssl.SSLContext:
        """TLS re-originated to kubelets: verified against --kubelet-ca-file (or the system
        store) unless --kubelet-insecure-skip-verify; ``with_client_cert`` presents
        --kubelet-cert-file."""
        s = self.settings
        ctx = tls.origin_client_context(
            s.kubelet_ca_file,
            s.kubelet_cert_file if with_client_cert else None,
            s.kubelet_key_file if with_client_cert else None,
            verify=not s.kubelet_insecure_skip_verify,
        )
        ctx.set_alpn_protocols(["http/1.1"])
        if s.kubelet_insecure_skip_verify and with_client_cert:
            log.warning(
                "kubelet certificates are NOT verified (--kubelet-insecure-skip-verify): "
                "re-originated TLS to kubelets can be intercepted"
            )
        return ctx

    # -- streams ------------------------------------------------------------------------------
    async def connect(self, route: Route, *, authenticated: bool = False) -> ByteStream:
        """A byte stream to the route's target: through its agent, or dialled by the server
        itself for a target in its own gateway; on a ``tls`` route, TLS re-originated on top
        (verified against the kubelet CA). The kubelet client certificate is presented only
        when the client ``authenticated`` to the front (a certificate from
        --front-client-ca-file): the server never lends its identity to an anonymous client.
        Failures become a :class:`RoutingError` with their HTTP status."""
        upstream: ByteStream
        if route.session is None:
            upstream = await self._dial_direct(route)
        else:
            upstream = TunnelByteStream(await self.open(route))
        if not route.tls:
            return upstream
        ctx = self.kubelet_tls if authenticated else self.kubelet_tls_anonymous
        assert ctx is not None, "load_tls() runs at start-up"
        self.metrics.kubelet_tls.labels(
            client_cert="presented"
            if authenticated and self.settings.kubelet_cert_file
            else "withheld"
        ).inc()
        secured = TlsByteStream(upstream, ctx, route.node.name)
        try:
            async with asyncio.timeout(self.settings.dial_timeout + 5):
                await secured.handshake()
        except (TlsError, TimeoutError, ConnectionError, StreamClosedError) as exc:
            upstream.close()
            raise _refusal(route, exc) from None
        return secured

    async def open(self, route: Route) -> TunnelStream:
        """Open a stream through the route's agent."""
        assert route.session is not None, "a direct route has no agent stream"
        started = time.monotonic()
        try:
            stream = await route.session.open_stream(route.target)
        except OpenError as exc:
            self.metrics.opens.labels(result=exc.code.name.lower()).inc()
            raise _refusal(route, exc) from None
        finally:
            self.metrics.dial.observe(time.monotonic() - started)
        self.metrics.opens.labels(result="ok").inc()
        return stream

    async def _dial_direct(self, route: Route) -> ByteStream:
        """Dial a target of the server's own gateway under the agent's policy, never one of the
        server's own listeners (a front → 508: the request would come straight back)."""
        target = route.target
        where = f"{target.host}:{target.port}"
        try:
            ip = ipaddress.ip_address(target.host)
        except ValueError:
            ip = None  # a name: the dialer checks every address it resolves to
        own = self.listeners.which(ip, target.port) if ip is not None else None
        if own in FRONTS:
            self.metrics.direct_dials.labels(result="refused").inc()
            self.metrics.loops.labels(kind="self_dial").inc()
            raise RoutingError(
                508, route.node.name, f"loop: {where} is this server's own {own} front"
            )
        if own is not None:
            self.metrics.direct_dials.labels(result="refused").inc()
            raise RoutingError(403, route.node.name, f"{where} is not in the server's allowlist")
        started = time.monotonic()
        try:
            dialed = await dial(
                target.host,
                target.port,
                self.allowlist,
                self.settings.dial_timeout,
                owner="the server",
            )
        except DialError as exc:
            self.metrics.direct_dials.labels(result=exc.code.name.lower()).inc()
            raise _refusal(route, exc) from None
        finally:
            self.metrics.dial.observe(time.monotonic() - started)
        self.metrics.direct_dials.labels(result="ok").inc()
        return SocketByteStream(dialed.reader, dialed.writer)


def _refusal(route: Route, exc: BaseException) -> RoutingError:
    """What a failure to reach the route's target answers: its HTTP status and reason."""
    node = route.node.name
    if isinstance(exc, OpenError):  # the agent refused, or did not answer
        why = reason(exc.code)
        return RoutingError(
            http_status(exc.code), node, f"{why} ({exc.message})" if exc.message else why
        )
    if isinstance(exc, DialError):  # the server's own dial
        status = http_status(exc.code)
        return RoutingError(status, node, exc.message if status == 403 else f"direct {exc.message}")
    if isinstance(exc, TimeoutError):
        return RoutingError(504, node, "TLS handshake to the kubelet timed out")
    return RoutingError(502, node, f"TLS to the kubelet failed: {exc}")
