"""From what a client asked for (``nodename:port``, an IP) to a node, a target and an agent."""

from __future__ import annotations

from dataclasses import dataclass

from ravenproxy.errors import RoutingError
from ravenproxy.model.objects import Node
from ravenproxy.model.snapshot import Model
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.transport.session import Session
from ravenproxy.wire.codes import ErrorCode
from ravenproxy.wire.frames import Target

# OPEN_RESULT / RESET codes → the HTTP status a front answers with.
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


@dataclass(frozen=True)
class Route:
    node: Node
    target: Target
    session: Session | None
    """The agent that carries it; None: the server dials the target itself (its own gateway)."""

    @property
    def direct(self) -> bool:
        return self.session is None


def find_node(model: Model, host: str) -> Node:
    node = model.node(host) or model.node(host.lower()) or model.node_by_ip(host)
    if node is None:
        raise RoutingError(404, host, "unknown node")
    return node


def route(
    model: Model,
    registry: AgentRegistry,
    host: str,
    port: int | None = None,
    *,
    local_node: str | None = None,
) -> Route:
    """Pick the agent for ``host:port`` (no port: the node's kubelet port). The target the agent
    dials is the node's InternalIP, never the name the client used. A node in the gateway of
    ``local_node`` (the server's own node), or that node itself, is dialled directly."""
    node = find_node(model, host)
    address = node.internal_ip
    if address is None:
        raise RoutingError(502, node.name, "node has no InternalIP")
    if port is None:
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
