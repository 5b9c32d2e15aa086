"""Shape a ``certs init`` directory for the status and renew tests: certificates that expire
soon, have expired, or come from another CA, made with the real issuing code."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ravenproxy.pki import (
    generate_ca,
    issue_client_cert,
    issue_server_cert,
    load_cert,
    load_key,
    write_pem_cert,
    write_pem_key,
)
from ravenproxy.pki.status import role_of, sans_of


def days(n: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) + dt.timedelta(days=n)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def serial(path: Path) -> int:
    return load_cert(path).serial_number


def write_pair(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> None:
    write_pem_key(directory / f"{stem}.key", key)
    write_pem_cert(directory / f"{stem}.crt", cert)


def reissue(
    directory: Path,
    stem: str,
    *,
    not_after: dt.datetime,
    not_before: dt.datetime | None = None,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
) -> x509.Certificate:
    """Replace ``stem.crt/key`` by a certificate of the same kind (server: same SANs; agent:
    same node) ending at ``not_after``, signed by ``ca`` (default: the directory's CA)."""
    ca_cert, ca_key = ca or (load_cert(directory / "ca.crt"), load_key(directory / "ca.key"))
    old = load_cert(directory / f"{stem}.crt")
    if not_before is None:
        not_before = min(not_after - dt.timedelta(days=1), dt.datetime.now(dt.UTC))
    cn = str(old.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)
    if role_of(old) == "server":
        cert, key = issue_server_cert(
            ca_cert, ca_key, sans_of(old), common_name=cn,
            not_before=not_before, not_after=not_after,
        )  # fmt: skip
    else:
        cert, key = issue_client_cert(
            ca_cert, ca_key, cn, not_before=not_before, not_after=not_after
        )
    write_pair(directory, stem, cert, key)
    return cert


def short_ca(
    directory: Path, ends: dt.datetime
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A CA ending at ``ends`` in ``directory`` with a server and an ``edge-1`` pair that end
    with it (``certs init`` would issue them for a year)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = generate_ca(not_after=ends)
    write_pair(directory, "ca", ca_cert, ca_key)
    cert, key = issue_server_cert(ca_cert, ca_key, ["localhost", "127.0.0.1"], not_after=ends)
    write_pair(directory, "server", cert, key)
    cert, key = issue_client_cert(ca_cert, ca_key, "edge-1", not_after=ends)
    write_pair(directory, "edge-1", cert, key)
    return ca_cert, ca_key
