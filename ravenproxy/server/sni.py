"""The TLS ClientHello, read from peeked bytes: is this TLS, and which server name does it ask for?

Pure (bytes in, answer out), so the HTTPS front can decide between passing the raw TLS bytes
through to a kubelet and terminating TLS itself before a single byte is consumed from the socket.
A ClientHello may span several TLS records (large key shares); the handshake message is
reassembled from consecutive handshake records. Nothing here validates more than it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ravenproxy.errors import RavenProxyError

RECORD_HANDSHAKE = 0x16
HANDSHAKE_CLIENT_HELLO = 0x01
EXT_SERVER_NAME = 0x0000
NAME_TYPE_HOST = 0x00

MAX_RECORD = (1 << 14) + 2048
"""Largest record body TLS allows (ciphertext limit; a plaintext ClientHello record is smaller)."""
MAX_HELLO = 64 * 1024
"""Largest ClientHello we wait for; real ones are 200 bytes to a few KiB."""


class NotClientHello(RavenProxyError, ValueError):
    """The bytes are not the start of a TLS connection (or a malformed ClientHello)."""


@dataclass(frozen=True)
class ClientHello:
    server_name: str | None
    """The SNI host name, lower-cased, without a trailing dot; None when absent."""
    length: int
    """Bytes (records included) the ClientHello occupies at the start of the stream."""


def parse_client_hello(data: bytes) -> ClientHello | None:
    """The ClientHello at the start of ``data``; None when more bytes are needed.

    Raises :class:`NotClientHello` when the bytes cannot be one.
    """
    handshake = bytearray()
    offset = 0
    needed: int | None = None
    while needed is None or len(handshake) < needed:
        if len(data) < offset + 5:
            _check_prefix(data[offset:])
            return None
        if data[offset] != RECORD_HANDSHAKE:
            raise NotClientHello(f"record type {data[offset]:#04x} is not a handshake")
        if data[offset + 1] != 0x03:
            raise NotClientHello(f"record version {data[offset + 1]:#04x}.. is not TLS")
        length = int.from_bytes(data[offset + 3 : offset + 5], "big")
        if length == 0 or length > MAX_RECORD:
            raise NotClientHello(f"record length {length} out of range")
        if len(data) < offset + 5 + length:
            return None
        handshake += data[offset + 5 : offset + 5 + length]
        offset += 5 + length
        if needed is None and len(handshake) >= 4:
            if handshake[0] != HANDSHAKE_CLIENT_HELLO:
                raise NotClientHello(f"handshake type {handshake[0]} is not ClientHello")
            needed = 4 + int.from_bytes(handshake[1:4], "big")
            if needed > MAX_HELLO:
                raise NotClientHello(f"ClientHello of {needed} bytes is too large")
        if offset > MAX_HELLO:
            raise NotClientHello("ClientHello spread over too many bytes")
    return ClientHello(_server_name(bytes(handshake[4:needed])), offset)


def _check_prefix(prefix: bytes) -> None:
    """Refuse early when even a partial record header cannot be TLS (e.g. ``GET /``)."""
    if prefix and prefix[0] != RECORD_HANDSHAKE:
        raise NotClientHello(f"record type {prefix[0]:#04x} is not a handshake")
    if len(prefix) >= 2 and prefix[1] != 0x03:
        raise NotClientHello(f"record version {prefix[1]:#04x}.. is not TLS")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NotClientHello("ClientHello truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.uint(length_bytes))

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


def _server_name(body: bytes) -> str | None:
    r = _Reader(body)
    r.take(2)  # legacy_version
    r.take(32)  # random
    r.vector(1)  # legacy_session_id
    suites = r.vector(2)
    if not suites or len(suites) % 2:
        raise NotClientHello("bad cipher_suites")
    r.vector(1)  # legacy_compression_methods
    if r.left == 0:
        return None  # no extensions at all (old clients)
    extensions = _Reader(r.vector(2))
    if r.left:
        raise NotClientHello("bytes after the extensions")
    while extensions.left:
        ext_type = extensions.uint(2)
        ext = extensions.vector(2)
        if ext_type != EXT_SERVER_NAME:
            continue
        names = _Reader(ext)
        entries = _Reader(names.vector(2))
        while entries.left:
            name_type = entries.uint(1)
            name = entries.vector(2)
            if name_type == NAME_TYPE_HOST:
                return _host_name(name)
        return None
    return None


def _host_name(raw: bytes) -> str:
    if not raw:
        raise NotClientHello("empty server name")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise NotClientHello("server name is not ASCII") from None
    if any(not (c.isalnum() or c in "-._") for c in text):
        raise NotClientHello(f"server name {text[:80]!r} has invalid characters")
    return text.rstrip(".").lower()
