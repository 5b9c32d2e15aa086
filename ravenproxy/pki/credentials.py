"""A process's TLS credentials as one checked value: from the bytes of its CA file, certificate
file and key file to an immutable :class:`Credentials`, or a :class:`CredentialsError` saying
which file is wrong and why. Pure: no file is read here (the reload watcher in
:mod:`ravenproxy.transport.credentials` reads them and builds ssl contexts).

Two levels of checks, because start-up and reload want different things:

- :func:`parse_credentials` — the set can be used at all: every file is whole PEM (a half-written
  file — a BEGIN line without its END — is refused as such), the key belongs to the first
  certificate of the certificate file. Failing this is fatal at start-up.
- :meth:`Credentials.trust_problem` — the set is one a peer will accept: the leaf chains (through
  any intermediates in the certificate file) to a CA of the bundle, and it is valid now. At
  start-up a problem is only warned about (the peer refuses and says so, as it always did); a
  *reload* takes a new set only when it has none (:func:`load_credentials`), so a renewal written
  half-way or against the wrong CA never replaces a set that works.

:class:`ReloadTracker` is the reload decision as a small state machine: take a new consistent
set, warn once per distinct inconsistent content, and only once it has stayed so for one more
look (a key written just before its certificate is not worth a warning).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from ravenproxy.errors import PKIError
from ravenproxy.pki.authority import is_issued_by

MAX_CHAIN = 8
"""Intermediates followed from the leaf to a CA of the bundle, at most."""

_BEGIN = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----")
_END = re.compile(rb"-----END ([A-Z0-9 ]+)-----")


class PemSource(NamedTuple):
    """One file's bytes and the names its errors carry: the flag (``cert-file``) and path."""

    field: str
    path: str
    data: bytes


class CredentialsError(PKIError):
    """The set cannot be used: ``field``/``path`` name the file at fault, ``reason`` says why."""

    def __init__(self, source: PemSource, reason: str) -> None:
        super().__init__(f"{source.field} {source.path}: {reason}")
        self.field = source.field
        self.path = source.path
        self.reason = reason


@dataclass(frozen=True)
class Credentials:
    """A consistent CA bundle, certificate chain and key, and what logs and metrics say of it."""

    ca_certs: tuple[x509.Certificate, ...]
    chain: tuple[x509.Certificate, ...]
    """The certificate file: the leaf first, then any intermediates."""
    key: PrivateKeyTypes = field(repr=False)
    ca_pem: bytes = field(repr=False)
    chain_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    sources: tuple[PemSource, PemSource, PemSource] = field(repr=False)
    """Where each part came from (ca, cert, key), for messages about the set."""
    fingerprint: str
    """SHA-256 over the CA certificates, the chain and the public key: equal sets, equal
    fingerprints, whatever the files' formatting."""
    leaf_fingerprint: str
    """SHA-256 over the chain and the public key only: what the peer sees of *us* (a changed CA
    bundle alone leaves it unchanged)."""

    @property
    def leaf(self) -> x509.Certificate:
        return self.chain[0]

    @property
    def serial(self) -> str:
        """The leaf's serial number in lower-case hex (as ``openssl x509 -serial`` prints it)."""
        return serial_hex(self.leaf)

    @property
    def not_after(self) -> dt.datetime:
        return self.leaf.not_valid_after_utc

    @property
    def subject(self) -> str:
        return self.leaf.subject.rfc4514_string()

    @property
    def issuer_ca(self) -> x509.Certificate | None:
        """The CA of the bundle the leaf chains to (None: it chains to none)."""
        found = _chain_to_bundle(self.chain, self.ca_certs)
        return found

    @property
    def ca_not_after(self) -> dt.datetime:
        """When trust in our own certificate ends: the expiry of the CA the leaf chains to, else
        the earliest expiry in the bundle."""
        ca = self.issuer_ca
        if ca is not None:
            return ca.not_valid_after_utc
        return min(c.not_valid_after_utc for c in self.ca_certs)

    def trust_problem(self, now: dt.datetime) -> CredentialsError | None:
        """Why a peer holding the same CA bundle would refuse this set now, or None."""
        _, cert_src, _ = self.sources
        if _chain_to_bundle(self.chain, self.ca_certs) is None:
            cas = ", ".join(c.subject.rfc4514_string() for c in self.ca_certs)
            return CredentialsError(
                cert_src,
                f"certificate {self.subject} does not verify against the CA bundle ({cas})",
            )
        leaf = self.leaf
        if now >= leaf.not_valid_after_utc:
            return CredentialsError(
                cert_src, f"certificate expired at {leaf.not_valid_after_utc.isoformat()}"
            )
        if now < leaf.not_valid_before_utc:
            return CredentialsError(
                cert_src, f"certificate not valid before {leaf.not_valid_before_utc.isoformat()}"
            )
        return None


