"""What a running process needs to know of an X.509 certificate, read with the :mod:`ssl` module
alone: subject, issuer, serial, validity, DNS and IP SANs and extended key usage, and whether a
chain and key verify against a CA bundle (the way a peer checks them: an in-memory TLS handshake).

Why not ``cryptography``: its compiled module alone is ~8 MB resident, more than a quarter of
an idle agent (issue 15); the agent and the server check their own credentials and read their
peers' certificates through this module only, so both sides apply one rule with one parser.
Issuing, CSRs and ``certs status|renew`` keep ``cryptography`` (:mod:`ravenproxy.pki.authority`),
loaded only by the commands that do those.

Decoding is OpenSSL's, through ``ssl._ssl._test_decode_cert`` (the decoder behind
``SSLSocket.getpeercert()``, stable since Python 2.7); it does not report the extended key
usage, which :func:`_extended_key_usage` reads from the DER (a walk to one extension, no
general ASN.1 parser).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import os
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ravenproxy.errors import PKIError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CLIENT_AUTH = "1.3.6.1.5.5.7.3.2"
SERVER_AUTH = "1.3.6.1.5.5.7.3.1"

_CERT_BLOCK = re.compile(
    rb"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.DOTALL
)

# The attribute names RFC 4514 (and cryptography's rfc4514_string) abbreviates.
_SHORT = {
    "commonName": "CN",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}

_NO_CHECK_TIME = 0x200000
"""OpenSSL's X509_V_FLAG_NO_CHECK_TIME (not named by :mod:`ssl`): the chain is verified, its
validity period is the caller's to judge against its own clock."""
_INVALID_PURPOSE = 26
"""X509_V_ERR_INVALID_PURPOSE: the certificate is not for this side of a handshake."""
_NOT_VERIFIED = -1
"""The handshake failed before the certificate was verified (OpenSSL does not pick a
client-only certificate for the server's side)."""


@dataclass(frozen=True)
class CertInfo:
    """One certificate: its DER and the fields the processes use."""

    der: bytes
    subject: str
    """RFC 4514, most specific attribute first (as ``openssl x509 -nameopt RFC2253``)."""
    issuer: str
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime
    common_names: tuple[str, ...]
    dns_names: tuple[str, ...]
    ip_addresses: tuple[IPAddress, ...]
    extended_key_usage: frozenset[str] | None
    """Dotted OIDs; None: the certificate has no extended key usage extension."""

    @property
    def serial_hex(self) -> str:
        return serial_hex(self.serial)


def serial_hex(serial: int) -> str:
    """A serial number in lower-case hex (as ``openssl x509 -serial`` prints it)."""
    return format(serial, "x")


def certs_from_pem(data: bytes) -> tuple[CertInfo, ...]:
    """Every certificate of a PEM file, in order (other blocks are skipped); ValueError when
    one cannot be decoded."""
    return tuple(cert_from_der(_der_of(m.group(0))) for m in _CERT_BLOCK.finditer(data))


def cert_from_der(der: bytes) -> CertInfo:
    """One DER certificate; ValueError when it cannot be decoded. OpenSSL parses it whole
    (hundreds of microseconds with OpenSSL 3: fine for a process's own files; a peer's
    certificate, parsed by the handshake already, is read with :func:`peer_cert`)."""
    pem = b"-----BEGIN CERTIFICATE-----\n%s-----END CERTIFICATE-----\n" % base64.encodebytes(der)
    with private_file(pem) as path:
        try:
            fields: dict[str, Any] = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
        except ssl.SSLError as exc:
            raise ValueError(f"not a certificate ({_why(exc)})") from None
    return _info(der, fields)


