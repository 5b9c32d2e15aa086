"""The router: from what a client asked for to a :class:`Route` — the node, the target the
agent (or the server itself) dials, the agent that carries it, and whether TLS is re-originated.

Everything routing decides is here: the node a name, an IP or a pod names (the destination
itself is parsed from the request by :mod:`ravenproxy.server.podroutes`, below this), the agent
that may serve it (:class:`~ravenproxy.server.registry.AgentRegistry`), the server's own gateway
(dialled directly), TLS to the kubelet, and the one mapping of wire codes to HTTP statuses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ravenproxy.errors import RoutingError
from ravenproxy.model.objects import Node, is_ip
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore
from ravenproxy.server.podroutes import Destination
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.transport.session import Session
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import Target

# OPEN_RESULT / RESET codes (and a direct dial's refusals) → the HTTP status a front answers with.
HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.REFUSED: 403,
    ErrorCode.UNKNOWN_NODE: 404,
    ErrorCode.DIAL_FAILED: 502,
    ErrorCode.DIAL_TIMEOUT: 504,
    ErrorCode.OPEN_TIMEOUT: 504,
    ErrorCode.TOO_MANY_STREAMS: 503,
    ErrorCode.GOING_AWAY: 503,
    ErrorCode.CONNECTION_LOST: 502,
}

REASONS: dict[ErrorCode, str] = {
    ErrorCode.REFUSED: "refused by the agent's allowlist",
    ErrorCode.UNKNOWN_NODE: "unknown node",
    ErrorCode.DIAL_FAILED: "the agent could not connect",
    ErrorCode.DIAL_TIMEOUT: "the agent's dial timed out",
    ErrorCode.OPEN_TIMEOUT: "the agent did not answer in time",
    ErrorCode.TOO_MANY_STREAMS: "too many streams on the agent",
    ErrorCode.GOING_AWAY: "the agent is draining",
    ErrorCode.CONNECTION_LOST: "the tunnel to the agent was lost",
}


def http_status(code: ErrorCode) -> int:
    """The HTTP status for a wire code (502 for any code without one of its own)."""
    return HTTP_STATUS.get(code, 502)


def reason(code: ErrorCode) -> str:
    """Why, in words, for a wire code."""
    return REASONS.get(code, code.name.lower())


@dataclass(frozen=True)
class Route:
    node: Node
    target: Target
    session: Session | None
    """The agent that carries it; None: the server dials the target itself (its own gateway)."""
    tls: bool = False
    """Re-originate TLS to the target (a kubelet) on top of the stream."""

    @property
    def direct(self) -> bool:
        return self.session is None


@dataclass(frozen=True, slots=True)
class RouteMemo:
    """A request's route and what it was decided on: what the destination names (not its
    path: :attr:`dest`'s host, port, pod and scheme), TLS from the client, the model and the
    registry's generation."""

    over_tls: bool
    model: Model
    agents: int
    route: Route
    dest: Destination
    """The destination it was decided for: the same object again (a keep-alive client's
    same request, :class:`~ravenproxy.server.exchange.Exchange` reuses it) needs no
    comparison."""


@dataclass(frozen=True)
class UpstreamKey:
    """What a kept target connection must match to carry the next request."""

    session: int
    """``id()`` of the agent session that carries it; 0: dialled by the server itself."""
    host: str
    port: int
    tls: bool

    @classmethod
    def of(cls, route: Route) -> UpstreamKey:
        session = id(route.session) if route.session is not None else 0
        return cls(session, route.target.host, route.target.port, route.tls)


def _named(model: Model, host: str) -> Node | None:
    return model.node(host) or model.node(host.lower()) or model.node_by_ip(host)


def find_node(model: Model, host: str) -> Node:
    """The node ``host`` names: a node name, or one of its InternalIPs."""
    node = _named(model, host)
    if node is None:
        raise RoutingError(404, host, "unknown node")
    return node


def find_target(model: Model, host: str) -> tuple[Node, str | None]:
    """The node ``host`` leads to and the address to dial there: a node name or InternalIP →
    that node and its InternalIP; an IP in a node's pod CIDRs (:meth:`Model.node_by_pod_ip`) →
    that node and the IP itself; anything else → 404 naming ``host``."""
    node = _named(model, host)
    if node is not None:
        return node, node.internal_ip
    address = host.strip("[]")
    node = model.node_by_pod_ip(address)
    if node is None:
        if not is_ip(address):
            raise RoutingError(404, host, "unknown node")
        raise RoutingError(404, host, "no node has this address, nor a pod CIDR holding it")
    return node, address


