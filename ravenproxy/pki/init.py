"""``ravenproxy certs init``: lay out the embedded PKI in one directory, idempotently.

Files: ``ca.crt ca.key server.crt server.key`` and ``NODE.crt NODE.key`` per agent node.
A re-run never overwrites a file: what exists is kept (and checked), what is missing is created,
and new agent certificates are signed by the CA already on disk. Everything is checked before
anything is written, so a refused run leaves the directory as it was.
"""

from __future__ import annotations

import datetime as dt
import logging
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ravenproxy.errors import PKIError
from ravenproxy.log import kv
from ravenproxy.pki.authority import (
    absent_sans,
    generate_ca,
    is_issued_by,
    issue_client_cert,
    issue_server_cert,
    key_matches,
    parse_san,
    validate_node_name,
)
from ravenproxy.pki.pemfiles import load_cert, load_key, write_pem_cert, write_pem_key

log = logging.getLogger(__name__)

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
SERVER_CERT = "server.crt"
SERVER_KEY = "server.key"
# An agent named like these would share files with the CA or the server.
RESERVED_NODE_NAMES = frozenset({"ca", "server"})
DIR_MODE = 0o700


@dataclass(frozen=True)
class InitReport:
    """What :func:`init_pki` did; ``warnings`` are for a human (the CLI prints them)."""

    directory: Path
    created: tuple[Path, ...]
    kept: tuple[Path, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class _Pair:
    cert: Path
    key: Path


def init_pki(
    directory: Path,
    server_sans: Sequence[str] = ("localhost", "127.0.0.1"),
    agents: Sequence[str] = (),
) -> InitReport:
    """Create what is missing of the CA, the server pair and one pair per agent node."""
    directory = Path(directory)
    if isinstance(server_sans, str) or isinstance(agents, str):
        raise PKIError("server_sans and agents must be sequences of strings, not one string")
    requested_sans = [parse_san(s) for s in server_sans]
    nodes = _validate_agents(agents)

    _ensure_directory(directory)
    created: list[Path] = []
    kept: list[Path] = []
    warnings: list[str] = []

    ca = _Pair(directory / CA_CERT, directory / CA_KEY)
    server = _Pair(directory / SERVER_CERT, directory / SERVER_KEY)
    agent_pairs = {n: _Pair(directory / f"{n}.crt", directory / f"{n}.key") for n in nodes}
    leaves = [server, *agent_pairs.values()]

    # Check everything first: a refused run must not leave half a PKI behind.
    ca_state = _pair_state(ca)
    leaf_states = {p: _pair_state(p) for p in leaves}
    if ca_state == "absent":
        orphans = [p.cert.name for p in leaves if leaf_states[p] != "absent"]
        if orphans:
            raise PKIError(
                f"{ca.cert} and {ca.key} are missing but {', '.join(orphans)} exist: a new CA "
                "would not have signed them; restore the CA or remove those files"
            )
        ca_cert, ca_key = generate_ca()
        new_ca = True
    else:
        ca_cert, ca_key = _load_pair(ca, "CA")
        new_ca = False
        warnings.extend(readable_by_others(ca.key))

    for pair in leaves:
        if leaf_states[pair] == "present":
            cert, _ = _load_pair(pair, "certificate")
            warnings.extend(_inspect_leaf(pair, cert, ca_cert))
            if pair == server:
                warnings.extend(_missing_sans(pair.cert, cert, requested_sans))
    for name, pair in agent_pairs.items():
        if leaf_states[pair] == "present":
            warnings.extend(_wrong_node(pair.cert, load_cert(pair.cert), name))

    # Now write. The key goes first so that a cert on disk always has its key next to it.
    if new_ca:
        _write_pair(ca, ca_cert, ca_key, created)
    else:
        kept.extend([ca.cert, ca.key])
    for pair in leaves:
        if leaf_states[pair] == "present":
            kept.extend([pair.cert, pair.key])
            continue
        if pair == server:
            cert, key = issue_server_cert(ca_cert, ca_key, server_sans)
        else:
            node = pair.cert.name.removesuffix(".crt")
            cert, key = issue_client_cert(ca_cert, ca_key, node)
        _write_pair(pair, cert, key, created)

    for w in warnings:
        log.warning("pki: %s", w)
    return InitReport(
        directory=directory, created=tuple(created), kept=tuple(kept), warnings=tuple(warnings)
    )


def _validate_agents(agents: Sequence[str]) -> list[str]:
    nodes: list[str] = []
    for name in agents:
        validate_node_name(name)
        if name in RESERVED_NODE_NAMES:
            raise PKIError(
                f"invalid node name {name!r}: its files would clash with {name}.crt/{name}.key"
            )
        if name not in nodes:
            nodes.append(name)
    return nodes


def _ensure_directory(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise PKIError(f"pki directory {directory}: exists and is not a directory")
    try:
        # mode applies to the last component only; parents get the usual umask-derived mode.
        directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise PKIError(f"pki directory {directory}: cannot create: {exc.strerror or exc}") from exc


def _pair_state(pair: _Pair) -> str:
    has_cert, has_key = pair.cert.exists(), pair.key.exists()
    if has_cert and has_key:
        return "present"
    if not has_cert and not has_key:
        return "absent"
    there, missing = (pair.cert, pair.key) if has_cert else (pair.key, pair.cert)
    raise PKIError(
        f"{there} exists but {missing} does not; not overwriting {there} — "
        f"restore {missing.name} or remove {there.name} and re-run"
    )


def _load_pair(pair: _Pair, role: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = load_cert(pair.cert, f"{role} certificate")
    key = load_key(pair.key, f"{role} key")
    if not key_matches(cert, key):
        raise PKIError(f"{pair.key} does not belong to {pair.cert}")
    return cert, key


def _inspect_leaf(pair: _Pair, cert: x509.Certificate, ca_cert: x509.Certificate) -> list[str]:
    warnings: list[str] = []
    if not is_issued_by(cert, ca_cert):
        warnings.append(f"{pair.cert} was not issued by the CA in {pair.cert.parent / CA_CERT}")
    if cert.not_valid_after_utc <= dt.datetime.now(dt.UTC):
        warnings.append(
            f"{pair.cert} expired on {cert.not_valid_after_utc.isoformat()}; "
            "remove it and its key and re-run to issue a new one"
        )
    warnings.extend(readable_by_others(pair.key))
    return warnings


def readable_by_others(key: Path) -> list[str]:
    """A warning for a key file that group or others may read (``certs init|status``)."""
    mode = stat.S_IMODE(key.stat().st_mode)
    if mode & 0o077:
        return [f"{key} is readable by others (mode {mode:04o}); chmod 600 it"]
    return []


def _missing_sans(
    path: Path, cert: x509.Certificate, requested: list[x509.GeneralName]
) -> list[str]:
    missing = absent_sans(cert, requested)
    if not missing:
        return []
    return [
        f"{path} kept, but it lacks the requested SAN(s) {', '.join(missing)}; "
        f"remove {path.name} and {path.with_suffix('.key').name} and re-run to reissue it"
    ]


def _wrong_node(path: Path, cert: x509.Certificate, node: str) -> list[str]:
    cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if cns == [node]:
        return []
    return [f"{path} kept, but its CN is {cns!r}, not the node name {node!r}"]


def _write_pair(
    pair: _Pair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, created: list[Path]
) -> None:
    write_pem_key(pair.key, key, overwrite=False)
    created.append(pair.key)
    write_pem_cert(pair.cert, cert, overwrite=False)
    created.append(pair.cert)
    log.info("pki: created", extra=kv(cert=str(pair.cert), key=str(pair.key)))
