"""Thin adapter: strongSwan's charon over its VICI socket (the ``vici`` package, strongSwan's
own client).

Reads our connections and SAs (``list-conns``, ``list-sas``) and applies connection ops:
``load-shared`` + ``load-conn`` (+ ``initiate`` on the side that dials), ``terminate`` +
``unload-conn`` on delete. The VICI client is blocking: each call runs in a worker thread.
Charon is not ours to start; it runs beside the agent with the ``vici`` plugin.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import vici
from pyroute2 import AsyncIPRoute
from vici.exception import CommandException, SessionException

from ravenproxy.l3 import ipsec
from ravenproxy.l3.errors import ApplyError
from ravenproxy.l3.plan import Op
from ravenproxy.l3.settings import L3Settings
from ravenproxy.l3.state import NodeState, VpnConnection
from ravenproxy.log import kv

log = logging.getLogger(__name__)

T = TypeVar("T")
SOCKET_TIMEOUT = 15.0


def _session(path: str) -> tuple[vici.Session, socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(SOCKET_TIMEOUT)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ApplyError(f"vici {path}", f"charon not reachable: {exc.strerror or exc}") from None
    return vici.Session(sock), sock


async def _call(settings: L3Settings, fn: Callable[[vici.Session], T]) -> T:
    def run() -> T:
        session, sock = _session(settings.vici_path)
        try:
            return fn(session)
        except (CommandException, SessionException, OSError) as exc:
            raise ApplyError(f"vici {settings.vici_path}", str(exc)) from None
        finally:
            sock.close()

    return await asyncio.to_thread(run)


def charon_available(settings: L3Settings) -> bool:
    return os.path.exists(settings.vici_path)


async def query(settings: L3Settings) -> tuple[list[Any], list[Any]]:
    """Raw ``list-conns`` and ``list-sas`` answers."""

    def both(s: vici.Session) -> tuple[list[Any], list[Any]]:
        return list(s.list_conns()), list(s.list_sas())

    return await _call(settings, both)


async def charon_routes(settings: L3Settings, netns: str | None) -> set[str] | None:
    """Destinations in charon's routing table; None when charon installs no routes."""
    table = settings.ipsec_route_table
    if not table:
        return None
    out: set[str] = set()
    async with AsyncIPRoute(netns=netns) as ipr:
        async for msg in await ipr.route("dump", family=socket.AF_INET, table=table):
            if msg.get("RTA_TABLE", msg["table"]) == table and msg.get("RTA_DST"):
                out.add(f"{msg.get('RTA_DST')}/{msg['dst_len']}")
    return out


async def read_actual(
    settings: L3Settings, desired: Sequence[VpnConnection], netns: str | None = None
) -> NodeState:
    """Our IPsec connections as charon has them; nothing when charon is not running and
    none is wanted (non-gateway nodes)."""
    if not desired and not charon_available(settings):
        return NodeState()
    conns, sas = await query(settings)
    ours = [c for c in desired if c.kind == "ipsec"]
    routed = await charon_routes(settings, netns)
    return NodeState.of(ipsec.actual_connections(conns, sas, ours, settings.vpn_port, routed))


async def apply(ops: Sequence[Op], settings: L3Settings) -> None:
    """Apply the connection ops, in order, in one VICI session."""
    mine = [op for op in ops if isinstance(op.obj, VpnConnection)]
    if not mine:
        return
    key = ""
    if any(op.action != "del" for op in mine):
        key = ipsec.read_psk(settings.psk_file)  # refuse before touching charon

    def run(s: vici.Session) -> None:
        if key:
            s.load_shared(ipsec.shared_key_message(key))
        for op in mine:
            conn = op.obj
            assert isinstance(conn, VpnConnection)
            log.info("vpn", extra=kv(op=op.action, conn=conn.name, driver="strongswan"))
            if op.action == "del":
                _terminate(s, conn.name)
                s.unload_conn({"name": conn.name})
                continue
            old = op.old[0] if op.old else None
            sa_down = isinstance(old, VpnConnection) and old.problem == ipsec.PROBLEM_SA_DOWN
            in_place = isinstance(old, VpnConnection) and old.problem == ipsec.PROBLEM_ROUTE
            if op.action == "replace" and not (sa_down or in_place):
                # The configuration changed: SAs negotiated under the old one keep the old
                # selectors until closed. A responder's peer dials again on the close (its
                # close_action); the initiator's start_action runs on the load below.
                _terminate(s, conn.name)
            s.load_conn(ipsec.conn_message(conn, settings.vpn_port))
            if in_place:
                # charon believes its route is in place and would never put it back: close
                # the SA (its routes go with it) and negotiate it again. The whole IKE SA,
                # and waiting for the close: a new child negotiated while the old one is
                # still closing would find the old route record and install nothing. The
                # side that dials does so below; the other side's peer restarts (its
                # close_action).
                _terminate(s, conn.name, wait_ms=5000)
                sa_down = True
            if sa_down and conn.initiator:
                # Loaded as desired but its SA is gone (terminated by hand, peer lost):
                # loading did not start it, so dial now. -1: do not wait; the next
                # reconcile sees whether it came up.
                child = ipsec.child_name(conn, settings.vpn_port)
                list(s.initiate({"child": child, "ike": conn.name, "timeout": "-1"}))

    await _call(settings, run)


def _terminate(s: vici.Session, name: str, wait_ms: int = -1) -> None:
    """Close the connection's IKE SA; ``wait_ms=-1``: do not wait for the peer's answer."""
    try:
        list(s.terminate({"ike": name, "force": "yes", "timeout": str(wait_ms)}))
    except CommandException as exc:
        # "no matching SAs to terminate found": nothing was up, which is the goal.
        log.debug("terminate", extra=kv(conn=name, result=str(exc)))


async def forget_key(settings: L3Settings) -> None:
    """Cleanup: unload the pre-shared key (connections are unloaded by their ops)."""
    if not charon_available(settings):
        return

    def run(s: vici.Session) -> None:
        try:
            s.unload_shared({"id": ipsec.PSK_ID})
        except CommandException:
            pass  # not loaded

    await _call(settings, run)
