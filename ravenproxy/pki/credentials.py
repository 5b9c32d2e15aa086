"""A process's TLS credentials as one checked value: from the bytes of its CA file, certificate
file and key file to an immutable :class:`Credentials`, or a :class:`CredentialsError` saying
which file is wrong and why. No file is read here (the reload watcher in
:mod:`ravenproxy.transport.credentials` reads them and builds ssl contexts); the bytes are read
and checked with :mod:`ssl` (:mod:`ravenproxy.pki.x509info`, through in-memory files), so a
process that only uses its credentials never loads ``cryptography``.

Two levels of checks, because start-up and reload want different things:

- :func:`parse_credentials` — the set can be used at all: every file is whole PEM (a half-written
  file — a BEGIN line without its END — is refused as such), the key belongs to the first
  certificate of the certificate file (OpenSSL loads them together, as the TLS contexts will).
  Failing this is fatal at start-up.
- :meth:`Credentials.trust_problem` — the set is one a peer will accept: the leaf chains (through
  any intermediates in the certificate file) to a CA of the bundle, as a peer holding that CA
  verifies it in a handshake (:func:`~ravenproxy.pki.x509info.verify_problem`), and it is
  valid now. At
  start-up a problem is only warned about (the peer refuses and says so, as it always did); a
  *reload* takes a new set only when it has none (:func:`load_credentials`), so a renewal written
  half-way or against the wrong CA never replaces a set that works.

:class:`ReloadTracker` is the reload decision as a small state machine: take a new consistent
set, warn once per distinct inconsistent content, and only once it has stayed so for one more
look (a key written just before its certificate is not worth a warning).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import re
import ssl
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from ravenproxy.errors import PKIError
from ravenproxy.pki.x509info import (
    CertInfo,
    KeyPairError,
    certs_from_pem,
    load_pair,
    private_file,
    verify_problem,
)

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

    ca_certs: tuple[CertInfo, ...]
    chain: tuple[CertInfo, ...]
    """The certificate file: the leaf first, then any intermediates."""
    ca_pem: bytes = field(repr=False)
    chain_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)
    sources: tuple[PemSource, PemSource, PemSource] = field(repr=False)
    """Where each part came from (ca, cert, key), for messages about the set."""
    fingerprint: str
    """SHA-256 over the CA certificates and the chain: equal sets, equal fingerprints, whatever
    the files' formatting (the key is the one of the leaf's public key: checked, not hashed)."""
    leaf_fingerprint: str
    """SHA-256 over the chain only: what the peer sees of *us* (a changed CA bundle alone leaves
    it unchanged)."""

    @property
    def leaf(self) -> CertInfo:
        return self.chain[0]

    @property
    def serial(self) -> str:
        """The leaf's serial number in lower-case hex (as ``openssl x509 -serial`` prints it)."""
        return self.leaf.serial_hex

    @property
    def not_after(self) -> dt.datetime:
        return self.leaf.not_after

    @property
    def subject(self) -> str:
        return self.leaf.subject

    @functools.cached_property
    def _verification(self) -> tuple[CertInfo | None, str]:
        """The first CA of the bundle the chain verifies against, else None and why not."""
        why = ""
        for ca in self.ca_certs:
            problem = verify_problem(self.chain_pem, self.key_pem, ca)
            if problem is None:
                return ca, ""
            why = why or problem
        return None, why

    @property
    def issuer_ca(self) -> CertInfo | None:
        """The CA of the bundle the leaf chains to (None: it chains to none)."""
        return self._verification[0]

    @property
    def ca_not_after(self) -> dt.datetime:
        """When trust in our own certificate ends: the expiry of the CA the leaf chains to, else
        the earliest expiry in the bundle."""
        ca = self.issuer_ca
        if ca is not None:
            return ca.not_after
        return min(c.not_after for c in self.ca_certs)

    def trust_problem(self, now: dt.datetime) -> CredentialsError | None:
        """Why a peer holding the same CA bundle would refuse this set now, or None."""
        _, cert_src, _ = self.sources
        ca, why = self._verification
        if ca is None:
            cas = ", ".join(c.subject for c in self.ca_certs)
            return CredentialsError(
                cert_src,
                f"certificate {self.subject} does not verify against the CA bundle ({cas}): {why}",
            )
        leaf = self.leaf
        if now >= leaf.not_after:
            return CredentialsError(
                cert_src, f"certificate expired at {leaf.not_after.isoformat()}"
            )
        if now < leaf.not_before:
            return CredentialsError(
                cert_src, f"certificate not valid before {leaf.not_before.isoformat()}"
            )
        return None


def parse_credentials(ca: PemSource, cert: PemSource, key: PemSource) -> Credentials:
    """The set in three files' bytes, or :class:`CredentialsError` when it cannot be used at
    all (see the module docstring); trust and validity are :meth:`Credentials.trust_problem`."""
    ca_certs = _certificates(ca)
    chain = _certificates(cert)
    _whole_pem(key)
    _check_key(cert, key, chain[0])
    leaf_digest = hashlib.sha256()
    for c in chain:
        leaf_digest.update(c.der)
    whole = hashlib.sha256()
    for c in ca_certs:
        whole.update(c.der)
    whole.update(leaf_digest.digest())
    return Credentials(
        ca_certs=ca_certs,
        chain=chain,
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


def _certificates(source: PemSource) -> tuple[CertInfo, ...]:
    _whole_pem(source)
    try:
        certs = certs_from_pem(source.data)
    except ValueError as exc:
        raise CredentialsError(source, f"not a PEM certificate ({exc})") from exc
    if not certs:
        raise CredentialsError(source, "no certificate in file")
    return certs


def _check_key(cert: PemSource, key: PemSource, leaf: CertInfo) -> None:
    """The key is an unencrypted private key and belongs to the leaf: OpenSSL loads the pair
    as a TLS context does, and refuses a key that does not match."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    with private_file(cert.data) as cert_path, private_file(key.data) as key_path:
        try:
            load_pair(ctx, cert_path, key_path)
        except KeyPairError as exc:
            if exc.mismatch:
                raise CredentialsError(
                    key,
                    f"the key does not match the certificate in {cert.field} {cert.path}"
                    f" ({leaf.subject})",
                ) from None
            raise CredentialsError(key, exc.reason) from None