def route(
    model: Model,
    registry: AgentRegistry,
    host: str,
    port: int | None = None,
    *,
    local_node: str | None = None,
) -> Route:
    """Pick the agent for ``host:port`` (no port: the node's kubelet port). ``host`` is a node
    (its name or InternalIP: the agent dials the InternalIP, never the name the client used)
    or a pod IP (the agent of the node whose pod CIDRs hold it dials it, :func:`find_target`).
    A node in the gateway of ``local_node`` (the server's own node), or that node itself, is
    dialled directly."""
    node, address = find_target(model, host)
    if address is None:
        raise RoutingError(502, node.name, "node has no InternalIP")
    if port is None:
        if address != node.internal_ip:
            raise RoutingError(400, host, "a pod address needs a port")
        port = node.kubelet_port
    if local_node is not None:
        local = model.node(local_node)
        if node.name == local_node or (
            local is not None and local.gateway is not None and local.gateway == node.gateway
        ):
            return Route(node, Target(node.name, address, port), None)
    session = registry.pick(model, node.name)
    if session is None:
        raise RoutingError(503, node.name, "no agent connected for this node")
    return Route(node, Target(node.name, address, port), session)


class Router:
    """Routes on the current model, the connected agents and the server's own node."""

    def __init__(self, store: ModelStore, registry: AgentRegistry, own_node: str | None) -> None:
        self.store = store
        self.registry = registry
        self.own_node = own_node

    def node_named(self, name: str) -> Node | None:
        """The node a TLS server name (SNI) names exactly, if any."""
        return self.store.model.node(name)

    def route(self, host: str, port: int | None = None) -> Route:
        """A raw byte stream to ``host:port`` (CONNECT, SNI passthrough): no TLS of ours."""
        return route(self.store.model, self.registry, host, port, local_node=self.own_node)

    def route_request(self, dest: Destination, *, over_tls: bool) -> Route:
        """An HTTP request's route: a pod path goes to the pod's node. TLS is re-originated
        when the client came over TLS, asked for ``https://``, or the port is the node's
        kubelet port (kubelets speak only TLS)."""
        model = self.store.model
        host = dest.host
        if dest.pod is not None:
            namespace, name = dest.pod
            pod = model.pod(namespace, name)
            if pod is None or not pod.node_name:
                raise RoutingError(404, f"pod {namespace}/{name}", "pod not found on any node")
            host = pod.node_name
        r = route(model, self.registry, host, dest.port, local_node=self.own_node)
        tls = over_tls or dest.scheme == "https" or r.target.port == r.node.kubelet_port
        return dataclasses.replace(r, tls=tls) if tls else r

    def route_again(self, dest: Destination, over_tls: bool, memo: RouteMemo | None) -> RouteMemo:
        """:meth:`route_request`, or ``memo`` (a keep-alive connection's last route) when the
        request names the same node, port, pod and scheme on the same model, and its agent is
        one routing would choose from now: the next request of a connection goes where the last
        one went (its kept target connection with it) without routing it again. While the
        registry's generation has not moved that holds without asking; when it has (any
        agent's coming, GOAWAY or end: :meth:`_still`), the memo is checked once and
        re-stamped. Positional (the callbacks call it per request: a call with keywords is not
        specialized)."""
        model, agents = self.store.model, self.registry.generation
        if memo is not None and memo.model is model and memo.over_tls is over_tls:
            last = memo.dest
            # What routing read of a destination, compared field by field with the one the
            # memo was made for (no key tuple made per request that differs).
            if last is dest or (
                last.host == dest.host
                and last.port == dest.port
                and last.pod == dest.pod
                and last.scheme == dest.scheme
            ):
                if memo.agents == agents:  # its agent, if any, still live: nothing moved
                    return memo
                if self._still(memo):
                    return RouteMemo(over_tls, model, agents, memo.route, memo.dest)
        route = self.route_request(dest, over_tls=over_tls)
        return RouteMemo(over_tls, model, agents, route, dest)

    def _still(self, memo: RouteMemo) -> bool:
        """The memo's route stands although the registry's generation moved (on the same
        model): a direct route depends on the model only; an agent's stands while that agent
        is among those routing would choose from now (:meth:`AgentRegistry.candidates`: live,
        and no better one came, the node's own agent say). Another agent's drain or end leaves
        it be: rerouting would move the client, and its kept target connection, to another
        agent of the same node (least loaded) for nothing."""
        session = memo.route.session
        if session is None:
            return True
        candidates = self.registry.candidates(memo.model, memo.route.node.name)
        return any(s is session for s in candidates)
