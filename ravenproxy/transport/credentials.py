"""Certificate reload from disk: the thin asyncio adapter around
:mod:`ravenproxy.pki.credentials`.

A :class:`CredentialsWatcher` reads ``--ca-file``, ``--cert-file`` and ``--key-file`` once at
start-up (a set that cannot be used at all is fatal there, as it always was), then, every
:data:`RELOAD_INTERVAL`, looks at the three files' stat (inode, size, mtime, ctime) and, when one
changed, at their content. A consistent new set (the key matches the certificate, the chain
verifies against the CA bundle, valid now) is turned into new ssl contexts by the owner's
``build`` and becomes :attr:`CredentialsWatcher.contexts`; the listeners and dialers read that
at each new handshake, so connections already up are not touched. An inconsistent set (a
half-written file, a key written before its certificate, a certificate from another CA) is
warned about once per distinct content, naming the file and the reason, and ignored: the set in
use stays until the files become consistent.

Renewals are written as an operator (or ``certs renew``, or the CSR requester) writes them:
each file atomically, the key first. Polling, not inotify: it sees a rename into place, a
symlink swap (Kubernetes Secret volumes), and a file replaced on a network filesystem alike.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Generic, NamedTuple, TypeVar

from ravenproxy.errors import PKIError
from ravenproxy.log import kv
from ravenproxy.pki.credentials import (
    Credentials,
    CredentialsError,
    PemSource,
    ReloadTracker,
    Verdict,
    content_digest,
    load_credentials,
    parse_credentials,
)
from ravenproxy.pki.x509info import read_file
from ravenproxy.ticks import look_every

log = logging.getLogger(__name__)

RELOAD_INTERVAL = 1.0
"""Seconds between two looks at the credential files (a stat of three files: cheap)."""

T = TypeVar("T")

_Stat = tuple[int, int, int, int] | str


class CredentialFiles(NamedTuple):
    """The three files of a credential set, as given by their flags."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def of(cls, ca: str | Path, cert: str | Path, key: str | Path) -> CredentialFiles:
        return cls(Path(ca), Path(cert), Path(key))

    def named(self) -> tuple[tuple[str, Path], ...]:
        return (("ca-file", self.ca), ("cert-file", self.cert), ("key-file", self.key))


def read_sources(files: CredentialFiles) -> tuple[PemSource, PemSource, PemSource]:
    """The three files' bytes; a file that cannot be read is a :class:`PKIError` naming it."""
    out: list[PemSource] = []
    for name, path in files.named():
        out.append(PemSource(name, str(path), read_file(path, name)))
    return out[0], out[1], out[2]


