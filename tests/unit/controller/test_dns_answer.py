"""The DNS answering logic on wire bytes alone (no sockets)."""

from __future__ import annotations

import struct

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
from hypothesis import given, settings
from hypothesis import strategies as st

from ravenproxy.controller.dnsanswer import Answerer
from tests.helpers import examples

RECORDS = {"edge-1": ["10.0.0.1", "fd00::1"], "Edge-2.": ["10.0.0.2"], "v6only": ["fd00::6"]}


def ask(
    a: Answerer, name: str, rdtype: str = "A", rdclass: str = "IN", **kw: object
) -> dns.message.Message:
    query = dns.message.make_query(name, rdtype, rdclass, **kw)  # type: ignore[arg-type]
    wire = a.respond(query.to_wire())
    assert wire is not None
    reply = dns.message.from_wire(wire)
    assert reply.id == query.id
    return reply


def addresses(reply: dns.message.Message) -> list[str]:
    return sorted(r.to_text() for rrset in reply.answer for r in rrset)


def test_a_and_aaaa_and_any() -> None:
    a = Answerer(RECORDS)
    reply = ask(a, "edge-1", "A")
    assert reply.rcode() == dns.rcode.NOERROR
    assert reply.flags & dns.flags.AA
    assert addresses(reply) == ["10.0.0.1"]
    assert reply.answer[0].ttl == 5
    assert addresses(ask(a, "edge-1", "AAAA")) == ["fd00::1"]
    assert addresses(ask(a, "edge-1", "ANY")) == ["10.0.0.1", "fd00::1"]


def test_names_are_case_insensitive_and_the_answer_keeps_the_asked_case() -> None:
    a = Answerer(RECORDS)
    reply = ask(a, "EdGe-2", "A")
    assert addresses(reply) == ["10.0.0.2"]
    assert reply.answer[0].name.to_text() == "EdGe-2."


def test_known_name_without_that_type_is_nodata() -> None:
    a = Answerer(RECORDS)
    for name, rdtype in (("v6only", "A"), ("edge-2", "AAAA"), ("edge-1", "MX"), ("edge-1", "TXT")):
        reply = ask(a, name, rdtype)
        assert reply.rcode() == dns.rcode.NOERROR
        assert reply.answer == []


def test_unknown_name_is_nxdomain() -> None:
    reply = ask(Answerer(RECORDS), "edge-9")
    assert reply.rcode() == dns.rcode.NXDOMAIN
    assert reply.answer == []


def test_suffix_and_bare_names_both_answer() -> None:
    a = Answerer(RECORDS, suffix=".Tunnel.Local.")
    assert addresses(ask(a, "edge-1.tunnel.local")) == ["10.0.0.1"]
    assert addresses(ask(a, "edge-1")) == ["10.0.0.1"]
    assert ask(a, "edge-9.tunnel.local").rcode() == dns.rcode.NXDOMAIN
    assert ask(a, "edge-1.other.local").rcode() == dns.rcode.NXDOMAIN
    apex = ask(a, "tunnel.local")
    assert apex.rcode() == dns.rcode.NOERROR and apex.answer == []


def test_dotted_node_names_match_in_full() -> None:
    a = Answerer({"node.example.com": ["10.0.0.3"]}, suffix="example.com")
    assert addresses(ask(a, "node.example.com")) == ["10.0.0.3"]
    assert addresses(ask(a, "node.example.com.example.com")) == ["10.0.0.3"]


def test_update_swaps_the_map() -> None:
    a = Answerer(RECORDS)
    a.update({"edge-1": ["10.9.9.9"], "bad": ["not-an-ip"]})
    assert addresses(ask(a, "edge-1")) == ["10.9.9.9"]
    assert ask(a, "edge-2").rcode() == dns.rcode.NXDOMAIN
    assert ask(a, "bad").answer == []


def test_custom_ttl() -> None:
    assert ask(Answerer(RECORDS, ttl=1), "edge-1").answer[0].ttl == 1


def test_non_in_class_is_refused() -> None:
    reply = ask(Answerer(RECORDS), "edge-1", "A", "CH")
    assert reply.rcode() == dns.rcode.REFUSED


def test_other_opcodes_are_not_implemented() -> None:
    query = dns.message.make_query("edge-1", "A")
    query.set_opcode(dns.opcode.NOTIFY)
    reply = dns.message.from_wire(Answerer(RECORDS).respond(query.to_wire()) or b"")
    assert reply.rcode() == dns.rcode.NOTIMP


def test_no_question_is_formerr() -> None:
    query = dns.message.Message(id=77)
    reply = dns.message.from_wire(Answerer(RECORDS).respond(query.to_wire()) or b"")
    assert reply.rcode() == dns.rcode.FORMERR and reply.id == 77


def test_garbage_gets_a_header_only_formerr_and_short_garbage_nothing() -> None:
    a = Answerer(RECORDS)
    wire = struct.pack("!HHHHHH", 4242, dns.flags.RD, 1, 0, 0, 0) + b"\xff\xff\xff"
    reply = a.respond(wire)
    assert reply is not None
    msg = dns.message.from_wire(reply)
    assert msg.id == 4242 and msg.rcode() == dns.rcode.FORMERR and msg.flags & dns.flags.QR
    assert a.respond(b"\x00\x01\x02") is None


def test_responses_are_never_answered() -> None:
    a = Answerer(RECORDS)
    query = dns.message.make_query("edge-1", "A")
    response = dns.message.make_response(query)
    assert a.respond(response.to_wire()) is None
    garbage = struct.pack("!HHHHHH", 1, dns.flags.QR, 1, 0, 0, 0) + b"\xff"
    assert a.respond(garbage) is None


def test_oversized_answer_is_truncated_for_udp_and_whole_for_tcp() -> None:
    many = {"big": [f"10.1.{i // 250}.{i % 250}" for i in range(200)]}
    a = Answerer(many)
    query = dns.message.make_query("big", "A", use_edns=False)
    udp = dns.message.from_wire(a.respond(query.to_wire(), 0) or b"", raise_on_truncation=False)
    assert udp.flags & dns.flags.TC
    assert len(a.respond(query.to_wire(), 0) or b"") <= 512
    tcp = dns.message.from_wire(a.respond(query.to_wire(), 65535) or b"")
    assert not tcp.flags & dns.flags.TC
    assert len(addresses(tcp)) == 200


def test_edns_clients_get_an_edns_reply() -> None:
    reply = ask(Answerer(RECORDS), "edge-1", "A", use_edns=0, payload=4096)
    assert reply.edns == 0
    assert addresses(reply) == ["10.0.0.1"]


@settings(max_examples=examples(500), deadline=None)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_raise(wire: bytes) -> None:
    reply = Answerer(RECORDS, suffix="x").respond(wire)
    if reply is not None:
        assert dns.message.from_wire(reply).flags & dns.flags.QR


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=40), st.integers(0, 100))
def test_mutated_queries_never_raise(noise: bytes, at: int) -> None:
    wire = bytearray(dns.message.make_query("edge-1", "A").to_wire())
    at = min(at, len(wire))
    wire[at : at + len(noise)] = noise
    Answerer(RECORDS).respond(bytes(wire))
