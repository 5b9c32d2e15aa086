"""Connected agents, keyed by the node name their certificate proves; the agent per target."""

from __future__ import annotations

import itertools
import logging

from ravenproxy.log import kv
from ravenproxy.model.snapshot import Model
from ravenproxy.transport.session import Session

log = logging.getLogger(__name__)


class AgentRegistry:
    def __init__(self) -> None:
        self._by_node: dict[str, list[Session]] = {}
        self._rr = itertools.count()
        self._count = 0
        """Sessions held (``len``, read at every agent's coming and going: kept, not summed,
        so 1 000 agents returning at once cost no 1 000 x 1 000 walk)."""
        self.generation = 0
        """Counts the agents' comings and goings, and every change that ends a registered
        session's :meth:`live` (a GOAWAY either way, its end: the connection's ``on_draining``,
        :mod:`ravenproxy.wire.drain`): a route decided at the same generation (on the same
        model) would be decided the same way, its agent still live, without asking; once it
        moved, the router asks once whether the route's agent is still a candidate
        (``Router.route_again``: another agent's drain leaves a client where it is)."""

    def add(self, node: str, session: Session) -> None:
        self.generation += 1
        session.conn.on_draining = self._moved
        self._by_node.setdefault(node, []).append(session)
        self._count += 1
        log.info("agent registered", extra=kv(node=node, connections=len(self._by_node[node])))

    def _moved(self) -> None:
        self.generation += 1

    def remove(self, node: str, session: Session) -> None:
        self.generation += 1
        sessions = self._by_node.get(node, [])
        if session in sessions:
            sessions.remove(session)
            self._count -= 1
        if not sessions:
            self._by_node.pop(node, None)
        log.info("agent unregistered", extra=kv(node=node, reason=session.close_reason))

    def connected_nodes(self) -> frozenset[str]:
        return frozenset(self._by_node)

    def sessions(self) -> list[Session]:
        return [s for sessions in self._by_node.values() for s in sessions]

    def __len__(self) -> int:
        return self._count

    def live(self, session: Session) -> bool:
        """The session may carry new streams (open, no GOAWAY either way). A registered
        session stops being live only by a change that moves :attr:`generation`."""
        conn = session.conn
        return not session.closed and conn.goaway_received is None and conn.goaway_sent is None

    def _live(self, node: str) -> list[Session]:
        return [s for s in self._by_node.get(node, ()) if self.live(s)]

    def candidates(self, model: Model, target: str) -> list[Session]:
        """Agents allowed to serve ``target``, best first: the node's own agent; else the
        active proxy endpoints of its gateway; else any agent of that gateway. Who may serve a
        node is ``Model.peers_of`` (the rule the agent's allowlist uses too); the proxy
        endpoints only order those peers."""
        own = self._live(target)
        if own:
            return own
        peers = [n.name for n in model.peers_of(target) if n.name != target]
        node = model.node(target)
        if not peers or node is None or node.gateway is None:
            return []
        proxies = [s for n in model.proxy_nodes(node.gateway) if n in peers for s in self._live(n)]
        if proxies:
            return proxies
        return [s for n in peers for s in self._live(n)]

    def pick(self, model: Model, target: str) -> Session | None:
        """One agent for ``target``: the least loaded candidate, ties spread round-robin."""
        candidates = self.candidates(model, target)
        if not candidates:
            return None
        least = min(s.conn.open_streams for s in candidates)
        best = [s for s in candidates if s.conn.open_streams == least]
        return best[next(self._rr) % len(best)]