def _stat(paths: tuple[bytes, ...]) -> tuple[_Stat, ...]:
    """Each file's stat (inode, size, mtime, ctime), or why it has none. ``paths`` are encoded
    once: a ``Path`` costs two Python calls a stat (``__fspath__``, ``__str__``) and a ``str``
    an encoding, three files a second for the life of the process."""
    looks: list[_Stat] = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError as exc:
            looks.append(exc.strerror or str(exc))
        else:
            looks.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(looks)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CredentialsWatcher(Generic[T]):
    """The credential set in use and the contexts built from it, kept up to date from disk.

    ``build`` turns a checked set into whatever the owner's listeners or dialers need (one or
    several ssl contexts); a :class:`PKIError` from it makes the set inconsistent.
    ``on_change(old, new)`` runs after each reload (metrics, the agent's rotation).
    :meth:`run` is the polling loop: the owner runs it as a named task and cancels it on
    shutdown.
    """

    def __init__(
        self,
        files: CredentialFiles,
        build: Callable[[Credentials], T],
        *,
        role: str,
        on_change: Callable[[Credentials, Credentials], None] | None = None,
        interval: float = RELOAD_INTERVAL,
        clock: Callable[[], dt.datetime] = _now,
    ) -> None:
        self.files = files
        self._paths = tuple(os.fsencode(path) for path in files)
        self.role = role
        self.interval = interval
        self._build = build
        self._on_change = on_change
        self._clock = clock
        self._creds: Credentials | None = None
        self._contexts: T | None = None
        self._tracker: ReloadTracker | None = None
        self._seen: tuple[_Stat, ...] | None = None
        self._verdict: Verdict | None = None
        self.reloads = 0

    @property
    def current(self) -> Credentials:
        assert self._creds is not None, "load() runs first"
        return self._creds

    @property
    def contexts(self) -> T:
        assert self._contexts is not None, "load() runs first"
        return self._contexts

    def load(self) -> Credentials:
        """The start-up read: a set that cannot be used at all raises :class:`PKIError` naming
        the file; one a peer will refuse (another CA, expired) is used, with a warning, as
        before reloading existed — the peer's refusal says the rest."""
        self._seen = _stat(self._paths)
        sources = read_sources(self.files)
        creds = parse_credentials(*sources)
        problem = creds.trust_problem(self._clock())
        if problem is not None:
            log.warning(
                "certificate will not be accepted by peers holding the same CA bundle",
                extra=kv(role=self.role, file=problem.path, reason=problem.reason),
            )
        self._contexts = self._build(creds)
        self._creds = creds
        self._tracker = ReloadTracker(content_digest(*(s.data for s in sources)))
        log.info(
            "certificates loaded",
            extra=kv(
                role=self.role,
                serial=creds.serial,
                not_after=creds.not_after.isoformat(),
                subject=creds.subject,
            ),
        )
        return creds

    async def run(self) -> None:
        """Look at the files every :attr:`interval` until cancelled (at the ticks of
        :func:`ravenproxy.ticks.look_every`: from a timer callback, no task step a look)."""
        await look_every(self.interval, self._look)

    def _look(self) -> bool:
        self.poll()
        return False  # never done: looks go on until cancelled

    def poll(self) -> Verdict | None:
        """One look; None when the files' stat did not change (and no look is pending)."""
        assert self._tracker is not None, "load() runs first"
        looks = _stat(self._paths)
        if looks == self._seen and self._verdict is not Verdict.WAIT:
            return None
        self._seen = looks
        creds: Credentials | None = None
        contexts: T | None = None
        error: PKIError | None = None
        try:
            sources = read_sources(self.files)
        except PKIError as exc:
            digest, error = content_digest(str(exc).encode()), exc
        else:
            digest = content_digest(*(s.data for s in sources))
            if digest != self._tracker.applied:
                try:
                    creds = load_credentials(*sources, now=self._clock())
                    contexts = self._build(creds)
                except PKIError as exc:
                    creds, error = None, exc
        verdict = self._verdict = self._tracker.observe(digest, creds is not None)
        if verdict is Verdict.TAKE:
            assert creds is not None and contexts is not None
            self._take(creds, contexts)
        elif verdict is Verdict.WARN:
            assert error is not None
            log.warning(
                "new certificate files ignored, the current ones stay in use",
                extra=kv(role=self.role, **_error_fields(error), serial=self.current.serial),
            )
        elif verdict is Verdict.WAIT:
            log.debug(
                "credential files inconsistent, looking again",
                extra=kv(role=self.role, **_error_fields(error)),
            )
        return verdict

    def _take(self, creds: Credentials, contexts: T) -> None:
        old = self.current
        self._creds, self._contexts = creds, contexts
        self.reloads += 1
        log.info(
            "certificates reloaded",
            extra=kv(
                role=self.role,
                serial=creds.serial,
                not_after=creds.not_after.isoformat(),
                subject=creds.subject,
                old_serial=old.serial,
                ca_changed=old.ca_certs != creds.ca_certs,
            ),
        )
        if self._on_change is not None:
            try:
                self._on_change(old, creds)
            except Exception:  # a failing observer must not stop the reloads
                log.exception("certificate reload observer failed")


def _error_fields(error: PKIError | None) -> dict[str, object]:
    if isinstance(error, CredentialsError):
        return {"file": error.path, "reason": error.reason}
    return {"reason": str(error) if error is not None else "-"}
