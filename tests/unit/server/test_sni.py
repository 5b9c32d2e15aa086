"""The ClientHello peek parser: real hellos from OpenSSL, synthetic ones split over records,
partial input, and arbitrary bytes (never anything but an answer or NotClientHello)."""

from __future__ import annotations

import ssl
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ravenproxy.server.sni import ClientHello, NotClientHello, parse_client_hello


def openssl_hello(server_hostname: str | None, *, tls12: bool = False) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("tls12", [False, True])
def test_real_client_hello_with_sni(tls12: bool) -> None:
    data = openssl_hello("edge-1", tls12=tls12)
    assert parse_client_hello(data) == ClientHello("edge-1", len(data))
    # Bytes after the hello (none are sent before the answer, but a peek may see more).
    assert parse_client_hello(data + b"\x17\x03\x03") == ClientHello("edge-1", len(data))


def test_real_client_hello_without_sni() -> None:
    data = openssl_hello(None)
    assert parse_client_hello(data) == ClientHello(None, len(data))


def test_an_ip_is_not_sent_as_sni() -> None:
    data = openssl_hello("127.0.0.1")
    assert parse_client_hello(data) == ClientHello(None, len(data))


def test_names_are_lower_cased_without_the_trailing_dot() -> None:
    data = openssl_hello("Edge-1.Example.")
    hello = parse_client_hello(data)
    assert hello is not None and hello.server_name == "edge-1.example"


def test_every_prefix_needs_more() -> None:
    data = openssl_hello("edge-1")
    for n in range(len(data)):
        assert parse_client_hello(data[:n]) is None, n


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n",
        b"CONNECT edge-1:10250 HTTP/1.1\r\n",
        b"\x16\x02\x00\x00\x10",  # SSLv2-ish version
        b"\x17\x03\x03\x00\x10" + b"\x00" * 16,  # application data first
        b"\x16\x03\x01\x00\x00",  # empty record
        b"\x16\x03\x01\x00\x04\x02\x00\x00\x00",  # ServerHello
    ],
)
def test_not_a_client_hello(data: bytes) -> None:
    with pytest.raises(NotClientHello):
        parse_client_hello(data)


def test_plain_http_is_refused_from_its_first_byte() -> None:
    with pytest.raises(NotClientHello):
        parse_client_hello(b"G")


# -- synthetic hellos ---------------------------------------------------------------------------
def vec(length_bytes: int, data: bytes) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def extension(ext_type: int, body: bytes) -> bytes:
    return struct.pack("!H", ext_type) + vec(2, body)


def sni_extension(name: bytes) -> bytes:
    return extension(0, vec(2, b"\x00" + vec(2, name)))


def build_hello(extensions: list[bytes], session_id: bytes = b"") -> bytes:
    body = (
        b"\x03\x03"
        + b"\x11" * 32
        + vec(1, session_id)
        + vec(2, b"\x13\x01\x13\x02")
        + vec(1, b"\x00")
        + vec(2, b"".join(extensions))
    )
    return b"\x01" + len(body).to_bytes(3, "big") + body


def records(handshake: bytes, cuts: list[int]) -> bytes:
    points = sorted({c for c in cuts if 0 < c < len(handshake)})
    out = b""
    start = 0
    for end in [*points, len(handshake)]:
        out += b"\x16\x03\x01" + struct.pack("!H", end - start) + handshake[start:end]
        start = end
    return out


hostnames = st.from_regex(
    r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}", fullmatch=True
)
other_extensions = st.lists(
    st.tuples(st.integers(1, 0xFFFF), st.binary(max_size=300)).map(lambda t: extension(*t)),
    max_size=6,
)


@given(
    name=hostnames,
    before=other_extensions,
    after=other_extensions,
    session_id=st.binary(max_size=32),
    cuts=st.lists(st.integers(1, 2000), max_size=5),
)
def test_synthetic_hello_over_records(
    name: str, before: list[bytes], after: list[bytes], session_id: bytes, cuts: list[int]
) -> None:
    handshake = build_hello([*before, sni_extension(name.encode()), *after], session_id)
    data = records(handshake, cuts)
    assert parse_client_hello(data) == ClientHello(name, len(data))
    assert parse_client_hello(data[: len(data) - 1]) is None


@given(before=other_extensions)
def test_synthetic_hello_without_sni(before: list[bytes]) -> None:
    before = [e for e in before if e[:2] != b"\x00\x00"]
    data = records(build_hello(before), [])
    assert parse_client_hello(data) == ClientHello(None, len(data))


@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    try:
        result = parse_client_hello(data)
    except NotClientHello:
        return
    assert result is None or isinstance(result, ClientHello)


@given(st.binary(min_size=1, max_size=400), st.integers(0, 400))
def test_corrupted_real_hello_never_crashes(junk: bytes, at: int) -> None:
    data = bytearray(openssl_hello("edge-1"))
    at = min(at, len(data) - 1)
    data[at : at + len(junk)] = junk
    try:
        parse_client_hello(bytes(data))
    except NotClientHello:
        pass


def test_bad_server_names_are_refused() -> None:
    for name in (b"", b"a b", b"\xff\xfe", b"edge/1"):
        with pytest.raises(NotClientHello):
            parse_client_hello(records(build_hello([sni_extension(name)]), []))
