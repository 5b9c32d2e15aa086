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
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import struct
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
from ravenproxy.errors import RavenProxyError
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


class DNSServerError(RavenProxyError):
    """The DNS server cannot bind its sockets."""


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
    """A/AAAA for node names over UDP and TCP on one port.

    ``idle_timeout`` closes a TCP connection that sends nothing for that long, and at most
    ``max_tcp_clients`` connections are served at once, so idle clients cannot pin the server.
    """

    def __init__(
        self,
        records: Mapping[str, Sequence[str]] | None = None,
        suffix: str | None = None,
        ttl: int = DEFAULT_TTL,
        idle_timeout: float = 10.0,
        max_tcp_clients: int = 256,
    ) -> None:
        self.answerer = Answerer(records, suffix, ttl)
        self.idle_timeout = idle_timeout
        self.max_tcp_clients = max_tcp_clients
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._port = 0

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
                raise DNSServerError(f"cannot bind UDP {host}:{port}: {exc.strerror}") from exc
            bound = udp.get_extra_info("sockname")[1]
            try:
                self._tcp = await asyncio.start_server(self._serve_tcp, host, bound)
            except OSError as exc:
                udp.close()
                # With port 0 the UDP port may be taken for TCP by someone else: try another.
                if exc.errno == errno.EADDRINUSE and attempt + 1 < attempts:
                    continue
                raise DNSServerError(f"cannot bind TCP {host}:{bound}: {exc.strerror}") from exc
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
        clients = list(self._clients)
        for task in clients:
            task.cancel()
        if clients:
            await asyncio.gather(*clients, return_exceptions=True)
        if tcp is not None:
            await tcp.wait_closed()

    async def __aenter__(self) -> DNSServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._clients) >= self.max_tcp_clients:
            writer.close()
            return
        self._clients.add(task)
        try:
            while True:
                try:
                    async with asyncio.timeout(self.idle_timeout):
                        (length,) = _LEN.unpack(await reader.readexactly(_LEN.size))
                        data = await reader.readexactly(length)
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                try:
                    reply = self.answerer.respond(data, _TCP_MAX)
                except Exception:  # as for UDP: log, drop this client, keep serving others
                    log.exception("dns: failed to answer a TCP query")
                    return
                if reply is None:
                    return
                writer.write(_LEN.pack(len(reply)) + reply)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            self._clients.discard(task)
            writer.close()


async def serve_model_dns(
    store: ModelStore,
    listen: tuple[str, int],
    suffix: str | None = None,
    ttl: int = DEFAULT_TTL,
    cluster_ip: str | None = None,
    started: Callable[[DNSServer], None] | None = None,
) -> None:
    """Serve the DNS map of whatever model ``store`` holds until cancelled, following updates.

    Source-agnostic: the YAML inventory watcher or the Kubernetes source feeds ``store``.
    ``started`` is called with the bound server (tests read its port from it).
    """

    def records(model: Model) -> dict[str, list[str]]:
        return dns_map(model, cluster_ip)

    server = DNSServer(records(store.model), suffix=suffix, ttl=ttl)
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
) -> None:
    """``ravenproxy dns --inventory FILE``: serve until cancelled, reloading the map when the
    inventory file changes (a broken edit keeps the last good map). Raises InventoryError when
    the file cannot be loaded at start, DNSServerError when the address cannot be bound."""
    store = ModelStore()
    watcher = InventoryWatcher(inventory, store, interval)
    await watcher.start()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(watcher.run(), name="dns-inventory-watcher")
        tg.create_task(
            serve_model_dns(store, listen, suffix, ttl, cluster_ip, started), name="dns-server"
        )