def serial_hex(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def parse_credentials(ca: PemSource, cert: PemSource, key: PemSource) -> Credentials:
    """The set in three files' bytes, or :class:`CredentialsError` when it cannot be used at
    all (see the module docstring); trust and validity are :meth:`Credentials.trust_problem`."""
    ca_certs = _certificates(ca)
    chain = _certificates(cert)
    private = _private_key(key)
    leaf_public = chain[0].public_key()
    if _public_der(private.public_key()) != _public_der(leaf_public):
        raise CredentialsError(
            key,
            f"the key does not match the certificate in {cert.field} {cert.path}"
            f" ({chain[0].subject.rfc4514_string()})",
        )
    der = serialization.Encoding.DER
    public = _public_der(leaf_public)
    leaf_digest = hashlib.sha256()
    for c in chain:
        leaf_digest.update(c.public_bytes(der))
    leaf_digest.update(public)
    whole = hashlib.sha256()
    for c in ca_certs:
        whole.update(c.public_bytes(der))
    whole.update(leaf_digest.digest())
    return Credentials(
        ca_certs=ca_certs,
        chain=chain,
        key=private,
        ca_pem=ca.data,
        chain_pem=cert.data,
        key_pem=key.data,
        sources=(ca, cert, key),
        fingerprint=whole.hexdigest(),
        leaf_fingerprint=leaf_digest.hexdigest(),
    )


def load_credentials(
    ca: PemSource, cert: PemSource, key: PemSource, *, now: dt.datetime
) -> Credentials:
    """:func:`parse_credentials`, and the set must be trusted and valid at ``now`` (what a
    reload requires before it replaces a working set)."""
    creds = parse_credentials(ca, cert, key)
    problem = creds.trust_problem(now)
    if problem is not None:
        raise problem
    return creds


# -- the reload decision ---------------------------------------------------------------------


class Verdict(Enum):
    SAME = "same"
    """Nothing to do: the content is the set in use, or already reported."""
    TAKE = "take"
    """A new consistent set: use it."""
    WAIT = "wait"
    """Inconsistent, first seen: look again before warning (a write may be under way)."""
    WARN = "warn"
    """Inconsistent and still so: warn once, keep the set in use."""


class ReloadTracker:
    """What to do with each look at the files, given the digest of their content and whether it
    made a consistent set. Pure; the watcher feeds it.

    Rules: the content in use is never taken twice; a consistent new content is taken at once;
    an inconsistent one is warned about once, the second time it is seen unchanged (so a
    renewal caught between its key and its certificate passes silently), and never again while
    it stays; going back to the content in use is silent.
    """

    def __init__(self, applied: str) -> None:
        self.applied = applied
        self._pending: str | None = None
        self._reported: str | None = None

    def observe(self, digest: str, consistent: bool) -> Verdict:
        if digest == self.applied:
            self._pending = None
            return Verdict.SAME
        if consistent:
            self.applied, self._pending, self._reported = digest, None, None
            return Verdict.TAKE
        if digest == self._reported:
            return Verdict.SAME
        if digest != self._pending:
            self._pending = digest
            return Verdict.WAIT
        self._reported, self._pending = digest, None
        return Verdict.WARN


def content_digest(*data: bytes) -> str:
    """One digest of several files' raw bytes (length-prefixed: no two splits collide)."""
    h = hashlib.sha256()
    for d in data:
        h.update(len(d).to_bytes(8, "big"))
        h.update(d)
    return h.hexdigest()


# -- parsing ---------------------------------------------------------------------------------


def _whole_pem(source: PemSource) -> None:
    """Refuse an empty file and a half-written one: every BEGIN line has its END line."""
    if not source.data.strip():
        raise CredentialsError(source, "empty file")
    begins = [m.group(1) for m in _BEGIN.finditer(source.data)]
    ends = [m.group(1) for m in _END.finditer(source.data)]
    if not begins:
        raise CredentialsError(source, "no PEM block in file")
    if begins != ends or source.data.rfind(b"-----END") < source.data.rfind(b"-----BEGIN"):
        raise CredentialsError(
            source, "incomplete PEM (a BEGIN line without its END line): half-written?"
        )


def _certificates(source: PemSource) -> tuple[x509.Certificate, ...]:
    _whole_pem(source)
    try:
        certs = x509.load_pem_x509_certificates(source.data)
    except ValueError as exc:
        raise CredentialsError(source, f"not a PEM certificate ({exc})") from exc
    if not certs:
        raise CredentialsError(source, "no certificate in file")
    return tuple(certs)


def _private_key(source: PemSource) -> PrivateKeyTypes:
    _whole_pem(source)
    try:
        return serialization.load_pem_private_key(source.data, password=None)
    except TypeError as exc:
        raise CredentialsError(source, "key is encrypted; an unencrypted key is needed") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CredentialsError(source, f"no usable PEM private key ({exc})") from exc


def _public_der(public: object) -> bytes:
    encode = getattr(public, "public_bytes", None)
    if encode is None:  # pragma: no cover - every key type cryptography loads has it
        return b""
    der: bytes = encode(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return der


def _chain_to_bundle(
    chain: tuple[x509.Certificate, ...], bundle: tuple[x509.Certificate, ...]
) -> x509.Certificate | None:
    """The CA of ``bundle`` that ``chain[0]`` chains to, through intermediates of ``chain``."""
    current = chain[0]
    intermediates = list(chain[1:])
    for _ in range(MAX_CHAIN + 1):
        for ca in bundle:
            if is_issued_by(current, ca):
                return ca
        step = next((c for c in intermediates if is_issued_by(current, c)), None)
        if step is None:
            return None
        intermediates.remove(step)
        current = step
    return None
