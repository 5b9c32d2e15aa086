"""The agent's tunnel slots: one dial loop per slot holds a tunnel to one proxy server.

Each slot dials its address (``--server-addr``, or a server found with ``--discover-servers``,
added and drained as the model changes), holds the tunnel while it lasts and dials again with
its own backoff (:mod:`ravenproxy.agent.servers` says where and how soon). A tunnel to a server
another slot already holds is closed as a duplicate (close code 4000) and the slot dials again.
When the agent's own certificate changes (:meth:`TunnelSlots.rotate`), every slot that is up
rotates make-before-break: a replacement tunnel with the new certificate to the same server
becomes the slot's, and the old one drains. Streams the tunnels carry are served by the
callback :class:`~ravenproxy.agent.app.Agent` gives (``serve``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from ravenproxy.agent.servers import (
    HEALTHY_AFTER,
    QUICK_REDIAL_WINDOW,
    REDIAL_AFTER_UP,
    discovered_servers,
    slot_address,
)
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.agent.slot import Tunnel, connect, describe_connect_error
from ravenproxy.backoff import backoff, redial
from ravenproxy.log import kv
from ravenproxy.metrics import AgentMetrics
from ravenproxy.model.store import ModelStore
from ravenproxy.transport.credentials import CredentialsWatcher
from ravenproxy.transport.session import Session, StreamClosedError, StreamHandler, TunnelStream
from ravenproxy.transport.ws_client import TunnelClientConnection
from ravenproxy.wire.codes import DUPLICATE_CLOSE_CODE

log = logging.getLogger(__name__)

DRAIN_TIMEOUT = 30.0
"""How long a tunnel the agent drains itself (a server removed from the model, a duplicate)
waits for its open streams before it is closed anyway."""

ROTATE_ATTEMPTS = 5
"""Dials for a replacement tunnel on the same server before the slot gives up making before
breaking: it then drains its old tunnel and re-dials (no stream cut either, a short gap)."""


class TunnelSlots:
    """The tunnel slots of one agent and their dial loops (started by :meth:`start`)."""

    def __init__(
        self,
        settings: AgentSettings,
        store: ModelStore,
        metrics: AgentMetrics,
        credentials: CredentialsWatcher[ssl.SSLContext],
        serve: StreamHandler,
        stream_closed: Callable[[TunnelStream], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.credentials = credentials
        self._serve = serve
        self._stream_closed = stream_closed
        self.tunnels: dict[int, Tunnel] = {}
        self.connected = asyncio.Event()
        """Set while at least one tunnel is up."""
        self._slots = 0
        self._tg: asyncio.TaskGroup | None = None
        self._generation = 0
        """Bumped when this agent's own certificate changes: tunnels of an older one rotate."""
        self._rotate = asyncio.Event()
        """Set (and replaced) at each generation: wakes the slots up to rotate."""
        self._draining: set[Session] = set()
        """Tunnels replaced by a rotation, draining."""

    def up(self) -> list[Tunnel]:
        """The slots whose tunnel is up."""
        return [
            t
            for t in self.tunnels.values()
            if t.state == "up" and t.session is not None and not t.session.closed
        ]

    def wanted(self) -> int:
        """The tunnels the agent should hold."""
        if self.settings.discover_servers:
            return sum(1 for t in self.tunnels.values() if not t.retired)
        return self.settings.slots

    def tally(self) -> str:
        return f"{len(self.up())}/{self.wanted()}"

    def open_streams(self) -> int:
        """Streams open on the tunnels up and on those draining after a rotation."""
        return sum(len(t.session.streams) for t in self.up() if t.session is not None) + sum(
            len(d.streams) for d in self._draining
        )

    def rotate(self) -> None:
        """The agent's own certificate changed: every slot up rotates make-before-break."""
        self._generation += 1
        rotate, self._rotate = self._rotate, asyncio.Event()
        rotate.set()

    def start(self, tg: asyncio.TaskGroup) -> None:
        """Start the dial loops in ``tg`` (their drains run there too, until :meth:`stopped`)."""
        s = self.settings
        self._tg = tg
        if s.discover_servers:
            tg.create_task(self._follow_model(), name="agent-discover-servers")
        else:
            for _ in range(s.slots):
                self._add_slot(s.server_urls[0], discovered=False)

    def stopped(self) -> None:
        """The task group of :meth:`start` has ended."""
        self._tg = None

    def _add_slot(self, address: str, *, discovered: bool) -> Tunnel:
        assert self._tg is not None, "slots are added while run() runs"
        tunnel = Tunnel(self._slots, address, discovered=discovered)
        self._slots += 1
        self.tunnels[tunnel.slot] = tunnel
        tunnel.task = self._tg.create_task(
            self._dial_loop(tunnel), name=f"agent-tunnel:{tunnel.slot}"
        )
        return tunnel

    async def _follow_model(self) -> None:
        """``--discover-servers``: one slot per discovered server, added and drained as the
        model changes (no restart)."""
        while True:
            version = self.store.version
            wanted = discovered_servers(self.store.model)
            held = {t.address: t for t in self.tunnels.values() if not t.retired}
            added = [a for a in wanted if a not in held]
            removed = [t for a, t in held.items() if a not in wanted]
            if added or removed:
                log.info(
                    "servers discovered",
                    extra=kv(
                        servers=len(wanted),
                        added=",".join(added) or "-",
                        removed=",".join(t.address for t in removed) or "-",
                    ),
                )
            for address in added:
                self._add_slot(address, discovered=True)
            for tunnel in removed:
                self._retire(tunnel)
            await self.store.wait_changed(version)

    def _retire(self, tunnel: Tunnel) -> None:
        """A server left the model: drain its tunnel (GOAWAY, open streams finish), dial it no
        more."""
        tunnel.retired = True
        session = tunnel.session
        if tunnel.state == "up" and session is not None and self._tg is not None:
            self._set_state(tunnel, "draining", reason="server removed from the model")
            self._tg.create_task(
                self._drain(session, "server removed from the model"),
                name=f"agent-drain:{tunnel.slot}",
            )
        elif tunnel.task is not None:
            tunnel.task.cancel()  # dialling or waiting: nothing to drain
            self._forget(tunnel)

    def _forget(self, tunnel: Tunnel) -> None:
        self.tunnels.pop(tunnel.slot, None)
        self.metrics.forget_server(tunnel.server, tunnel.address)

    async def _drain(self, session: Session, reason: str, code: int = 1000) -> None:
        """GOAWAY (the server opens no more streams here), let the open ones finish (up to
        :data:`DRAIN_TIMEOUT`), then close with ``code``."""
        session.goaway(reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DRAIN_TIMEOUT
        # No event marks a session's last stream closing; a bounded 10 Hz poll is cheap.
        while session.streams and not session.closed and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        await session.close(reason, code)

    def _holder(self, server_id: str | None, tunnel: Tunnel) -> Tunnel | None:
        """The other slot already up on ``server_id``; None for a server without an id (an
        older server cannot be told apart from another, so it is never a duplicate)."""
        if server_id is None:
            return None
        for other in self.up():
            if other is not tunnel and other.server_id == server_id:
                return other
        return None

    def _set_state(self, tunnel: Tunnel, state: str, **fields: object) -> None:
        """One log line per tunnel state change, naming the server and its address."""
        tunnel.state = state
        up = state == "up"
        if up:
            self.connected.set()
        elif not self.up():
            self.connected.clear()
        self.metrics.connected.set(1 if self.up() else 0)
        self.metrics.server_tunnel.labels(server=tunnel.server, address=tunnel.address).set(
            1 if up else 0
        )
        message = {
            "up": "tunnel up",
            "draining": "tunnel draining",
            "down": "tunnel down, reconnecting",
        }[state]
        level = logging.INFO if state != "down" else logging.WARNING
        if state == "down" and tunnel.retired:
            message, level = "tunnel drained", logging.INFO
        log.log(
            level,
            message,
            extra=kv(
                node=self.settings.node_name,
                server_id=tunnel.server_id or "-",
                address=tunnel.address,
                slot=tunnel.slot,
                tunnels=self.tally(),
                **fields,
            ),
        )

    async def _connect(self, address: str) -> TunnelClientConnection:
        """One WebSocket dial with the current certificate."""
        return await connect(address, self.settings, self.credentials.contexts)

    async def _dial_loop(self, tunnel: Tunnel) -> None:
        """Keep one tunnel up: dial, hold it while it lasts, dial again."""
        s = self.settings
        delays = backoff(s.backoff_base, s.backoff_cap)
        turn = 0
        # With more addresses than slots, a slot whose server is away tries the next one;
        # otherwise it waits for its own (every other address has its own slot).
        spare = len(s.server_urls) > s.slots
        while not tunnel.retired:
            if not tunnel.discovered:
                tunnel.address = slot_address(s.server_urls, tunnel.slot, turn)
            tunnel.state = "dialling"
            generation = self._generation
            try:
                ws = await self._connect(tunnel.address)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # every failure to dial is retried; the log says why
                delay = next(delays)
                self.metrics.connects.labels(result="failed").inc()
                tunnel.dial_failed(describe_connect_error(exc), delay)
                turn += 1 if spare else 0
                await asyncio.sleep(delay)
                continue
            self.metrics.connects.labels(result="ok").inc()
            outcome, uptime = await self._hold(tunnel, ws, generation)
            if outcome == "duplicate":
                turn += 1
                await asyncio.sleep(next(delays))
                continue
            if tunnel.retired:
                break
            if outcome == "up" and uptime >= HEALTHY_AFTER:
                # Its server drained or went away: it (or another) is most likely back within
                # seconds, so the next dials are quick for a while before backing off.
                delays = redial(REDIAL_AFTER_UP, QUICK_REDIAL_WINDOW, s.backoff_base, s.backoff_cap)
                delay = next(delays)
            else:
                delay = next(delays)
            if outcome == "up":
                self._set_state(
                    tunnel,
                    "down",
                    reason=tunnel.session.close_reason if tunnel.session else "",
                    retry_in=f"{delay:.2f}s",
                )
                tunnel.down_since = asyncio.get_running_loop().time()
            else:
                tunnel.dial_failed(outcome, delay)
            tunnel.session = None
            await asyncio.sleep(delay)
        if tunnel.state in ("up", "draining"):
            self._set_state(tunnel, "down")
        self._forget(tunnel)

    def _session(
        self, tunnel: Tunnel, ws: TunnelClientConnection
    ) -> tuple[Session, asyncio.Task[None]]:
        s = self.settings
        session = Session(
            ws,
            server_side=False,
            config=s.session,
            on_open=self._serve,
            name=f"{s.node_name}:{tunnel.slot}",
            fields={"node": s.node_name, "address": tunnel.address},
        )
        session.on_stream_closed = self._stream_closed
        runner = asyncio.create_task(session.run(), name=f"agent-session:{tunnel.slot}")
        return session, runner

    async def _hold(
        self, tunnel: Tunnel, ws: TunnelClientConnection, generation: int
    ) -> tuple[str, float]:
        """Run one tunnel until it ends: ``("up", seconds up)``, ``("duplicate", 0)``, or
        (it ended before the server's SETTINGS) ``(why, 0)``. While it is up, a new
        certificate replaces it make-before-break (:meth:`_rotate_slot`)."""
        s = self.settings
        session, runner = self._session(tunnel, ws)
        loop = asyncio.get_running_loop()
        try:
            try:
                await session.wait_ready()
            except StreamClosedError:
                await asyncio.shield(runner)
                return session.close_reason or "closed before SETTINGS", 0.0
            server_id = session.peer_server_id
            holder = self._holder(server_id, tunnel)
            if holder is not None:
                reason = f"duplicate: already connected to server {server_id}"
                self.metrics.duplicates.labels(server=server_id).inc()
                log.info(
                    "duplicate tunnel closed, dialling again",
                    extra=kv(
                        node=s.node_name,
                        server_id=server_id,
                        address=tunnel.address,
                        slot=tunnel.slot,
                        held_by_slot=holder.slot,
                    ),
                )
                # GOAWAY first: a stream the server opened meanwhile still finishes.
                await self._drain(session, reason, DUPLICATE_CLOSE_CODE)
                await asyncio.shield(runner)
                return "duplicate", 0.0
            if tunnel.server_id is not None and tunnel.server_id != server_id:
                # The slot moved to another server: its old series must not stay at 0 forever.
                self.metrics.forget_server(tunnel.server, tunnel.address)
            tunnel.server_id = server_id
            tunnel.session = session
            tunnel.generation = generation
            if tunnel.ups:
                self.metrics.reconnects.labels(server=tunnel.server).inc()
            tunnel.ups += 1
            up_at = loop.time()
            outage = {}
            if tunnel.down_since is not None:
                # How long the slot was without a tunnel, and the dials it took (this one too).
                outage = {
                    "attempts": tunnel.failures + 1,
                    "down_for": f"{up_at - tunnel.down_since:.2f}s",
                }
            tunnel.failures, tunnel.down_since, tunnel.warned = 0, None, None
            self._set_state(tunnel, "up", **outage)
            while not runner.done():
                rotate = self._rotate
                if tunnel.generation != self._generation and not tunnel.retired:
                    replaced = await self._rotate_slot(tunnel, session, runner)
                    if replaced is not None:
                        session, runner = replaced
                    continue
                waiter = asyncio.create_task(rotate.wait(), name=f"agent-rotate-wait:{tunnel.slot}")
                try:
                    await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
            return "up", loop.time() - up_at
        except asyncio.CancelledError:
            await session.close("agent stopping")
            await asyncio.gather(runner, return_exceptions=True)
            raise

    async def _rotate_slot(
        self, tunnel: Tunnel, old: Session, old_runner: asyncio.Task[None]
    ) -> tuple[Session, asyncio.Task[None]] | None:
        """Make before break: a tunnel with the new certificate to the same server; once it is
        up it is the slot's, and ``old`` drains (GOAWAY, its streams finish, then it closes).
        Returns the new tunnel; None when none could be made (the slot then drains ``old``
        and re-dials)."""
        s = self.settings
        delays = backoff(s.backoff_base, s.backoff_cap)
        for attempt in range(1, ROTATE_ATTEMPTS + 1):
            if old_runner.done():
                return None  # the old tunnel ended meanwhile: the slot re-dials anyway
            generation = self._generation
            try:
                ws = await self._connect(tunnel.address)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # retried; the log says why
                log.warning(
                    "cannot open a replacement tunnel, retrying",
                    extra=kv(
                        address=tunnel.address,
                        slot=tunnel.slot,
                        attempt=attempt,
                        reason=describe_connect_error(exc),
                    ),
                )
                await asyncio.sleep(next(delays))
                continue
            session, runner = self._session(tunnel, ws)
            try:
                try:
                    await session.wait_ready()
                except StreamClosedError:
                    await asyncio.shield(runner)
                    await asyncio.sleep(next(delays))
                    continue
                server_id = session.peer_server_id
                if tunnel.server_id is not None and server_id != tunnel.server_id:
                    # Behind a load balancer the dial may reach another server: this is not
                    # the replacement (and the slot holds no tunnel to that server).
                    await self._drain(
                        session, f"replacement reached server {server_id}", DUPLICATE_CLOSE_CODE
                    )
                    await asyncio.shield(runner)
                    await asyncio.sleep(next(delays))
                    continue
            except asyncio.CancelledError:
                await session.close("agent stopping")
                await asyncio.gather(runner, return_exceptions=True)
                raise
            tunnel.session = session
            tunnel.generation = generation
            log.info(
                "tunnel rotated",
                extra=kv(
                    node=s.node_name,
                    server_id=server_id or "-",
                    address=tunnel.address,
                    slot=tunnel.slot,
                    serial=self.credentials.current.serial,
                    draining_streams=len(old.streams),
                ),
            )
            assert self._tg is not None, "slots run inside run()"
            self._draining.add(old)
            self._tg.create_task(
                self._drain_replaced(tunnel, old, old_runner),
                name=f"agent-drain-rotated:{tunnel.slot}",
            )
            return session, runner
        log.warning(
            "no replacement tunnel on the same server: draining the old one, then re-dialling",
            extra=kv(address=tunnel.address, slot=tunnel.slot, attempts=ROTATE_ATTEMPTS),
        )
        tunnel.generation = self._generation
        await self._drain(old, "certificate rotated")
        return None

    async def _drain_replaced(
        self, tunnel: Tunnel, session: Session, runner: asyncio.Task[None]
    ) -> None:
        """A tunnel replaced by a rotation: GOAWAY, then wait for its streams, however long
        (cutting one is what make-before-break avoids); closed at once when the agent stops."""
        fields = kv(
            node=self.settings.node_name,
            server_id=tunnel.server_id or "-",
            address=tunnel.address,
            slot=tunnel.slot,
            reason="certificate rotated",
        )
        log.info("tunnel draining", extra=fields)
        session.goaway("certificate rotated")
        try:
            # No event marks a session's last stream closing; a 10 Hz poll is cheap.
            while session.streams and not session.closed:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            await session.close("certificate rotated")
            await asyncio.shield(runner)
            log.info("tunnel drained", extra=fields)
        finally:
            self._draining.discard(session)
            if not runner.done():
                await session.close("agent stopping")
                await asyncio.gather(runner, return_exceptions=True)
