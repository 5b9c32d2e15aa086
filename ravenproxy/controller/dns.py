"""Embedded DNS server: node name → address, for clusters whose DNS cannot load the hosts map.

:class:`DNSServer` is the thin asyncio adapter around the sans-I/O
:class:`~ravenproxy.controller.dnsanswer.Answerer`: one UDP ``DatagramProtocol`` and one TCP
server (RFC 1035 2-byte length framing) on the same port. What it answers from is fed by
:mod:`ravenproxy.controller.dnsfeed`.

TCP connections are a resource a client can hold without sending anything, so they are bounded
the way RFC 7766 §6.2 advises (:class:`TCPLimits`): each message, and the wait for it, must
complete within the idle timeout (a few seconds); one source address (an IPv6 /64) holds at most
a few connections; and when the server is full, the connection idle the longest is closed to make
room for a new client rather than turning the new one away.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import struct
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from ravenproxy.controller.dnsanswer import DEFAULT_TTL, Answerer
from ravenproxy.controller.settings import TCPLimits as TCPLimits  # re-exported: its users
from ravenproxy.errors import RavenProxyError
from ravenproxy.lifecycle import os_reason
from ravenproxy.log import kv

log = logging.getLogger(__name__)

_LEN = struct.Struct("!H")
_TCP_MAX = 65535
_REFUSAL_LOG_EVERY = 1.0  # seconds between two refusal lines of the same kind


class DNSServerError(RavenProxyError):
    """The DNS server cannot bind its sockets."""


def _source_key(peer: object) -> str:
    """The address a per-source cap counts by: the IP, or its /64 for IPv6 (one host's share)."""
    host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
    try:
        addr = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


@dataclass(eq=False)
class _TCPClient:
    source: str
    writer: asyncio.StreamWriter
    task: asyncio.Task[None]
    idle_since: float | None = None  # loop time the wait for the next query began; None: busy


class _Throttle:
    """At most one log line per ``every`` seconds per message. Events in between are counted and
    summed up in one trailing line (``count``: events it stands for; the fields are the last
    event's), so a flood of refusals costs a line a second, and its size is still on record."""

    def __init__(self, every: float = _REFUSAL_LOG_EVERY) -> None:
        self.every = every
        self._last: dict[str, float] = {}
        self._pending: Counter[str] = Counter()
        self._fields: dict[str, dict[str, object]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def warning(self, message: str, **fields: object) -> None:
        self._pending[message] += 1
        self._fields[message] = fields
        wait = self._last.get(message, -self.every) + self.every - time.monotonic()
        if wait <= 0:
            self._emit(message)
        elif message not in self._timers:
            loop = asyncio.get_running_loop()
            self._timers[message] = loop.call_later(wait, self._emit, message)

    def _emit(self, message: str) -> None:
        self._timers.pop(message, None)
        count = self._pending.pop(message, 0)
        if count:
            self._last[message] = time.monotonic()
            log.warning(message, extra=kv(**self._fields.pop(message), count=count))

    def flush(self) -> None:
        for message in list(self._timers):
            self._timers[message].cancel()
            self._emit(message)


class _UDPProtocol(asyncio.DatagramProtocol):
    def __init__(self, answerer: Answerer) -> None:
        self._answerer = answerer
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # The selector loop's datagram transport does not subclass DatagramTransport.
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        try:
            reply = self._answerer.respond(data, 0)
        except Exception:  # one bad datagram must not stop the server; say what it was
            log.exception("dns: failed to answer a UDP query", extra=kv(peer=addr[0]))
            return
        if reply is not None and self._transport is not None:
            self._transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable from a client that went away; nothing to do.
        log.debug("dns: UDP error", extra=kv(error=exc))


class DNSServer:
    """A/AAAA for node names over UDP and TCP on one port; TCP clients bounded by ``limits``.

    Counters (read by tests, totals in the refusal log lines): ``tcp_refused[reason]`` for
    ``per-source-cap`` and ``total-cap``, ``tcp_evicted`` (idle connections closed to make room),
    ``tcp_timed_out`` (connections closed by the idle timeout).
    """

    def __init__(
        self,
        records: Mapping[str, Sequence[str]] | None = None,
        suffix: str | None = None,
        ttl: int = DEFAULT_TTL,
        limits: TCPLimits | None = None,
    ) -> None:
        self.answerer = Answerer(records, suffix, ttl)
        self.limits = limits or TCPLimits()
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._clients: dict[asyncio.Task[None], _TCPClient] = {}
        self._per_source: Counter[str] = Counter()
        self._port = 0
        self.tcp_refused: Counter[str] = Counter()
        self.tcp_evicted = 0
        self.tcp_timed_out = 0
        self._throttle = _Throttle()

    def update(self, records: Mapping[str, Sequence[str]]) -> None:
        """Replace the whole map; the next query is answered from it."""
        self.answerer.update(records)
        log.debug("dns: map updated", extra=kv(names=len(self.answerer.names)))

    @property
    def port(self) -> int:
        return self._port

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Bind UDP and TCP on ``host:port`` (an IP address). Port 0 picks a port free for both
        protocols."""
        if self._udp is not None:
            raise DNSServerError("DNS server already started")
        loop = asyncio.get_running_loop()
        attempts = 20 if port == 0 else 1
        for attempt in range(attempts):
            try:
                udp, _ = await loop.create_datagram_endpoint(
                    lambda: _UDPProtocol(self.answerer), local_addr=(host, port)
                )
            except OSError as exc:
                raise DNSServerError(f"cannot bind UDP {host}:{port}: {os_reason(exc)}") from exc
            bound = udp.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(self._serve_tcp, host, bound)
            except OSError as exc:
                udp.close()
                # With port 0 the UDP port may be taken for TCP by someone else: try another.
                if exc.errno == errno.EADDRINUSE and attempt + 1 < attempts:
                    continue
                raise DNSServerError(f"cannot bind TCP {host}:{bound}: {os_reason(exc)}") from exc
            self._udp = udp
            self._port = bound
            log.info("dns: serving", extra=kv(host=host, port=bound))
            return

    async def close(self) -> None:
        """Stop answering: close both sockets and every TCP connection, and wait for them."""
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        tcp, self._tcp = self._tcp, None
        if tcp is not None:
            tcp.close()
        tasks = list(self._clients)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._throttle.flush()
        if tcp is not None:
            await tcp.wait_closed()

    async def __aenter__(self) -> DNSServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _admit(self, source: str, writer: asyncio.StreamWriter) -> _TCPClient | None:
        """Register a new connection, or None (after logging why) when a cap refuses it."""
        limits = self.limits
        reason = None
        if self._per_source[source] >= limits.max_clients_per_source:
            reason = "per-source-cap"
        elif len(self._clients) >= limits.max_clients and not self._evict_longest_idle():
            reason = "total-cap"
        if reason is not None:
            self.tcp_refused[reason] += 1
            self._throttle.warning(
                "dns: TCP connection refused",
                reason=reason,
                source=source,
                total=self.tcp_refused[reason],
            )
            return None
        task = asyncio.current_task()
        assert task is not None
        client = _TCPClient(source, writer, task)
        self._clients[task] = client
        self._per_source[source] += 1
        return client

    def _forget(self, client: _TCPClient) -> None:
        if self._clients.pop(client.task, None) is not None:
            self._per_source[client.source] -= 1
            if self._per_source[client.source] <= 0:
                del self._per_source[client.source]

    def _evict_longest_idle(self) -> bool:
        """Close the connection that has waited longest for a query (RFC 7766 §6.2.3: under
        pressure, idle connections go first); False when every connection is busy."""
        idle = [c for c in self._clients.values() if c.idle_since is not None]
        if not idle:
            return False
        victim = min(idle, key=lambda c: c.idle_since or 0.0)
        self._forget(victim)  # its slot is free now, before its task gets to run again
        victim.writer.close()
        victim.task.cancel()
        self.tcp_evicted += 1
        self._throttle.warning(
            "dns: full, closed the longest-idle TCP connection",
            source=victim.source,
            total=self.tcp_evicted,
        )
        return True

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        source = _source_key(writer.get_extra_info("peername"))
        client = self._admit(source, writer)
        if client is None:
            writer.close()
            return
        loop = asyncio.get_running_loop()
        timeout = self.limits.idle_timeout
        try:
            while True:
                client.idle_since = loop.time()
                try:
                    # One deadline for the whole query: a byte-a-second trickle gains nothing.
                    async with asyncio.timeout(timeout):
                        prefix = await reader.readexactly(_LEN.size)
                        client.idle_since = None
                        data = await reader.readexactly(_LEN.unpack(prefix)[0])
                except TimeoutError:
                    self.tcp_timed_out += 1
                    log.debug("dns: TCP client idle, closed", extra=kv(source=source))
                    return
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                try:
                    reply = self.answerer.respond(data, _TCP_MAX)
                except Exception:  # as for UDP: log, drop this client, keep serving others
                    log.exception("dns: failed to answer a TCP query")
                    return
                if reply is None:
                    return
                writer.write(_LEN.pack(len(reply)) + reply)
                try:
                    async with asyncio.timeout(timeout):  # a client that never reads
                        await writer.drain()
                except TimeoutError:
                    self.tcp_timed_out += 1
                    return
        except ConnectionError:
            return
        finally:
            self._forget(client)
            writer.close()
