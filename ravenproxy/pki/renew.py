"""``ravenproxy certs renew``: re-issue, from the CA in the directory, what expires soon.

:func:`plan_renewal` reads the directory and decides, as data, what to do; nothing is written
until everything has been read and checked. :func:`apply_renewal` then writes it.

Decisions, and why:

- **A new key for every renewed certificate.** kubelet and cert-manager rotate the key with the
  certificate by default; a renewal that kept the key would extend the life of every copy of it
  that ever leaked. It also keeps a single issuing path: ``issue_*`` always make a new key.
- **Same subject, SANs and usages.** A server certificate is re-issued with its CN and SANs, an
  agent certificate for the node it names (``issue_server_cert`` / ``issue_client_cert``, as
  ``certs init`` does); a leaf whose subject is more than one CN, or that is neither, is left
  alone with a warning rather than re-issued as something else.
- **Only leaves a CA in ``ca.crt`` issued.** A certificate from another CA is not ours to
  replace (and replacing it would change whom it is trusted by).
- **Key first, then the certificate, each written atomically** (temp file, fsync, rename): a
  process watching the files sees the old pair, the new pair, or — between the two renames —
  a new key next to the old certificate, which it must take as "not consistent yet".
- **A CA that expires within DAYS is extended, not replaced:** re-signed by its own key with
  the same subject and key identifier (``authority.extend_ca``) for another ten years. Every
  certificate it ever issued still verifies against it, and what it issues now verifies
  against the old ``ca.crt`` too while that is valid — but copies of ``ca.crt`` elsewhere must
  be replaced before the old one expires. With a bundle in ``ca.crt`` (a CA rotation), the
  signing CA is the one whose key is ``ca.key``; only it is extended, the others are kept.
- **Leaves never outlive the CA:** a new leaf ends at ``now + days`` or at the CA's end,
  whichever is first (and the report says it was capped).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from ravenproxy.errors import PKIError
from ravenproxy.log import kv
from ravenproxy.pki.authority import (
    cert_node_name,
    extend_ca,
    is_issued_by,
    issue_client_cert,
    issue_server_cert,
    key_matches,
)
from ravenproxy.pki.init import CA_CERT, CA_KEY
from ravenproxy.pki.pemfiles import write_pem_cert, write_pem_certs, write_pem_key
from ravenproxy.pki.status import (
    DAY,
    CertFile,
    common_names,
    iso_utc,
    role_of,
    sans_of,
    scan,
    serial_hex,
)

log = logging.getLogger(__name__)

WITHIN_DAYS = 30
LEAF_DAYS = 365


@dataclass(frozen=True)
class LeafRenewal:
    """One leaf to re-issue: where it lives and what it is."""

    cert_path: Path
    key_path: Path
    role: Literal["server", "agent"]
    common_name: str
    sans: tuple[str, ...]  # the server's; an agent's SAN is its node name
    old: x509.Certificate


@dataclass(frozen=True)
class Kept:
    path: Path
    reason: str


@dataclass(frozen=True)
class RenewPlan:
    directory: Path
    ca_file: CertFile  # ca.crt (maybe a bundle) and ca.key
    ca_index: int  # which certificate of ca.crt ca.key belongs to: the signer
    extend_ca: bool
    renew: tuple[LeafRenewal, ...]
    kept: tuple[Kept, ...]
    warnings: tuple[str, ...]
    days: float
    now: dt.datetime

    @property
    def ca_cert(self) -> x509.Certificate:
        return self.ca_file.certs[self.ca_index]

    @property
    def ca_key(self) -> ec.EllipticCurvePrivateKey:
        assert self.ca_file.key is not None  # checked by plan_renewal
        return self.ca_file.key


@dataclass(frozen=True)
class Renewed:
    cert_path: Path
    old_serial: int
    new_serial: int
    not_after: dt.datetime
    capped: bool  # ended at the CA's end instead of now + days


@dataclass(frozen=True)
class RenewReport:
    directory: Path
    ca_extended: tuple[dt.datetime, dt.datetime] | None  # (old end, new end)
    renewed: tuple[Renewed, ...]
    kept: tuple[Kept, ...]
    warnings: tuple[str, ...] = field(default=())


# --------------------------------------------------------------------------------------------
# planning


def plan_renewal(
    directory: Path,
    *,
    within_days: float = WITHIN_DAYS,
    days: float = LEAF_DAYS,
    force: bool = False,
    now: dt.datetime | None = None,
) -> RenewPlan:
    """What ``certs renew`` would do in ``directory``; reads, never writes."""
    if within_days < 0:
        raise PKIError(f"--within must be 0 or more days, not {within_days:g}")
    if days <= 0:
        raise PKIError(f"--days must be more than 0, not {days:g}")
    directory = Path(directory)
    now = now or dt.datetime.now(dt.UTC)
    files = scan(directory)
    ca_file = next((f for f in files if f.path.name == CA_CERT), None)
    if ca_file is None:
        raise PKIError(
            f"{directory / CA_CERT}: No such file; renew signs with the CA of the directory"
        )
    if ca_file.key is None:
        raise PKIError(
            f"{directory / CA_KEY}: No such file; renew signs with the CA's key (the "
            "certificates of a --cert-dir are renewed by the agent or server that requested them)"
        )
    signer = next((i for i, c in enumerate(ca_file.certs) if key_matches(c, ca_file.key)), None)
    if signer is None or role_of(ca_file.certs[signer]) != "ca":
        raise PKIError(
            f"{ca_file.key_path} does not belong to any CA certificate in {ca_file.path}"
        )
    ca = ca_file.certs[signer]
    cas = tuple(c for c in ca_file.certs if role_of(c) == "ca")
    window = within_days * DAY.total_seconds()
    extend = (ca.not_valid_after_utc - now).total_seconds() <= window

    renew: list[LeafRenewal] = []
    kept: list[Kept] = []
    warnings: list[str] = []
    for f in files:
        if f is ca_file:
            continue
        leaf = f.certs[0]  # a chain file's first certificate is the leaf
        name = f.path.name
        role = role_of(leaf)
        left = (leaf.not_valid_after_utc - now).total_seconds()
        until = f"valid until {iso_utc(leaf.not_valid_after_utc)}"
        if role not in ("server", "agent"):
            reason = f"{role} certificate, not a server or agent leaf; left alone"
            warnings.append(f"{name}: {reason}")
            kept.append(Kept(f.path, reason))
            continue
        if not any(is_issued_by(leaf, c) for c in cas):
            reason = f"not issued by a CA in {CA_CERT}; left alone"
            warnings.append(f"{name}: {reason}")
            kept.append(Kept(f.path, reason))
            continue
        cns = common_names(leaf)
        if len(cns) != 1 or len(leaf.subject) != 1:
            reason = f"subject {leaf.subject.rfc4514_string()!r} is not a single CN; left alone"
            warnings.append(f"{name}: {reason}")
            kept.append(Kept(f.path, reason))
            continue
        if not force and left > window:
            kept.append(Kept(f.path, f"{until} ({int(left // DAY.total_seconds())} days left)"))
            continue
        if role == "agent":
            node = cert_node_name(leaf, str(f.path))  # refuses an ambiguous agent certificate
            renew.append(LeafRenewal(f.path, f.key_path, "agent", node, (node,), leaf))
        else:
            renew.append(LeafRenewal(f.path, f.key_path, "server", cns[0], sans_of(leaf), leaf))
    return RenewPlan(
        directory=directory,
        ca_file=ca_file,
        ca_index=signer,
        extend_ca=extend,
        renew=tuple(renew),
        kept=tuple(kept),
        warnings=tuple(warnings),
        days=days,
        now=now,
    )


# --------------------------------------------------------------------------------------------
# applying


def apply_renewal(plan: RenewPlan) -> RenewReport:
    """Write what ``plan`` decided: the extended CA first, then each leaf, key before cert."""
    ca, ca_key = plan.ca_cert, plan.ca_key
    extended: tuple[dt.datetime, dt.datetime] | None = None
    if plan.extend_ca:
        new_ca = extend_ca(ca, ca_key)
        bundle = list(plan.ca_file.certs)
        bundle[plan.ca_index] = new_ca
        write_pem_certs(plan.ca_file.path, bundle)
        extended = (ca.not_valid_after_utc, new_ca.not_valid_after_utc)
        log.info(
            "pki: CA extended",
            extra=kv(cert=str(plan.ca_file.path), not_after=iso_utc(new_ca.not_valid_after_utc)),
        )
        ca = new_ca
    wanted_end = plan.now + dt.timedelta(days=plan.days)
    end = min(wanted_end, ca.not_valid_after_utc)
    renewed: list[Renewed] = []
    for leaf in plan.renew:
        if leaf.role == "server":
            cert, key = issue_server_cert(
                ca, ca_key, leaf.sans, common_name=leaf.common_name, not_after=end
            )
        else:
            cert, key = issue_client_cert(ca, ca_key, leaf.common_name, not_after=end)
        write_pem_key(leaf.key_path, key)
        write_pem_cert(leaf.cert_path, cert)
        log.info(
            "pki: renewed",
            extra=kv(cert=str(leaf.cert_path), serial=serial_hex(cert.serial_number),
                     not_after=iso_utc(cert.not_valid_after_utc)),
        )  # fmt: skip
        renewed.append(
            Renewed(
                leaf.cert_path,
                leaf.old.serial_number,
                cert.serial_number,
                cert.not_valid_after_utc,
                capped=end < wanted_end,
            )
        )
    return RenewReport(plan.directory, extended, tuple(renewed), plan.kept, plan.warnings)


def renew(
    directory: Path,
    *,
    within_days: float = WITHIN_DAYS,
    days: float = LEAF_DAYS,
    force: bool = False,
    now: dt.datetime | None = None,
) -> RenewReport:
    """``certs renew``: plan, then apply."""
    plan = plan_renewal(directory, within_days=within_days, days=days, force=force, now=now)
    return apply_renewal(plan)
