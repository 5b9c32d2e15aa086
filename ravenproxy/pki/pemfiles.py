"""PEM files of certificates and keys: encoded, written atomically with their mode from the
first byte (a key 0600, a certificate 0644 less the umask), read back with errors naming the
file's role and path."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ravenproxy.errors import PKIError
from ravenproxy.log import kv
from ravenproxy.pki.atomicfile import CERT_MODE, KEY_MODE, atomic_write
from ravenproxy.pki.x509info import read_file

log = logging.getLogger(__name__)


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # Unencrypted PKCS#8: the processes read it unattended; the file mode is the protection.
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def write_pem_cert(path: Path | str, cert: x509.Certificate, *, overwrite: bool = True) -> None:
    """Write ``cert`` as PEM, atomically (mode 0644 less the umask)."""
    atomic_write(Path(path), cert_pem(cert), CERT_MODE, overwrite=overwrite)


def write_pem_certs(path: Path | str, certs: Sequence[x509.Certificate]) -> None:
    """Write a bundle of certificates as PEM, in order, atomically (mode 0644 less the umask)."""
    if not certs:
        raise PKIError(f"{path}: no certificate to write")
    atomic_write(Path(path), b"".join(cert_pem(c) for c in certs), CERT_MODE, overwrite=True)


def write_pem_key(
    path: Path | str, key: ec.EllipticCurvePrivateKey, *, overwrite: bool = True
) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, atomically, mode 0600 from creation on."""
    atomic_write(Path(path), key_pem(key), KEY_MODE, overwrite=overwrite)


def load_certs(path: Path | str, what: str = "certificate") -> list[x509.Certificate]:
    """Every certificate in a PEM file (a bundle or a chain), at least one."""
    p = Path(path)
    return parse_certs_pem(read_file(p, what), f"{what} {p}")


def load_cert(path: Path | str, what: str = "certificate") -> x509.Certificate:
    """The first certificate of a PEM file; ``what`` names the file's role in errors."""
    return load_certs(path, what)[0]


def load_key(path: Path | str, what: str = "key") -> ec.EllipticCurvePrivateKey:
    """An unencrypted ECDSA private key from a PEM file."""
    p = Path(path)
    key = parse_key_pem(read_file(p, what), f"{what} {p}")
    log.debug("loaded key", extra=kv(path=str(p)))
    return key


def parse_key_pem(data: bytes, what: str = "key") -> ec.EllipticCurvePrivateKey:
    """An unencrypted ECDSA private key from PEM bytes; ``what`` names their source."""
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:
        raise PKIError(f"{what}: key is encrypted; an unencrypted key is needed") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise PKIError(f"{what}: not a PEM private key ({exc})") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PKIError(f"{what}: not an ECDSA key ({type(key).__name__})")
    return key


def parse_certs_pem(data: bytes, what: str = "certificate") -> list[x509.Certificate]:
    """Every certificate in PEM bytes, at least one; ``what`` names their source."""
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise PKIError(f"{what}: not a PEM certificate ({exc})") from exc
    if not certs:
        raise PKIError(f"{what}: no certificate")
    return certs
