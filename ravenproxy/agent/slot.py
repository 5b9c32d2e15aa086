"""One tunnel slot: what its dial loop holds, the WebSocket dial it makes, and how a failed
dial is told (one line saying why, one WARNING per outage)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from dataclasses import dataclass

from websockets.exceptions import InvalidHandshake, InvalidMessage, InvalidStatus

from ravenproxy.agent.settings import AgentSettings
from ravenproxy.log import kv
from ravenproxy.transport.session import Session, websocket_options
from ravenproxy.transport.ws_client import TunnelClientConnection
from ravenproxy.transport.ws_client import connect as ws_connect

log = logging.getLogger(__name__)

REWARN_AFTER = 300.0
"""An outage that lasts is warned about again this often (with the same reason; a new reason
is warned about at once); the retries in between are logged at DEBUG."""


def describe_connect_error(exc: BaseException) -> str:
    """One line saying why a dial to the server failed, for the log."""
    if isinstance(exc, InvalidStatus):
        return f"server answered HTTP {exc.response.status_code}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"server certificate rejected: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError):
        return exc.strerror or repr(exc)
    if isinstance(exc, InvalidMessage) and isinstance(exc.__cause__, EOFError):
        # With TLS 1.3 the server checks our certificate after our side of the handshake is
        # done, so a refused certificate shows up here, as a connection closed without answer.
        return (
            "the server closed the connection during the handshake: is this agent's "
            "certificate signed by the server's CA, unexpired, and for this node?"
        )
    if isinstance(exc, InvalidHandshake):
        return f"WebSocket handshake failed: {exc}"
    return repr(exc)


async def connect(
    address: str, settings: AgentSettings, tls: ssl.SSLContext
) -> TunnelClientConnection:
    """One WebSocket dial of ``address`` with ``tls`` (the current certificate)."""
    return await ws_connect(
        address,
        ssl=tls,
        open_timeout=10,
        user_agent_header=f"ravenproxy-agent/{settings.node_name}",
        logger=logging.getLogger("ravenproxy.agent.websocket"),
        **websocket_options(settings.session.wire),
    )


@dataclass(eq=False)
class Tunnel:
    """One tunnel slot: what its dial loop holds now (readiness, metrics and logs read it)."""

    slot: int
    address: str
    """The address dialled now (a discovered slot keeps its one address)."""
    discovered: bool = False
    state: str = "down"
    """``dialling``, ``up``, ``draining`` or ``down``."""
    server_id: str | None = None
    """The id the server announced (None before the first tunnel, or from an older server)."""
    session: Session | None = None
    retired: bool = False
    """Removed from the model: drain the tunnel, dial no more."""
    ups: int = 0
    """Times a tunnel of this slot came up (a reconnect is every one after the first)."""
    task: asyncio.Task[None] | None = None
    generation: int = 0
    """The agent's certificate generation the tunnel up was dialled with."""
    failures: int = 0
    """Failed dials since the slot's last tunnel up (the outage's attempts)."""
    down_since: float | None = None
    """Loop time the outage began (its tunnel lost, or the first dial failed); None while up."""
    warned: str | None = None
    """The reason the outage's last WARNING gave (the retries with it are logged at DEBUG)."""
    warned_at: float = 0.0

    @property
    def server(self) -> str:
        """The server's id, else its address: the label the metrics and logs use."""
        return self.server_id or self.address

    def dial_failed(self, reason: str, delay: float) -> None:
        """Log a failed dial: one WARNING per outage of the slot (again when the reason
        changes, and every :data:`REWARN_AFTER` seconds), the retries in between at DEBUG, so a
        fleet whose server restarts does not write a line per agent per retry; the metrics count
        every failure, and the slot's ``tunnel up`` line says how many attempts it took."""
        now = asyncio.get_running_loop().time()
        self.failures += 1
        if self.down_since is None:
            self.down_since = now
        if reason == self.warned and now - self.warned_at < REWARN_AFTER:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "still cannot reach the server, retrying",
                    extra=kv(
                        address=self.address,
                        slot=self.slot,
                        reason=reason,
                        attempts=self.failures,
                        retry_in=f"{delay:.2f}s",
                    ),
                )
            return
        self.warned, self.warned_at = reason, now
        log.warning(
            "cannot reach the server, retrying",
            extra=kv(
                address=self.address,
                slot=self.slot,
                reason=reason,
                attempts=self.failures,
                down_for=f"{now - self.down_since:.1f}s",
                retry_in=f"{delay:.2f}s",
            ),
        )
