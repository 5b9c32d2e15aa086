"""The edge agent: holds one tunnel to every proxy server and serves the streams they carry.

Where the servers are: every ``--server-addr`` (several, or one load balancer's address dialled
until ``--server-count`` distinct servers are held), or, with ``--discover-servers``, the public
address of every active proxy endpoint in the model, followed as it changes. Each tunnel slot
has its own dial loop and backoff. A server is known by the id it announces in SETTINGS
(SERVER_ID): a second tunnel to a server already held is closed as a duplicate (close code
4000) and the slot dials again. Streams from any tunnel are served the same way.

Re-dial: a tunnel that was up is re-dialled within a second (jittered), whether its server
drained (GOAWAY) or went away, and its failed dials are retried 0.5-1.5 s apart for the next
10 s (a restart: about one dial a second per agent, not a herd); after that a failed dial backs
off exponentially with full jitter, only across consecutive failures
(:func:`ravenproxy.backoff.redial`). A slot's outage is logged once at WARNING (the first
failed dial, again on a new reason), its retries at DEBUG, its return with the attempts taken.

Certificates are reloaded from disk (:mod:`ravenproxy.transport.credentials`): every dial uses
the current set. When the agent's own certificate changes, each slot that is up rotates
make-before-break: it dials a replacement tunnel with the new certificate; once that is up on
the same server id, it becomes the slot's tunnel and the old one drains (GOAWAY, its streams
finish, then it closes), so no stream is cut. The replacement belongs to the slot it replaces,
so it is not a duplicate; a replacement that lands on another server (behind a load balancer)
is closed as one and dialled again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake, InvalidMessage, InvalidStatus

from ravenproxy.agent.servers import (
    HEALTHY_AFTER,
    QUICK_REDIAL_WINDOW,
    REDIAL_AFTER_UP,
    discovered_servers,
    slot_address,
)
from ravenproxy.agent.settings import AgentSettings
from ravenproxy.backoff import backoff, redial
from ravenproxy.kube.sources import model_source
from ravenproxy.lifecycle import listening, parts
from ravenproxy.log import kv
from ravenproxy.metrics import AgentMetrics
from ravenproxy.model.allowlist import Allowlist, gateway_allowlist
from ravenproxy.model.store import ModelStore
from ravenproxy.pki.credentials import Credentials
from ravenproxy.transport import tls
from ravenproxy.transport.credentials import CredentialFiles, CredentialsWatcher
from ravenproxy.transport.dialer import DialError, dial_protocol
from ravenproxy.transport.session import Session, StreamClosedError, TunnelStream, websocket_options
from ravenproxy.transport.splice import Splice
from ravenproxy.wire.codes import DUPLICATE_CLOSE_CODE

if TYPE_CHECKING:
    from aiohttp import web

    from ravenproxy.kube.certificates import CertificateRequester
    from ravenproxy.l3.publish import KeyPublisher

log = logging.getLogger(__name__)

DRAIN_TIMEOUT = 30.0
"""How long a tunnel the agent drains itself (a server removed from the model, a duplicate)
waits for its open streams before it is closed anyway."""

REWARN_AFTER = 300.0
"""An outage that lasts is warned about again this often (with the same reason; a new reason
is warned about at once); the retries in between are logged at DEBUG."""

ROTATE_ATTEMPTS = 5
"""Dials for a replacement tunnel on the same server before the slot gives up making before
breaking: it then drains its old tunnel and re-dials (no stream cut either, a short gap)."""


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


class Agent:
    def __init__(self, settings: AgentSettings, store: ModelStore | None = None) -> None:
        self.settings = settings
        self.store = store or ModelStore()
        self.metrics = AgentMetrics()
        self.tunnels: dict[int, Tunnel] = {}
        self.connected = asyncio.Event()
        """Set while at least one tunnel is up."""
        self._slots = 0
        self._tg: asyncio.TaskGroup | None = None
        self._runners: list[web.AppRunner] = []
        self._stopping = False
        self._extra_allow = Allowlist.parse(settings.allow)
        self.credentials = CredentialsWatcher(
            CredentialFiles.of(settings.ca_file, settings.cert_file, settings.key_file),
            self._client_context,
            role="agent",
            on_change=self._credentials_changed,
        )
        self._generation = 0
        """Bumped when this agent's own certificate changes: tunnels of an older one rotate."""
        self._rotate = asyncio.Event()
        """Set (and replaced) at each generation: wakes the slots up to rotate."""
        self._draining: set[Session] = set()
        """Tunnels replaced by a rotation, draining."""
        self.allowlist = self._build_allowlist()
        self.store.subscribe(lambda _model: self._refresh_allowlist())
        m = self.metrics
        m.streams.set_function(
            lambda: (
                sum(len(t.session.streams) for t in self._up() if t.session is not None)
                + sum(len(d.streams) for d in self._draining)
            )
        )
        m.tunnels_up.set_function(lambda: len(self._up()))
        m.tunnels_wanted.set_function(lambda: self._wanted())
        self.ports: dict[str, int] = {}

    @property
    def session(self) -> Session | None:
        """One tunnel that is up (None: none is)."""
        up = self._up()
        return up[0].session if up else None

    def _up(self) -> list[Tunnel]:
        return [
            t
            for t in self.tunnels.values()
            if t.state == "up" and t.session is not None and not t.session.closed
        ]

    def _wanted(self) -> int:
        if self.settings.discover_servers:
            return sum(1 for t in self.tunnels.values() if not t.retired)
        return self.settings.slots

    def _build_allowlist(self) -> Allowlist:
        return gateway_allowlist(
            self.store.model,
            self.settings.node_name,
            self.settings.metrics_ports,
            self._extra_allow,
            pods=self.settings.allow_pods,
        )

    def _refresh_allowlist(self) -> None:
        self.allowlist = self._build_allowlist()
        log.info("allowlist updated", extra=kv(entries=len(self.allowlist)))

    def _tally(self) -> str:
        return f"{len(self._up())}/{self._wanted()}"

    def _ready(self) -> tuple[bool, str]:
        """Ready while at least one tunnel is up: any server can then reach this node."""
        return bool(self._up()), f"tunnels up {self._tally()}"

    async def run(self) -> None:
        """Serve until cancelled.

        The parts (model source, metrics listener, key publisher, L3 reconciler, the tunnels'
        dial loops) start in one task group: when one fails, at start or later, those started
        are stopped and waited for, and the error is raised alone when it is ours (a taken
        ``--metrics-addr`` is one line naming the flag, see :mod:`ravenproxy.lifecycle`).
        """
        s = self.settings
        try:
            async with contextlib.AsyncExitStack() as stack:
                # With --cert-dir the files exist once the first certificate is issued.
                requester = await self._certificates(stack)
                self._show_expiry(self.credentials.load())
                if s.inventory or s.kube_model:
                    await stack.enter_async_context(
                        model_source(
                            self.store,
                            inventory=s.inventory,
                            kube=s.kube_model,
                            kubeconfig=s.kubeconfig,
                        )
                    )
                publisher = None
                if s.kube_model and s.l3 is not None and s.l3.vpn_driver == "wireguard":
                    from ravenproxy.kube.client import new_api_client
                    from ravenproxy.l3.publish import KeyPublisher

                    api = await new_api_client(Path(s.kubeconfig) if s.kubeconfig else None)
                    stack.push_async_callback(api.close)
                    publisher = KeyPublisher(self.store, api, s.node_name, s.l3)
                async with parts() as tg:
                    self._tg = tg
                    # Listeners bind before any loop dials out: a taken address then fails
                    # the start without cutting a TLS handshake short (uvloop logs that).
                    await self._start_metrics()
                    tg.create_task(self.credentials.run(), name="agent-cert-reload")
                    if requester is not None:
                        tg.create_task(requester.run(), name="agent-cert-rotate")
                    self._start_parts(tg, publisher)
        finally:
            self._tg = None
            for runner in self._runners:
                await runner.cleanup()
            self._runners.clear()

    # -- certificates ---------------------------------------------------------------------------
    def _client_context(self, creds: Credentials) -> ssl.SSLContext:
        return tls.client_context_for(
            creds, server_hostname_check=self.settings.server_hostname_check
        )

    def _show_expiry(self, creds: Credentials) -> None:
        self.metrics.cert_expiry.labels(role="agent").set(creds.not_after.timestamp())
        self.metrics.cert_expiry.labels(role="ca").set(creds.ca_not_after.timestamp())

    def _credentials_changed(self, old: Credentials, new: Credentials) -> None:
        self._show_expiry(new)
        if old.leaf_fingerprint == new.leaf_fingerprint:
            return  # only the CA bundle changed: new dials trust it, tunnels up stay
        self._generation += 1
        log.info(
            "certificate rotated",
            extra=kv(
                node=self.settings.node_name,
                old_serial=old.serial,
                new_serial=new.serial,
                not_after=new.not_after.isoformat(),
                tunnels=len(self._up()),
            ),
        )
        rotate, self._rotate = self._rotate, asyncio.Event()
        rotate.set()

    async def _certificates(self, stack: contextlib.AsyncExitStack) -> CertificateRequester | None:
        """``--cert-dir``: until the directory holds this node's certificate (requested from
        Kubernetes if it does not); the requester then keeps it fresh (None: files given)."""
        s = self.settings
        if s.cert_dir is None:
            return None
        from ravenproxy.kube.certificates import RequestSettings, kept_certificates

        request = RequestSettings(
            role="agent",
            node=s.node_name,
            cert_dir=Path(s.cert_dir),
            lifetime=s.cert_lifetime,
            follow_ca_bundle=s.follows_ca_bundle,
        )
        return await stack.enter_async_context(kept_certificates(request, s.kubeconfig))

    def _start_parts(self, tg: asyncio.TaskGroup, publisher: KeyPublisher | None) -> None:
        s = self.settings
        if publisher is not None:
            # Remote gateways can only reach this one once its public key is in the Gateway.
            tg.create_task(publisher.run(), name="agent-wg-key-publish")
        if s.l3 is not None:
            from ravenproxy.l3.driver import Reconciler

            # The route driver reconciles on its own schedule: a tunnel that is down (or a
            # server that is away) never stops the L3 data path from being kept right.
            reconciler = Reconciler(self.store, s.node_name, s.l3)
            tg.create_task(reconciler.run(), name="agent-l3-reconcile")
        if not len(self.allowlist):
            log.warning(
                "the allowlist is empty: every stream will be refused", extra=kv(node=s.node_name)
            )
        if s.discover_servers:
            tg.create_task(self._follow_model(), name="agent-discover-servers")
        else:
            for _ in range(s.slots):
                self._add_slot(s.server_urls[0], discovered=False)

    async def _start_metrics(self) -> None:
        """Bind ``--metrics-addr`` (/metrics, /healthz, /readyz) and ``--health-addr`` (/healthz
        and /readyz only); cleaned up when :meth:`run` ends. aiohttp's server is imported here,
        only when one of them is given (an agent without them stays small)."""
        s = self.settings
        if s.metrics_addr is None and s.health_addr is None:
            return
        from ravenproxy.metrics_http import health_app, metrics_app, start_app

        addr = s.metrics_addr
        if addr is not None:
            async with listening("--metrics-addr", addr):
                runner, port = await start_app(
                    metrics_app(self.metrics.registry, self._ready), addr.host, addr.port
                )
            self._runners.append(runner)
            self.ports["metrics"] = port
        addr = s.health_addr
        if addr is not None:
            async with listening("--health-addr", addr):
                runner, port = await start_app(health_app(self._ready), addr.host, addr.port)
            self._runners.append(runner)
            self.ports["health"] = port

    # -- slots --------------------------------------------------------------------------------
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
        for other in self._up():
            if other is not tunnel and other.server_id == server_id:
                return other
        return None

    def _set_state(self, tunnel: Tunnel, state: str, **fields: object) -> None:
        """One log line per tunnel state change, naming the server and its address."""
        tunnel.state = state
        up = state == "up"
        if up:
            self.connected.set()
        elif not self._up():
            self.connected.clear()
        self.metrics.connected.set(1 if self._up() else 0)
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
                tunnels=self._tally(),
                **fields,
            ),
        )

    async def _connect(self, address: str) -> ClientConnection:
        """One WebSocket dial with the current certificate."""
        s = self.settings
        return await connect(
            address,
            ssl=self.credentials.contexts,
            open_timeout=10,
            proxy=None,
            user_agent_header=f"ravenproxy-agent/{s.node_name}",
            logger=logging.getLogger("ravenproxy.agent.websocket"),
            **websocket_options(s.session.wire, server_side=False),
        )

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
                self._dial_failed(tunnel, describe_connect_error(exc), delay)
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
                self._dial_failed(tunnel, outcome, delay)
            tunnel.session = None
            await asyncio.sleep(delay)
        if tunnel.state in ("up", "draining"):
            self._set_state(tunnel, "down")
        self._forget(tunnel)

    def _dial_failed(self, tunnel: Tunnel, reason: str, delay: float) -> None:
        """Log a failed dial: one WARNING per outage of a slot (again when the reason changes,
        and every :data:`REWARN_AFTER` seconds), the retries in between at DEBUG, so a fleet
        whose server restarts does not write a line per agent per retry; the metrics count
        every failure, and the slot's ``tunnel up`` line says how many attempts it took."""
        now = asyncio.get_running_loop().time()
        tunnel.failures += 1
        if tunnel.down_since is None:
            tunnel.down_since = now
        if reason == tunnel.warned and now - tunnel.warned_at < REWARN_AFTER:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "still cannot reach the server, retrying",
                    extra=kv(
                        address=tunnel.address,
                        slot=tunnel.slot,
                        reason=reason,
                        attempts=tunnel.failures,
                        retry_in=f"{delay:.2f}s",
                    ),
                )
            return
        tunnel.warned, tunnel.warned_at = reason, now
        log.warning(
            "cannot reach the server, retrying",
            extra=kv(
                address=tunnel.address,
                slot=tunnel.slot,
                reason=reason,
                attempts=tunnel.failures,
                down_for=f"{now - tunnel.down_since:.1f}s",
                retry_in=f"{delay:.2f}s",
            ),
        )

    def _session(self, tunnel: Tunnel, ws: ClientConnection) -> tuple[Session, asyncio.Task[None]]:
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
        self, tunnel: Tunnel, ws: ClientConnection, generation: int
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

    def _stream_closed(self, stream: TunnelStream) -> None:
        self.metrics.bytes.labels(direction="up").inc(stream.bytes_out)
        self.metrics.bytes.labels(direction="down").inc(stream.bytes_in)

    async def _serve(self, stream: TunnelStream) -> None:
        target = stream.target
        try:
            # Spliced by callbacks, not relayed by two tasks: a small request and its answer
            # cost no task wake-up of their own on the agent.
            splice, _ = await dial_protocol(
                target.host, target.port, self.allowlist, self.settings.dial_timeout, Splice
            )
        except DialError as exc:
            self.metrics.dials.labels(result=exc.code.name.lower()).inc()
            log.info(
                "stream refused",
                extra=kv(
                    stream=stream.id,
                    target=f"{target.host}:{target.port}",
                    node=target.node,
                    code=exc.code.name,
                    reason=exc.message,
                ),
            )
            stream.reject(exc.code, exc.message)
            return
        self.metrics.dials.labels(result="ok").inc()
        stream.accept()
        splice.start(stream)
        await splice.wait()


async def run_agent(settings: AgentSettings) -> None:
    agent = Agent(settings)
    await agent.run()


__all__ = ["Agent", "run_agent"]
