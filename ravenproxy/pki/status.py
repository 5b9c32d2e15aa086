"""``ravenproxy certs status``: what is in a certificate directory, and how long it lasts.

Two layouts are read the same way: the embedded one of ``certs init`` (``ca.crt``, ``ca.key``,
``server.crt``, ``server.key``, ``NODE.crt``, ``NODE.key``) and a ``--cert-dir`` (``ca.crt``,
``tls.crt``, ``tls.key``). Every ``*.crt`` file is a certificate (``ca.crt`` may be a bundle of
several CA certificates during a CA rotation); its key, if any, is the ``*.key`` of the same
stem. The role comes from the certificate itself, not from the file name: a CA (basic
constraints), a server (serverAuth) or an agent (clientAuth).

:func:`scan` reads the directory (a :class:`PKIError` naming the file for anything unreadable);
:func:`certificate_status` and :func:`status_report` turn what was read into a report at a given
time; :func:`render_text` and :func:`render_json` print it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ravenproxy.errors import PKIError
from ravenproxy.pki.authority import is_issued_by, key_matches
from ravenproxy.pki.init import CA_CERT, CA_KEY, readable_by_others
from ravenproxy.pki.pemfiles import load_certs, load_key

Role = Literal["ca", "server", "agent", "unknown"]
DAY = dt.timedelta(days=1)
WARN_DAYS = 30


@dataclass(frozen=True)
class CertFile:
    """One certificate file as read from disk: its certificates and its key, if it has one."""

    path: Path
    certs: tuple[x509.Certificate, ...]
    key_path: Path
    key: ec.EllipticCurvePrivateKey | None  # None: no key file next to it


@dataclass(frozen=True)
class CertStatus:
    """One certificate at one moment, as printed."""

    file: str  # the file name; ``ca.crt[2]`` for the second certificate of a bundle
    path: Path
    role: Role
    subject: str
    sans: tuple[str, ...]
    serial: str  # hex, as openssl prints it
    not_after: dt.datetime  # UTC
    seconds_left: float  # negative once expired
    warnings: tuple[str, ...]

    @property
    def days_left(self) -> int:
        """Whole days left; negative: whole days since expiry (-1 a day after it)."""
        return math.trunc(self.seconds_left / DAY.total_seconds())

    @property
    def expired(self) -> bool:
        return self.seconds_left <= 0

    def due(self, warn_days: float) -> bool:
        """Expired, or expires within ``warn_days``."""
        return self.seconds_left <= warn_days * DAY.total_seconds()


@dataclass(frozen=True)
class StatusReport:
    directory: Path
    warn_days: float
    certificates: tuple[CertStatus, ...]
    warnings: tuple[str, ...]  # about the directory as a whole (e.g. the CA key)

    @property
    def due(self) -> tuple[CertStatus, ...]:
        return tuple(c for c in self.certificates if c.due(self.warn_days))

    @property
    def exit_code(self) -> int:
        """0 when every certificate lasts longer than ``warn_days``, else 1."""
        return 1 if self.due else 0


# --------------------------------------------------------------------------------------------
# reading


def scan(directory: Path) -> list[CertFile]:
    """Every ``*.crt`` of ``directory`` (``ca.crt`` first) with its ``*.key``, if present."""
    directory = Path(directory)
    if not directory.exists():
        raise PKIError(f"certificate directory {directory}: No such directory")
    if not directory.is_dir():
        raise PKIError(f"certificate directory {directory}: not a directory")
    try:
        # Hidden files are the temp files of an atomic write in progress (atomicfile.atomic_write).
        paths = [p for p in directory.glob("*.crt") if not p.name.startswith(".")]
    except OSError as exc:
        raise PKIError(f"certificate directory {directory}: cannot read: {exc}") from exc
    if not paths:
        raise PKIError(f"certificate directory {directory}: no certificate (*.crt) in it")
    paths.sort(key=lambda p: (p.name != CA_CERT, p.name))
    found: list[CertFile] = []
    for path in paths:
        certs = tuple(load_certs(path))
        key_path = path.with_suffix(".key")
        key = load_key(key_path) if key_path.exists() else None
        found.append(CertFile(path, certs, key_path, key))
    return found


def role_of(cert: x509.Certificate) -> Role:
    """A CA by its basic constraints, else a server or an agent by its extended key usage."""
    try:
        if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            return "ca"
    except x509.ExtensionNotFound:
        pass
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "unknown"
    if ExtendedKeyUsageOID.SERVER_AUTH in eku:
        return "server"
    if ExtendedKeyUsageOID.CLIENT_AUTH in eku:
        return "agent"
    return "unknown"


def sans_of(cert: x509.Certificate) -> tuple[str, ...]:
    """DNS names and IP addresses, in certificate order, as ``issue_server_cert`` takes them."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    out: list[str] = []
    for name in san:
        if isinstance(name, x509.DNSName | x509.IPAddress):
            out.append(str(name.value))
    return tuple(out)


def common_names(cert: x509.Certificate) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]


def ca_certs(files: list[CertFile]) -> tuple[x509.Certificate, ...]:
    """The CA certificates of the directory's ``ca.crt`` (none in a directory without one)."""
    for f in files:
        if f.path.name == CA_CERT:
            return tuple(c for c in f.certs if role_of(c) == "ca")
    return ()


# --------------------------------------------------------------------------------------------
# judging


