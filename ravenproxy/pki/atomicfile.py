"""PEM files written atomically with their mode from the first byte (a key 0600, a certificate
0644 less the umask): temp file, fsync, rename. Bytes in, bytes out — no ``cryptography``, so a
process that only keeps files it was given (the certificate requester between rotations) writes
them without loading it (issue 15); :mod:`ravenproxy.pki.pemfiles` encodes keys and
certificates on top of this."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from ravenproxy.errors import PKIError

KEY_MODE = 0o600
CERT_MODE = 0o644


def atomic_write(path: Path, data: bytes, mode: int, *, overwrite: bool) -> None:
    """Write via a temp file in the same directory, created with ``mode`` from the first byte.

    The temp file is opened with its final mode (and O_EXCL/O_NOFOLLOW), so a key is never
    readable by others, not even between create and chmod. ``overwrite=False`` publishes with
    link(2), which fails instead of replacing a file someone else created meanwhile.
    """
    directory = path.parent
    tmp = directory / f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(tmp, flags, mode)
    except OSError as exc:
        raise PKIError(f"{path}: cannot create: {exc.strerror or exc}") from exc
    try:
        try:
            # umask may have narrowed a certificate's mode; a key must be exactly 0600.
            if mode == KEY_MODE:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise PKIError(f"{path}: already exists, not overwriting") from exc
            os.unlink(tmp)
    except OSError as exc:
        raise PKIError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    # Durability of the rename; best effort, not every filesystem allows opening a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_pem_bytes(path: Path | str, pem: bytes) -> None:
    """Write PEM certificate(s) as given (a chain, a CA bundle), atomically (mode 0644 less the
    umask)."""
    atomic_write(Path(path), pem, CERT_MODE, overwrite=True)


def write_key_bytes(path: Path | str, pem: bytes) -> None:
    """Write a PEM private key as given, atomically, mode 0600 from creation on."""
    atomic_write(Path(path), pem, KEY_MODE, overwrite=True)
