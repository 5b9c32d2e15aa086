"""Embedded DNS server: node name → address, for clusters whose DNS cannot load the hosts map.

The answering logic (:class:`Answerer`) is sans-I/O: wire bytes in, wire bytes (or nothing) out,
parsed and built with dnspython. :class:`DNSServer` is the thin asyncio adapter around it: one UDP
``DatagramProtocol`` and one TCP server (RFC 1035 2-byte length framing) on the same port. The
map is swapped whole on :meth:`DNSServer.update`, so a query sees either the old map or the new
one, never a mix.

Answers: A/AAAA (and both for ANY) with a short TTL, authoritative; NXDOMAIN for unknown names;
NOERROR with no answer for a known name without a record of the asked type; REFUSED for classes
other than IN; NOTIMP for opcodes other than QUERY; FORMERR for anything that does not parse.
Nothing a client sends may crash the server.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import cast

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from ravenproxy.controller.dnsmap import dns_map
from ravenproxy.controller.settings import TCPLimits as TCPLimits  # re-exported: its users
from ravenproxy.errors import RavenProxyError
from ravenproxy.lifecycle import os_reason, parts
from ravenproxy.log import kv
from ravenproxy.model.inventory import InventoryWatcher
from ravenproxy.model.snapshot import Model
from ravenproxy.model.store import ModelStore

log = logging.getLogger(__name__)

DEFAULT_TTL = 5
_HEADER = struct.Struct("!HHHHHH")
_LEN = struct.Struct("!H")
_UDP_PLAIN_MAX = 512
_UDP_EDNS_MAX = 1232  # the DNS flag day 2020 size: no IP fragmentation on any sane path
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


@dataclass(frozen=True)
class _Entry:
    v4: tuple[str, ...]
    v6: tuple[str, ...]


def _table(records: Mapping[str, Sequence[str]]) -> Mapping[str, _Entry]:
    table: dict[str, list[list[str]]] = {}
    for raw_name, ips in records.items():
        name = raw_name.strip().rstrip(".").lower()
        if not name:
            continue
        v4, v6 = table.setdefault(name, [[], []])
        for ip in ips:
            try:
                addr = ipaddress.ip_address(ip)
            except ValueError:
                log.warning("dns: skipping a non-IP address", extra=kv(name=name, address=ip))
                continue
            bucket = v4 if addr.version == 4 else v6
            if str(addr) not in bucket:
                bucket.append(str(addr))
    return MappingProxyType({n: _Entry(tuple(a), tuple(b)) for n, (a, b) in table.items()})


def _formerr_header(wire: bytes) -> bytes | None:
    """A header-only FORMERR for bytes dnspython cannot parse; None when not even the header
    is there, or it is a response (answering responses invites reflection loops)."""
    if len(wire) < _HEADER.size:
        return None
    qid, flags = struct.unpack_from("!HH", wire)
    if flags & dns.flags.QR:
        return None
    opcode_bits = flags & 0x7800
    rd = flags & dns.flags.RD
    return _HEADER.pack(qid, dns.flags.QR | opcode_bits | rd | dns.rcode.FORMERR, 0, 0, 0, 0)


class Answerer:
    """Builds the reply to one query from the current map (sans-I/O)."""

    def __init__(
        self,
        records: Mapping[str, Sequence[str]] | None = None,
        suffix: str | None = None,
        ttl: int = DEFAULT_TTL,
    ) -> None:
        self.ttl = ttl
        self.suffix = suffix.strip().strip(".").lower() if suffix else None
        self._table = _table(records or {})

    def update(self, records: Mapping[str, Sequence[str]]) -> None:
        # Built aside and swapped with one assignment: a query never sees half a map.
        self._table = _table(records)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._table)

    def _lookup(self, qname: dns.name.Name) -> tuple[_Entry | None, bool]:
        """(entry, exists): exists is True for a known name and for the suffix zone apex."""
        text = qname.to_text(omit_final_dot=True).lower()
        entry = self._table.get(text)
        if entry is not None:
            return entry, True
        if self.suffix:
            if text == self.suffix:
                return None, True
            tail = "." + self.suffix
            if text.endswith(tail):
                entry = self._table.get(text[: -len(tail)])
                if entry is not None:
                    return entry, True
        return None, False

    def respond(self, wire: bytes, max_size: int = _UDP_PLAIN_MAX) -> bytes | None:
        """The reply to ``wire``, at most ``max_size`` bytes (0: the UDP rule, 512 or the
        client's EDNS size up to 1232); None means send nothing."""
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # untrusted bytes: any parse failure is the client's FORMERR
            return _formerr_header(wire)
        if query.flags & dns.flags.QR:
            return None
        response = dns.message.make_response(query, our_payload=_UDP_EDNS_MAX)
        response.flags |= dns.flags.AA
        if query.opcode() != dns.opcode.QUERY:
            response.flags &= ~dns.flags.AA
            response.set_rcode(dns.rcode.NOTIMP)
        elif len(query.question) != 1:
            response.flags &= ~dns.flags.AA
            response.set_rcode(dns.rcode.FORMERR)
        else:
            self._answer(query.question[0], response)
        if max_size == 0:
            max_size = _UDP_PLAIN_MAX
            if query.edns >= 0:
                max_size = max(_UDP_PLAIN_MAX, min(query.payload, _UDP_EDNS_MAX))
        try:
            return response.to_wire(max_size=max_size, prefer_truncation=True)
        except dns.exception.DNSException:
            log.debug("dns: reply does not fit even truncated", extra=kv(size=max_size))
            return None

    def _answer(self, question: dns.rrset.RRset, response: dns.message.Message) -> None:
        if question.rdclass != dns.rdataclass.IN:
            response.flags &= ~dns.flags.AA
            response.set_rcode(dns.rcode.REFUSED)
            return
        entry, exists = self._lookup(question.name)
        if not exists:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return
        if entry is None:
            return
        qtype = question.rdtype
        for rdtype, ips in ((dns.rdatatype.A, entry.v4), (dns.rdatatype.AAAA, entry.v6)):
            if ips and qtype in (rdtype, dns.rdatatype.ANY):
                # The question's own name object keeps the client's letter case (0x20 checks).
                rrset = dns.rrset.from_text_list(
                    question.name, self.ttl, dns.rdataclass.IN, rdtype, list(ips)
                )
                response.answer.append(rrset)


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


async def serve_model_dns(
    store: ModelStore,
    listen: tuple[str, int],
    suffix: str | None = None,
    ttl: int = DEFAULT_TTL,
    cluster_ip: str | None = None,
    started: Callable[[DNSServer], None] | None = None,
    limits: TCPLimits | None = None,
) -> None:
    """Serve the DNS map of whatever model ``store`` holds until cancelled, following updates.

    Source-agnostic: the YAML inventory watcher or the Kubernetes source feeds ``store``.
    ``started`` is called with the bound server (tests read its port from it).
    """

    def records(model: Model) -> dict[str, list[str]]:
        return dns_map(model, cluster_ip)

    server = DNSServer(records(store.model), suffix=suffix, ttl=ttl, limits=limits)
    store.subscribe(lambda model: server.update(records(model)))
    await server.start(*listen)
    try:
        if started is not None:
            started(server)
        await asyncio.Event().wait()
    finally:
        await server.close()


async def run_dns(
    inventory: Path,
    listen: tuple[str, int],
    suffix: str | None = None,
    ttl: int = DEFAULT_TTL,
    cluster_ip: str | None = None,
    interval: float = 1.0,
    started: Callable[[DNSServer], None] | None = None,
    limits: TCPLimits | None = None,
) -> None:
    """``ravenproxy dns --inventory FILE``: serve until cancelled, reloading the map when the
    inventory file changes (a broken edit keeps the last good map). Raises InventoryError when
    the file cannot be loaded at start, DNSServerError when the address cannot be bound."""
    store = ModelStore()
    watcher = InventoryWatcher(inventory, store, interval)
    await watcher.start()
    # One task failing with our own error (e.g. the port is taken) is that error, raised alone.
    async with parts() as tg:
        tg.create_task(watcher.run(), name="dns-inventory-watcher")
        tg.create_task(
            serve_model_dns(store, listen, suffix, ttl, cluster_ip, started, limits),
            name="dns-server",
        )