def certificate_status(
    f: CertFile,
    index: int,
    cas: tuple[x509.Certificate, ...],
    now: dt.datetime,
) -> CertStatus:
    """The status of certificate ``index`` of file ``f``."""
    cert = f.certs[index]
    role = role_of(cert)
    name = f.path.name if len(f.certs) == 1 else f"{f.path.name}[{index + 1}]"
    warnings: list[str] = []
    left = (cert.not_valid_after_utc - now).total_seconds()
    if left <= 0:
        warnings.append(f"{name} expired on {iso_utc(cert.not_valid_after_utc)}")
    if cert.not_valid_before_utc > now:
        warnings.append(f"{name} is not valid before {iso_utc(cert.not_valid_before_utc)}")
    if role != "ca":
        warnings.extend(_leaf_warnings(f, name, cert, cas))
    return CertStatus(
        file=name,
        path=f.path,
        role=role,
        subject=cert.subject.rfc4514_string(),
        sans=sans_of(cert),
        serial=serial_hex(cert.serial_number),
        not_after=cert.not_valid_after_utc,
        seconds_left=left,
        warnings=tuple(warnings),
    )


def _leaf_warnings(
    f: CertFile, name: str, cert: x509.Certificate, cas: tuple[x509.Certificate, ...]
) -> list[str]:
    warnings: list[str] = []
    if f.key is None:
        warnings.append(f"{name} has no key file {f.key_path.name}")
    else:
        if not key_matches(cert, f.key):
            # certs renew writes the key first: for an instant the new key sits next to the old
            # certificate. Seen again on a second look, it is a broken pair.
            warnings.append(f"{f.key_path.name} does not belong to {name}")
        warnings.extend(readable_by_others(f.key_path))
    if cas and not any(is_issued_by(cert, ca) for ca in cas):
        warnings.append(f"{name} was not issued by a CA in {CA_CERT}")
    return warnings


def status_report(
    directory: Path,
    files: list[CertFile],
    *,
    warn_days: float = WARN_DAYS,
    now: dt.datetime | None = None,
) -> StatusReport:
    """The report over everything :func:`scan` read, at ``now`` (default: the current time)."""
    now = now or dt.datetime.now(dt.UTC)
    cas = ca_certs(files)
    statuses = [certificate_status(f, i, cas, now) for f in files for i in range(len(f.certs))]
    warnings: list[str] = []
    for f in files:
        if f.path.name == CA_CERT and f.key is not None:
            if not any(key_matches(c, f.key) for c in cas):
                warnings.append(f"{CA_KEY} does not belong to any CA certificate in {CA_CERT}")
            warnings.extend(readable_by_others(f.key_path))
    return StatusReport(Path(directory), warn_days, tuple(statuses), tuple(warnings))


def status(
    directory: Path, *, warn_days: float = WARN_DAYS, now: dt.datetime | None = None
) -> StatusReport:
    """``certs status``: scan ``directory`` and judge it."""
    return status_report(directory, scan(directory), warn_days=warn_days, now=now)


# --------------------------------------------------------------------------------------------
# printing


def serial_hex(serial: int) -> str:
    """Lower-case hex in whole bytes, as ``openssl x509 -serial`` prints it (but lower case)."""
    text = f"{serial:x}"
    return text if len(text) % 2 == 0 else f"0{text}"


def iso_utc(when: dt.datetime) -> str:
    """``2026-01-31T12:00:00Z``: ISO 8601 in UTC, as printed everywhere by ``certs``."""
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _left(c: CertStatus) -> str:
    if c.expired:
        return "EXPIRED"
    return f"{c.days_left} day{'' if c.days_left == 1 else 's'} left"


def render_text(report: StatusReport) -> str:
    """One block per certificate, then one summary line; warnings go to stderr (the CLI)."""
    lines: list[str] = []
    for c in report.certificates:
        mark = "  <- due" if c.due(report.warn_days) and not c.expired else ""
        lines.append(f"{c.file}: {c.role}{mark}")
        lines.append(f"  subject    {c.subject}")
        lines.append(f"  SANs       {', '.join(c.sans) if c.sans else '-'}")
        lines.append(f"  serial     {c.serial}")
        lines.append(f"  not after  {iso_utc(c.not_after)} ({_left(c)})")
    due = report.due
    days = f"{report.warn_days:g}"
    if due:
        names = ", ".join(c.file for c in due)
        lines.append(f"{len(due)} of {len(report.certificates)} expire within {days} days "
                     f"or have expired: {names}")  # fmt: skip
    else:
        lines.append(f"all {len(report.certificates)} certificates valid for more than {days} days")
    return "\n".join(lines) + "\n"


def warnings_of(report: StatusReport) -> list[str]:
    return [*report.warnings, *(w for c in report.certificates for w in c.warnings)]


def render_json(report: StatusReport) -> str:
    doc = {
        "directory": str(report.directory),
        "warn_days": report.warn_days,
        "certificates": [
            {
                "file": c.file,
                "path": str(c.path),
                "role": c.role,
                "subject": c.subject,
                "sans": list(c.sans),
                "serial": c.serial,
                "not_after": iso_utc(c.not_after),
                "days_left": c.days_left,
                "expired": c.expired,
                "due": c.due(report.warn_days),
                "warnings": list(c.warnings),
            }
            for c in report.certificates
        ],
        "warnings": list(report.warnings),
        "due": [c.file for c in report.due],
    }
    return json.dumps(doc, indent=2) + "\n"
