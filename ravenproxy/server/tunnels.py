"""The agents' tunnels on the server: who may hold one (the certificate names a node, the
subprotocol is ours, the server is not stopping), and its session in the agent registry while
it runs, with the tunnel metrics and log lines."""

from __future__ import annotations

import logging
from collections.abc import Callable

from websockets.asyncio.server import ServerConnection
from websockets.frames import CloseCode

from ravenproxy.errors import PKIError
from ravenproxy.log import kv, peer_text
from ravenproxy.metrics import ServerMetrics
from ravenproxy.model.store import ModelStore
from ravenproxy.server.registry import AgentRegistry
from ravenproxy.server.settings import ServerSettings
from ravenproxy.transport import tls
from ravenproxy.transport.session import Session, TunnelStream
from ravenproxy.wire.codes import DUPLICATE_CLOSE_CODE, SUBPROTOCOL, ErrorCode

log = logging.getLogger(__name__)


class Tunnels:
    """The tunnel listener's handler (:meth:`accept`); ``stopping`` says whether the server
    stops (a tunnel that arrives then is closed at once)."""

    def __init__(
        self,
        settings: ServerSettings,
        store: ModelStore,
        registry: AgentRegistry,
        metrics: ServerMetrics,
        stopping: Callable[[], bool],
    ) -> None:
        self.settings = settings
        self.store = store
        self.registry = registry
        self.metrics = metrics
        self._stopping = stopping

    async def accept(self, ws: ServerConnection) -> None:
        """The tunnel listener's handler: one agent's tunnel, from handshake to close."""
        peer = ws.remote_address
        ssl_object = ws.transport.get_extra_info("ssl_object")
        try:
            node = tls.peer_node_name(ssl_object)
        except PKIError as exc:
            log.warning("agent refused: bad certificate", extra=kv(peer=peer, error=exc))
            self.metrics.agent_sessions.labels(outcome="bad_certificate").inc()
            await ws.close(1008, "certificate does not name a node")
            return
        if ws.subprotocol != SUBPROTOCOL:
            log.warning(
                "agent refused: protocol version",
                extra=kv(
                    node=node,
                    peer=peer,
                    offered=ws.request.headers.get("Sec-WebSocket-Protocol", "")
                    if ws.request
                    else "",
                ),
            )
            self.metrics.agent_sessions.labels(outcome="bad_protocol").inc()
            await ws.close(1002, f"subprotocol {SUBPROTOCOL} required")
            return
        if self._stopping():
            await ws.close(1001, "server shutting down")
            return
        if self.store.model.node(node) is None:
            log.warning(
                "agent for a node not in the model: it can serve nothing yet",
                extra=kv(node=node, peer=peer),
            )
        session = Session(
            ws,
            server_side=True,
            config=self.settings.session,
            name=node,
            fields={"node": node, "peer": peer_text(peer)},
            server_id=self.settings.identity,
        )
        session.on_stream_closed = self._stream_closed
        self.registry.add(node, session)
        self.metrics.agents.set(len(self.registry))
        self.metrics.agent_sessions.labels(outcome="connected").inc()
        log.info(
            "agent connected",
            extra=kv(node=node, peer=peer_text(peer), serial=tls.peer_serial(ssl_object)),
        )
        try:
            await session.run()
        finally:
            if session.error is not None:  # closed by us for a connection error
                flood = session.error is ErrorCode.ENHANCE_YOUR_CALM
                outcome = "flood_closed" if flood else "protocol_error"
                self.metrics.agent_sessions.labels(outcome=outcome).inc()
            elif _refused_a_frame(ws):
                self.metrics.agent_sessions.labels(outcome="protocol_error").inc()
            duplicate = _closed_as_duplicate(ws)
            if duplicate:
                # The agent already holds a tunnel to us (dialled again through a load
                # balancer): it closed this one and dials for another server.
                self.metrics.agent_sessions.labels(outcome="duplicate").inc()
            self.registry.remove(node, session)
            self.metrics.agents.set(len(self.registry))
            log.info(
                "agent closed a duplicate tunnel" if duplicate else "agent disconnected",
                extra=kv(node=node, peer=peer_text(peer), reason=session.close_reason),
            )

    def _stream_closed(self, stream: TunnelStream) -> None:
        self.metrics.bytes.labels(direction="up").inc(stream.bytes_out)
        self.metrics.bytes.labels(direction="down").inc(stream.bytes_in)


FRAME_REFUSALS = frozenset(
    {CloseCode.PROTOCOL_ERROR, CloseCode.INVALID_DATA, CloseCode.MESSAGE_TOO_BIG}
)
"""The close codes this end sends when it refuses an agent's WebSocket frame (RFC 6455 7.4.1:
1002, 1007, 1009): no wire-layer error is involved, the frame never became a message."""


def _refused_a_frame(ws: ServerConnection) -> bool:
    """Whether this server closed the tunnel first, for a WebSocket frame it refused."""
    protocol = ws.protocol
    sent = protocol.close_sent
    return sent is not None and sent.code in FRAME_REFUSALS and not protocol.close_rcvd_then_sent


def _closed_as_duplicate(ws: ServerConnection) -> bool:
    """Whether the agent closed this tunnel as a duplicate (docs/protocol.md 10.1)."""
    rcvd = ws.protocol.close_rcvd
    return rcvd is not None and rcvd.code == DUPLICATE_CLOSE_CODE