def peer_cert(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> CertInfo | None:
    """The peer's certificate after a handshake that verified it (None: the peer sent none),
    from what the handshake decoded (``getpeercert()``), without parsing it again."""
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    fields = ssl_object.getpeercert()
    # An unverified certificate is not decoded by getpeercert(): parse it here then.
    return _info(der, fields) if fields else cert_from_der(der)


def _info(der: bytes, fields: dict[str, Any]) -> CertInfo:
    """A CertInfo from the DER and OpenSSL's decoding of it (``getpeercert()``'s dict)."""
    subject = fields.get("subject", ())
    return CertInfo(
        der=der,
        subject=_rfc4514(subject),
        issuer=_rfc4514(fields.get("issuer", ())),
        serial=int(fields["serialNumber"], 16),
        not_before=_time(fields["notBefore"]),
        not_after=_time(fields["notAfter"]),
        common_names=tuple(v for rdn in subject for k, v in rdn if k == "commonName"),
        dns_names=tuple(v for k, v in fields.get("subjectAltName", ()) if k == "DNS"),
        ip_addresses=tuple(
            # OpenSSL prints an IPv6 SAN in full upper-case hex groups, with a newline.
            ipaddress.ip_address(v.strip())
            for k, v in fields.get("subjectAltName", ())
            if k == "IP Address"
        ),
        extended_key_usage=_extended_key_usage(der),
    )


def read_file(path: str | Path, what: str) -> bytes:
    """A PEM file's bytes; errors name ``what`` (its flag) and the path."""
    p = Path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError as exc:
        raise PKIError(f"{what} {p}: No such file") from exc
    except IsADirectoryError as exc:
        raise PKIError(f"{what} {p}: is a directory") from exc
    except OSError as exc:
        raise PKIError(f"{what} {p}: cannot read: {exc.strerror or exc}") from exc


def load_certs(path: str | Path, what: str) -> tuple[CertInfo, ...]:
    """Every certificate of a PEM file, at least one; errors name ``what`` and the path."""
    try:
        certs = certs_from_pem(read_file(path, what))
    except ValueError as exc:
        raise PKIError(f"{what} {path}: not a PEM certificate ({exc})") from exc
    if not certs:
        raise PKIError(f"{what} {path}: no certificate")
    return certs


def verify_problem(chain_pem: bytes, key_pem: bytes, ca: CertInfo) -> str | None:
    """Why a peer trusting ``ca`` alone would refuse the chain (OpenSSL's verify message), or
    None: it verifies. Validity periods are not checked (see :data:`_NO_CHECK_TIME`). A TLS 1.3
    handshake in memory, with the chain first as the server's certificate, then, if its
    extended key usage is not for that, as the client's: it holds for whichever side the
    certificate is for."""
    as_server = _handshake(chain_pem, key_pem, ca, ours_as_server=True)
    if as_server is None:
        return None
    if as_server[0] not in (_INVALID_PURPOSE, _NOT_VERIFIED):
        return as_server[1]
    as_client = _handshake(chain_pem, key_pem, ca, ours_as_server=False)
    return None if as_client is None else as_client[1]


class KeyPairError(PKIError):
    """A certificate and key that :mod:`ssl` will not load together; ``reason`` says why,
    ``mismatch`` whether the key is a good key of another certificate."""

    def __init__(self, reason: str, *, mismatch: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.mismatch = mismatch


class _Encrypted(Exception):
    """Raised from the password callback: OpenSSL asked for one, the key is encrypted."""


def _no_password() -> bytes:
    # Without a callback ssl would prompt on the terminal for an encrypted key.
    raise _Encrypted


def load_pair(ctx: ssl.SSLContext, cert_path: str, key_path: str | None) -> None:
    """``ctx.load_cert_chain`` (the key inside ``cert_path`` when ``key_path`` is None), its
    refusals as :class:`KeyPairError`: an encrypted key, a key of another certificate, no
    usable key. OpenSSL checks the pair as every TLS context will use it. OSError passes."""
    try:
        ctx.load_cert_chain(cert_path, key_path, password=_no_password)
    except _Encrypted:
        raise KeyPairError("key is encrypted; an unencrypted key is needed") from None
    except ssl.SSLError as exc:
        if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
            raise KeyPairError("the key does not match the certificate", mismatch=True) from None
        raise KeyPairError(f"no usable PEM private key ({_why(exc)})") from None


@contextlib.contextmanager
def private_file(data: bytes) -> Iterator[str]:
    """A path that reads ``data``, readable by this process only, gone afterwards (:mod:`ssl`
    loads certificates and keys from files only): an anonymous in-memory file (memfd), so a key
    never touches a disk."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None:
        fd = memfd_create("ravenproxy-pem", getattr(os, "MFD_CLOEXEC", 0))
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    # No memfd (not Linux): a private directory. Imported here, out of every agent's imports.
    import tempfile  # pragma: no cover

    with tempfile.TemporaryDirectory(prefix="ravenproxy-pem-") as tmp:  # pragma: no cover
        path = os.path.join(tmp, "pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield path


# --------------------------------------------------------------------------------------------


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _why(exc: ssl.SSLError) -> str:
    """OpenSSL's reason (``KEY_VALUES_MISMATCH``), else the message: some errors carry none."""
    return str(getattr(exc, "reason", None) or (exc.args[-1] if exc.args else exc))


def _der_of(block: bytes) -> bytes:
    try:
        return ssl.PEM_cert_to_DER_cert(block.decode("ascii"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a PEM certificate ({exc})") from None


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _time(text: str) -> dt.datetime:
    """OpenSSL's printed time (``May  9 00:00:00 2027 GMT``), read as
    :func:`ssl.cert_time_to_seconds` reads it (C locale month names, GMT), without its
    ``time.strptime``: ``_strptime`` and ``calendar`` are ~0.2 MB of an agent (issue 15)."""
    try:
        month, day, clock, year, zone = text.split()
        hour, minute, second = clock.split(":")
        if zone != "GMT" or month not in _MONTHS:
            raise ValueError
        return dt.datetime(
            int(year), _MONTHS.index(month) + 1, int(day),
            int(hour), int(minute), int(second), tzinfo=dt.UTC,
        )  # fmt: skip
    except ValueError:
        raise ValueError(
            f"time data {text!r} does not match format '%b %d %H:%M:%S %Y GMT'"
        ) from None


def _rfc4514(name: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    return ",".join(
        "+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn) for rdn in reversed(name)
    )


def _escape(value: str) -> str:
    """RFC 4514 section 2.4, as cryptography escapes."""
    for ch in ("\\", '"', "+", ",", ";", "<", ">"):
        value = value.replace(ch, "\\" + ch)
    value = value.replace("\0", "\\00")
    if value[:1] in ("#", " "):
        value = "\\" + value
    if value.endswith(" ") and not value.endswith("\\ "):
        value = value[:-1] + "\\ "
    return value


def _handshake(
    chain_pem: bytes, key_pem: bytes, ca: CertInfo, ours_as_server: bool
) -> tuple[int, str] | None:
    """One handshake in memory: the side holding ``ca`` verifies our chain, presented as the
    server's certificate or as the client's (the server then presents it too: it needs one, and
    the client does not check it)."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.check_hostname = False
    verifier = client_ctx if ours_as_server else server_ctx
    with private_file(chain_pem) as cert_path, private_file(key_pem) as key_path:
        load_pair(server_ctx, cert_path, key_path)
        if not ours_as_server:
            load_pair(client_ctx, cert_path, key_path)
            client_ctx.verify_mode = ssl.CERT_NONE
    verifier.load_verify_locations(cadata=ca.der)
    verifier.verify_flags |= ssl.VERIFY_X509_STRICT | _NO_CHECK_TIME
    verifier.verify_mode = ssl.CERT_REQUIRED
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    server = server_ctx.wrap_bio(pipes[0], pipes[1], server_side=True)
    client = client_ctx.wrap_bio(pipes[2], pipes[3], server_side=False)
    done = {id(server): False, id(client): False}
    for _ in range(8):
        for obj, out, peer_in in ((client, pipes[3], pipes[0]), (server, pipes[1], pipes[2])):
            if not done[id(obj)]:
                try:
                    obj.do_handshake()
                    done[id(obj)] = True
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    pass
                except ssl.SSLCertVerificationError as exc:
                    return exc.verify_code, exc.verify_message
                except ssl.SSLError as exc:
                    # The side that verified refused; the other only hears an alert.
                    return _NOT_VERIFIED, _why(exc)
            data = out.read()
            if data:
                peer_in.write(data)
        if all(done.values()):
            # TLS 1.3: the server verifies the client's certificate on reading its Finished,
            # which the client sends after its own handshake is done; a refusal shows on the
            # server's first read.
            try:
                server.read(1)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return None
            except ssl.SSLCertVerificationError as exc:
                return exc.verify_code, exc.verify_message
            return None
    return _NOT_VERIFIED, "handshake did not finish"


def _extended_key_usage(der: bytes) -> frozenset[str] | None:
    """The extended key usage OIDs in a DER certificate (None: no such extension): Certificate
    → TBSCertificate → [3] extensions → the extension whose id is 2.5.29.37."""
    try:
        _, start, end = _tlv(der, 0)
        _, start, end = _tlv(der, start)  # TBSCertificate
        for tag, s, e in _children(der, start, end):
            if tag != 0xA3:
                continue
            _, s, e = _tlv(der, s)  # SEQUENCE OF Extension
            for _, xs, xe in _children(der, s, e):
                parts = list(_children(der, xs, xe))
                if der[parts[0][1] : parts[0][2]] != b"\x55\x1d\x25":
                    continue
                _, vs, _ = parts[-1]  # OCTET STRING holding SEQUENCE OF KeyPurposeId
                _, ss, se = _tlv(der, vs)
                return frozenset(_oid(der[os_:oe]) for _, os_, oe in _children(der, ss, se))
    except IndexError:
        raise ValueError("truncated certificate") from None
    return None


def _tlv(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at ``pos``."""
    tag, length = buf[pos], buf[pos + 1]
    pos += 2
    if length & 0x80:
        n = length & 0x7F
        length = int.from_bytes(buf[pos : pos + n], "big")
        pos += n
    if pos + length > len(buf):
        raise IndexError(pos + length)
    return tag, pos, pos + length


def _children(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    while start < end:
        tag, s, e = _tlv(buf, start)
        yield tag, s, e
        start = e


def _oid(body: bytes) -> str:
    first, rest = divmod(body[0], 40) if body[0] < 80 else (2, body[0] - 80)
    arcs = [first, rest]
    value = 0
    for b in body[1:]:
        value = (value << 7) | (b & 0x7F)
        if not b & 0x80:
            arcs.append(value)
            value = 0
    return ".".join(map(str, arcs))
