"""The DNS answering logic, sans-I/O: wire bytes in, wire bytes (or nothing) out.

Parsed and built with dnspython; :class:`ravenproxy.controller.dns.DNSServer` is the asyncio
adapter that feeds it. The map is swapped whole on :meth:`Answerer.update`, so a query sees
either the old map or the new one, never a mix.

Answers: A/AAAA (and both for ANY) with a short TTL, authoritative; NXDOMAIN for unknown names;
NOERROR with no answer for a known name without a record of the asked type; REFUSED for classes
other than IN; NOTIMP for opcodes other than QUERY; FORMERR for anything that does not parse.
Nothing a client sends may crash the server.
"""

from __future__ import annotations

import ipaddress
import logging
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset

from ravenproxy.log import kv

log = logging.getLogger(__name__)

DEFAULT_TTL = 5
_HEADER = struct.Struct("!HHHHHH")
UDP_PLAIN_MAX = 512
UDP_EDNS_MAX = 1232  # the DNS flag day 2020 size: no IP fragmentation on any sane path


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

    def respond(self, wire: bytes, max_size: int = UDP_PLAIN_MAX) -> bytes | None:
        """The reply to ``wire``, at most ``max_size`` bytes (0: the UDP rule, 512 or the
        client's EDNS size up to 1232); None means send nothing."""
        try:
            query = dns.message.from_wire(wire)
        except Exception:  # untrusted bytes: any parse failure is the client's FORMERR
            return _formerr_header(wire)
        if query.flags & dns.flags.QR:
            return None
        response = dns.message.make_response(query, our_payload=UDP_EDNS_MAX)
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
            max_size = UDP_PLAIN_MAX
            if query.edns >= 0:
                max_size = max(UDP_PLAIN_MAX, min(query.payload, UDP_EDNS_MAX))
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
